"""The run record's append-only layout: a growing file kept as numbered parts; the log masked as it is read.

The driver log and the progress events both grow for as long as the job runs, and both are copied
to storage every few seconds. Object storage has no append: S3 replaces an object whole, so a file
kept as one object would be written again from its first byte at every upload, and a long run would
write bytes that grow with the square of its length. Kept as numbered parts
(``run-record/logs/ID/00000.log``, ``run-record/events/ID/00000.jsonl``, …), a finished part is
written once and never again, and only the last, growing part is rewritten: the bytes written stay
proportional to the bytes kept, each upload costs at most one part, and a reader gets the whole file
by reading the parts in name order. The same layout suits a local folder, where each part is
replaced whole and so is never seen half-written.

Secrets are masked before anything is kept, as the log is read, by the masker the client prints through
too (``masking.MaskingStream``): a secret that reaches the log in two reads is still found, because the
end of a read that may begin one waits for the next read, and nothing else waits. The lines the log is
read by (for the events in it, for the judge's causes) are kept bounded however long a line grows.
"""

from __future__ import annotations

from typing import Any, Iterator

from .masking import SecretMask

# How much of the log one read takes: what the keeper holds of it at a time.
READ_BYTES = 1 << 20
# The line being written is kept up to its latest this much until it ends (an event line is far shorter);
# a progress bar redrawn with carriage returns for hours, or binary output, must not grow in memory.
MAX_UNFINISHED_LINE_BYTES = 1 << 20


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
    """The job's driver log as this process reads it while it grows (its own stdout, a file Ray points at the log),
    masked as it is read."""

    def __init__(self, file: Any, mask: SecretMask) -> None:
        self.file = file
        self.masking = mask.stream(bytes)

    def read(self, ended: bool = False) -> Iterator[bytes]:
        """What was written since the last read, masked, a piece at a time (``ended``: the log is over, so what
        waits to show whether it begins a secret goes too)."""
        while chunk := self.file.read(READ_BYTES):
            if masked := self.masking.feed(chunk):
                yield masked
        if ended and (rest := self.masking.finish()):
            yield rest


class LineBuffer:
    """The complete lines of a stream read in pieces of any size, with the line still being written kept bounded.

    A carriage return that more text follows redraws the line (a progress bar): what came before it is dropped,
    and the line keeps that carriage return, so that its reader still sees a redrawn line. A line longer than
    ``max_bytes`` keeps its latest bytes, at least ``max_bytes`` and at most twice that (what a reader looking for
    recent text needs). Taking in a piece costs about its own length, however long the line has grown.
    """

    def __init__(self, max_bytes: int = MAX_UNFINISHED_LINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.unfinished = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that ``data`` completes (without their ``\\n``), each as it was last drawn."""
        first_end = data.find(b"\n")
        if first_end < 0:
            self._take(data)
            return []
        self._take(data[:first_end])
        lines = [bytes(self.unfinished)]
        last_end = data.rfind(b"\n")
        if last_end > first_end:
            lines += [_last_drawing(line) if b"\r" in line else line
                      for line in data[first_end + 1:last_end].split(b"\n")]
        self.unfinished = bytearray()
        self._take(data[last_end + 1:])
        return lines

    def _take(self, data: bytes) -> None:
        if not data:
            return
        redraw = _last_redraw(data)
        if redraw >= 0:
            self.unfinished[:] = data[redraw:]
        elif self.unfinished.endswith(b"\r") and not data.startswith(b"\r"):
            self.unfinished[:] = b"\r" + data
        else:
            self.unfinished += data
        if len(self.unfinished) > 2 * self.max_bytes:  # trimmed once per max_bytes taken in, not at every piece
            del self.unfinished[:-self.max_bytes]


def _last_redraw(data: bytes) -> int:
    """Where the last carriage return that more of the line follows is (those that end it may be a CRLF's), or -1."""
    return data.rfind(b"\r", 0, len(data.rstrip(b"\r")))


def _last_drawing(line: bytes) -> bytes:
    """``line`` from its last redraw on."""
    return line[max(0, _last_redraw(line)):]
