"""Resuming a driver log near its end when the server can only serve tails by line count.

Ray's state API (``/api/v0/logs/{file,stream}``) serves a job's driver log as raw bytes,
either whole (``lines=-1``) or as its last N lines, but never from a byte offset. So a
follower that lost its connection after B bytes asks for a tail that should reach back a
little before B and finds where it is in that tail: the last bytes it printed (the
*anchor*) must be the tail's first match, and the bytes before them in the tail must be
the end of what it printed. That is only certain when the anchor occurs once in the part
of the log kept for comparison, so a log that repeats itself (the same line over and over)
is replayed from its start instead: slower, never wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

ANCHOR_BYTES = 4096
# Below this, replaying the log from its start costs less than a second tail request would.
REPLAY_BELOW_BYTES = 64 * 1024
# How much of the printed log is kept to check a tail against.
KEPT_BYTES = 4 * 1024 * 1024
MIN_TAIL_LINES = 100
MAX_ESCALATIONS = 3
# A tail arrives at once; this long without its resume point means it has none.
ALIGN_IDLE_S = 5.0


@dataclass(frozen=True)
class LogChunk:
    """Bytes of a job's log and where they start in it (a byte offset), so a repeat can be told apart."""

    data: bytes
    offset: int

    @property
    def end(self) -> int:
        """The offset just past the last byte."""
        return self.offset + len(self.data)


class Misaligned(Exception):
    """The tail does not hold the resume point (it starts after it): ask again with more lines, or replay."""


@dataclass(frozen=True)
class ResumePlan:
    """What to ask the server for: ``lines=-1`` replays from byte 0; otherwise find ``anchor`` in the tail."""

    lines: int
    anchor: bytes | None
    resume_at: int  # bytes of the log already printed
    give_up_bytes: int = 0  # a tail this long without the anchor started after the resume point
    kept: bytes = field(default=b"", repr=False)  # the last bytes printed, to check the tail against

    @property
    def replay(self) -> bool:
        """True when the log is asked for from its start (no anchor to find)."""
        return self.anchor is None


def plan_resume(kept: bytes, printed: int, expected_new_lines: float, escalation: int = 0) -> ResumePlan:
    """How to pick up a log after ``printed`` bytes, of which ``kept`` are its last ones.

    Args:
        kept: the last bytes printed (up to ``KEPT_BYTES``).
        printed: how many bytes of the log were printed.
        expected_new_lines: an estimate of the lines written since.
        escalation: tails in a row that missed; each asks for four times more lines, and past
            ``MAX_ESCALATIONS`` the log is replayed from its start.

    Returns:
        The plan: a replay (``lines=-1``) or a tail of ``lines`` lines to find the anchor in.
    """
    anchor = kept[-ANCHOR_BYTES:]
    if (printed < REPLAY_BELOW_BYTES or escalation > MAX_ESCALATIONS or not anchor
            or kept.find(anchor) != len(kept) - len(anchor)):
        return ResumePlan(-1, None, printed)
    # Reach back past the anchor (and the line it starts in), plus what arrived since.
    back = kept[-2 * ANCHOR_BYTES:].count(b"\n") + 1
    lines = int((back + expected_new_lines * 1.25 + MIN_TAIL_LINES) * 4 ** escalation)
    bytes_per_line = len(kept) / max(1, kept.count(b"\n"))
    return ResumePlan(lines, anchor, printed, int(2 * lines * bytes_per_line) + len(kept) + ANCHOR_BYTES, kept)


class TailAligner:
    """Finds the resume point in a tail as its bytes arrive, holding no more than about ``plan.kept`` of them."""

    def __init__(self, plan: ResumePlan) -> None:
        assert plan.anchor is not None
        self.plan = plan
        self.kept = plan.kept
        self.anchor = plan.anchor
        self.buffer = bytearray()
        self.dropped = 0  # bytes of the tail no longer held: they lie before any possible resume point
        self._searched = 0

    def add(self, chunk: bytes) -> int | None:
        """Take the tail's next bytes.

        Returns:
            The resume point's index in ``buffer`` once it is among the bytes taken, else None.

        Raises:
            Misaligned: the anchor matched text that was never printed, or the tail grew too long without it.
        """
        self.buffer += chunk
        found = self.buffer.find(self.anchor, max(0, self._searched - len(self.anchor) + 1))
        self._searched = len(self.buffer)
        if found >= 0:
            end = found + len(self.anchor)
            checked = min(self.dropped + end, len(self.kept))
            # First match, and all the kept log before it: a match inside new text (the tail
            # started after the resume point and the text recurs) fails here.
            if self.buffer[end - checked:end] != self.kept[len(self.kept) - checked:]:
                raise Misaligned("the anchor matched, but not what was printed before it")
            return end
        if self.dropped + len(self.buffer) > self.plan.give_up_bytes:
            raise Misaligned("the tail starts after the resume point")
        excess = len(self.buffer) - len(self.kept) - len(self.anchor)
        if excess > 0:
            del self.buffer[:excess]
            self.dropped += excess
            self._searched -= excess
        return None


async def resumed_chunks(body: Any, plan: ResumePlan) -> AsyncIterator[LogChunk]:
    """The chunks of a response ``body`` (aiohttp's ``StreamReader``) placed at their log offsets.

    A body for a replay starts at the log's byte 0. Otherwise it is a tail that must hold
    ``plan``'s resume point: the first chunk yielded starts there (it may be empty).

    Args:
        body: has an async ``readany()`` that returns b"" at the end.
        plan: what was asked for (see :func:`plan_resume`).

    Yields:
        LogChunk, in order.

    Raises:
        Misaligned: the tail ended, or grew too long, without the resume point.
        asyncio.TimeoutError: nothing at all arrived for ``ALIGN_IDLE_S`` (a network fault, not a short tail).
    """
    offset = 0
    if not plan.replay:
        aligner = TailAligner(plan)
        while True:
            chunk = await _read_within(body, ALIGN_IDLE_S)
            if chunk is None and not aligner.buffer and not aligner.dropped:
                raise asyncio.TimeoutError
            if not chunk:  # the tail is over (a stream sends it at once, then waits for new bytes)
                raise Misaligned("the tail ended before the resume point")
            resume_index = aligner.add(chunk)
            if resume_index is not None:
                yield LogChunk(bytes(aligner.buffer[resume_index:]), plan.resume_at)
                offset = plan.resume_at + len(aligner.buffer) - resume_index
                break
    while chunk := await body.readany():
        yield LogChunk(chunk, offset)
        offset += len(chunk)


async def _read_within(body: Any, seconds: float) -> bytes | None:
    """The next chunk of ``body`` (b"" at its end), or None if none came within ``seconds``."""
    reader = asyncio.ensure_future(body.readany())
    try:
        await asyncio.wait({reader}, timeout=seconds)
    finally:
        if not reader.done():
            reader.cancel()
    return reader.result() if reader.done() and not reader.cancelled() else None
