"""When a running job has been silent long enough to call it stalled, judged from its run record's uploads.

Standard library only: it runs in the job's wrapper on the cluster (``notify.py``).
"""

from __future__ import annotations

# With no stall_after_s in the spec, as the follower's own watch: three times the longest wait between two
# reports seen so far, and at least this.
MIN_STALL_S = 300.0


class StallWatch:
    """Says once when a running job's log and reports have been silent past its limit (again after it speaks).

    The limit is the spec's ``stall_after_s``, or else three times the longest wait between two reports
    seen so far and at least ``MIN_STALL_S``, as the follower's own watch.
    """

    def __init__(self, stall_after_s: float | None, now: float) -> None:
        self.stall_after_s = stall_after_s
        self.last_change = now
        self.last_report: float | None = None
        self.longest_report_gap = 0.0
        self.seen: tuple[int, int] = (0, 0)
        self.said = False

    def limit_s(self) -> float:
        """Seconds of silence that make a stall."""
        return self.stall_after_s or max(MIN_STALL_S, 3 * self.longest_report_gap)

    def silent_for(self, now: float, log_bytes: int, reports: int) -> float | None:
        """Take in what the job has written so far; the silence in seconds when it has just become a stall."""
        if reports > self.seen[1]:
            if self.last_report is not None:
                self.longest_report_gap = max(self.longest_report_gap, now - self.last_report)
            self.last_report = now
        if (log_bytes, reports) != self.seen:
            self.seen, self.last_change, self.said = (log_bytes, reports), now, False
            return None
        silent = now - self.last_change
        if self.said or silent < self.limit_s():
            return None
        self.said = True
        return silent
