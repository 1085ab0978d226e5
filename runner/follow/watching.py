"""What a followed job's log feeds, wired together: its progress display, the failure reader, the stall watch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from runner.follow.diagnosis import FailureReader
from runner.follow.display import LiveProgress, PlainProgress, wants_live_view
from runner.follow.log_view import LogView
from runner.follow.progress import RunProgress
from runner.follow.stacks import job_stacks

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

# A silence shorter than this is never called a stall: start-up, a first epoch and an evaluation
# can each be that quiet. Past the pace of the run's own reports, three times its slowest gap.
STALL_FLOOR_S = 300.0
STALL_PACE_FACTOR = 3.0


class Watch:
    """The log view a follower writes to, and what it feeds.

    Args:
        client: the cluster client (for the stacks of a stalled job).
        job_id: the job followed.
        logs_out, notes: where the job's lines and rayjobs' own lines go.
        raw: the log as written (no hiding, no events taken out).
        live: a live status block (None: when both streams are terminals); only with ``stream_logs``.
        stall_after_s: a RUNNING job silent this long is a stall; None: from its own pace.
    """

    def __init__(self, client: JobsApi, job_id: str, logs_out: TextIO, notes: TextIO, *, raw: bool,
                 live: bool | None, stream_logs: bool, stall_after_s: float | None) -> None:
        self.client = client
        self.job_id = job_id
        self.stall_after_s = stall_after_s
        self.progress = RunProgress()
        self.failure = FailureReader()
        live = (live if live is not None else wants_live_view(logs_out, notes)) and stream_logs
        self.display: LiveProgress | PlainProgress
        if live:
            self.display = LiveProgress(self.progress, job_id, stream=logs_out)
            logs_out, notes = self.display.out, self.display.notes
        else:
            self.display = PlainProgress(self.progress, notes)
        self.logs_out, self.notes = logs_out, notes
        terminal = bool(getattr(logs_out, "isatty", lambda: False)())
        self.view = LogView(logs_out, self.display.event, raw=raw, strip_ansi=not live and not terminal,
                            on_line=self.failure.line)

    def stall_after(self) -> float:
        """How long a RUNNING job may be silent before it is called stalled."""
        if self.stall_after_s is not None:
            return self.stall_after_s
        return max(STALL_FLOOR_S, STALL_PACE_FACTOR * (self.progress.slowest_report_s or 0.0))

    def on_stall(self, silent_s: float, info: dict[str, Any]) -> None:
        """Say once that the job stalled, with the stacks of its driver and training workers; it keeps running."""
        self._say(f"rayjobs: warning: job {self.job_id} is RUNNING but has printed nothing and reported no "
                  f"progress for {silent_s:.0f}s (stall_after_s {self.stall_after():g}); it is left running. "
                  f"Where its processes are (also `rayjobs stack {self.job_id}`):")
        rendered = [stack.render() for stack in job_stacks(self.client, info, self.progress)]
        for text in rendered:
            for line in text.splitlines():
                self._say(f"  | {line}")
        self._keep_in_record(info, "\n".join(rendered))

    def _keep_in_record(self, info: dict[str, Any], text: str) -> None:
        """The stacks go into the job's run record too, where they outlive this terminal."""
        from runner.errors import RayJobsError
        from runner.runs.store import save_stacks

        try:
            where = save_stacks(info, text, cluster_is_local=self.client.connection.local_cluster is not None)
        except (RayJobsError, OSError) as exc:
            self._say(f"rayjobs: the stacks could not be kept in the run record: {exc}")
            return
        if where is not None:
            self._say(f"rayjobs: stacks kept in the run record: {where}")

    def close(self) -> None:
        """The log is over: show what the view held back, and take the live block down."""
        self.view.close()
        self.display.close()

    def _say(self, line: str) -> None:
        self.notes.write(line + "\n")
        self.notes.flush()
