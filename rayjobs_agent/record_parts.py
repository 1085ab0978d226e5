"""The run record's append-only layout: a growing file kept as numbered parts, and its lines masked.

The driver log and the progress events both grow for as long as the job runs, and both are copied
to storage every few seconds. Object storage has no append: S3 replaces an object whole, so a file
kept as one object would be written again from its first byte at every upload, and a long run would
write bytes that grow with the square of its length. Kept as numbered parts
(``run-record/logs/ID/00000.log``, ``run-record/events/ID/00000.jsonl``, …), a finished part is
written once and never again, and only the last, growing part is rewritten: the bytes written stay
proportional to the bytes kept, each upload costs at most one part, and a reader gets the whole file
by reading the parts in name order. The same layout suits a local folder, where each part is
replaced whole and so is never seen half-written.

Secrets are masked before anything is kept: whole lines at a time, so that a secret that reaches
the log in two reads is still found (a line is held back until its end arrives).
"""

from __future__ import annotations

from typing import Any

# A line with no end yet is held back for masking up to this much, then kept as it is (a progress bar
# redrawn with carriage returns, or binary output, must not grow in memory).
MAX_HELD_LINE_BYTES = 64 * 1024
_LINE_ENDS = (b"\n", b"\r")


class PartedFile:
    """One growing file of the record, written through an uploader as numbered parts of ``part_bytes``.

    ``cut_at_lines``: a part ends after a whole line once it reaches ``part_bytes`` (events: each part
    reads alone); otherwise exactly at ``part_bytes`` (the log: parts are byte ranges of the file).
    """

    def __init__(self, uploader: Any, folder: str, suffix: str, part_bytes: int, cut_at_lines: bool) -> None:
        self.uploader = uploader
        self.folder = folder
        self.suffix = suffix
        self.part_bytes = part_bytes
        self.cut_at_lines = cut_at_lines
        self.finished_parts = 0
        self.tail = bytearray()
        self.size = 0
        self._tail_put: tuple[int, int] | None = None

    def append(self, data: bytes) -> None:
        """Add ``data`` (whole lines when ``cut_at_lines``); a part that fills up is handed on, once."""
        self.tail += data
        self.size += len(data)
        if self.cut_at_lines:
            if len(self.tail) >= self.part_bytes:
                self._finish_part(len(self.tail))
            return
        while len(self.tail) >= self.part_bytes:
            self._finish_part(self.part_bytes)

    def sync(self) -> None:
        """Hand on the growing part, when it changed since it last was."""
        state = (self.finished_parts, len(self.tail))
        if self.tail and state != self._tail_put:
            self.uploader.put(self.part_name(self.finished_parts), bytes(self.tail))
            self._tail_put = state

    @property
    def parts(self) -> int:
        """How many parts the file has now, the growing one included."""
        return self.finished_parts + (1 if self.tail else 0)

    def part_name(self, index: int) -> str:
        """The name of part ``index`` in the run's folder."""
        return f"{self.folder}/{index:05d}{self.suffix}"

    def _finish_part(self, length: int) -> None:
        self.uploader.put(self.part_name(self.finished_parts), bytes(self.tail[:length]))
        del self.tail[:length]
        self.finished_parts += 1
        self._tail_put = None


class DriverLog:
    """The job's driver log as this process reads it while it grows (its own stdout, a file Ray points at the log):
    masked as it is read, and each complete line handed to the ``listeners`` (the agent's judge of the job)."""

    def __init__(self, file: Any, mask: Any) -> None:
        self.file = file
        self.masker = LineMasker(mask)
        self.listeners: list[Any] = []
        self._partial = b""

    def read(self, ended: bool = False) -> bytes:
        """What was written since the last read, masked (``ended``: the log is over, so a line held back goes too)."""
        masked = b""
        while chunk := self.file.read(1 << 20):
            masked += self.masker.feed(chunk)
        if ended:
            masked += self.masker.flush()
        if masked and self.listeners:
            lines = (self._partial + masked).split(b"\n")
            self._partial = b"" if ended else lines.pop()
            for line in lines:
                text = line.decode("utf-8", "replace").rstrip("\r")
                for listener in self.listeners:
                    listener(text)
        return masked


class LineMasker:
    """Masks secrets in a stream a line at a time, holding back a line until its end has arrived."""

    def __init__(self, mask: Any) -> None:
        self.mask = mask
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines that ``chunk`` ends (with what was held back before it), masked.

        A line longer than :data:`MAX_HELD_LINE_BYTES` is released before its end, up to where a secret (or
        a URL's password) may begin: a secret that straddles the cut is held back whole with the rest.
        """
        data = self.held + chunk
        end = max(data.rfind(line_end) for line_end in _LINE_ENDS) + 1
        if end == 0 and len(data) > MAX_HELD_LINE_BYTES:
            end = self.mask.hold_from_bytes(data) if self.mask is not None else len(data)
        self.held = data[end:]
        return self._masked(data[:end])

    def flush(self) -> bytes:
        """What is held back, masked: the stream has ended."""
        rest, self.held = self.held, b""
        return self._masked(rest)

    def _masked(self, data: bytes) -> bytes:
        if not data or self.mask is None:
            return data
        return self.mask.mask_bytes(data)
