"""Resuming a driver log near its end when the server can only serve tails by line count.

Ray's state API (``/api/v0/logs/{file,stream}``) serves a job's driver log as raw bytes,
either whole (``lines=-1``) or as its last N lines, but never from a byte offset. So a
follower that lost its connection after B bytes asks for a tail that should reach back a
little before B and finds where it is in that tail: the last bytes it printed (the
*anchor*) must be the tail's first match, and everything before them in the tail must be
the end of what it printed. That is only certain when the anchor occurs once in the part
of the log kept for comparison, so a log that repeats itself (the same line over and over)
is replayed from its start instead: slower, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

ANCHOR_BYTES = 4096
# Below this, replaying the log from its start costs less than a second tail request would.
REPLAY_BELOW_BYTES = 64 * 1024
# How much of the printed log is kept to check a tail against; also the furthest a tail may
# reach back before the resume point.
KEPT_BYTES = 4 * 1024 * 1024
MIN_TAIL_LINES = 100


class Misaligned(Exception):
    """The tail did not contain the anchor where it must be: ask again with more lines, or replay."""


@dataclass(frozen=True)
class ResumePlan:
    """What to ask the server for: ``lines=-1`` replays from byte 0; otherwise find ``anchor`` in the tail."""

    lines: int
    anchor: bytes | None
    resume_at: int  # bytes of the log already printed

    @property
    def replay(self) -> bool:
        return self.anchor is None


def plan_resume(kept: bytes, printed: int, expected_new_lines: float, escalation: int = 0) -> ResumePlan:
    """How to pick up a log after ``printed`` bytes, of which ``kept`` are its last ones.

    ``expected_new_lines`` estimates the lines written since; each ``escalation`` asks for
    four times more, and past three the log is replayed from its start.
    """
    anchor = kept[-ANCHOR_BYTES:]
    if (printed < REPLAY_BELOW_BYTES or escalation > 3 or not anchor
            or kept.find(anchor) != len(kept) - len(anchor)):
        return ResumePlan(-1, None, printed)
    # Reach back past the anchor (and the line it starts in), plus what arrived since.
    back = kept[-2 * ANCHOR_BYTES:].count(b"\n") + 1
    lines = int((back + expected_new_lines * 1.25 + MIN_TAIL_LINES) * 4 ** escalation)
    return ResumePlan(lines, anchor, printed)


def locate(plan: ResumePlan, kept: bytes, received: bytes) -> int | None:
    """Where the log's byte ``plan.resume_at`` lies in ``received`` (the tail's start so far).

    Returns None while the anchor has not arrived yet; raises ``Misaligned`` when the tail
    cannot hold the resume point (it starts after it, or reaches back further than ``kept``).
    """
    assert plan.anchor is not None
    first_line_end = received.find(b"\n", 0, len(plan.anchor))
    if first_line_end >= 0 or len(received) >= len(plan.anchor):
        # Text never printed starts the tail: it begins after the resume point, and waiting
        # for the anchor would only download more of it.
        opening = received[:first_line_end + 1 if first_line_end >= 0 else len(plan.anchor)]
        if opening not in kept:
            raise Misaligned("the tail starts after the resume point")
    found = received.find(plan.anchor)
    if found < 0:
        if len(received) > len(kept) + len(plan.anchor):
            raise Misaligned("the tail reaches back further than the kept part of the log")
        return None
    end = found + len(plan.anchor)
    if end > len(kept) or received[:end] != kept[len(kept) - end:]:
        raise Misaligned("the tail does not start inside the printed part of the log")
    return end
