"""Printing a log whose bytes arrive in pieces, possibly more than once, from more than one source."""

from __future__ import annotations

import codecs
import collections
import time
from typing import TextIO

from jobs.secrets import SecretMask
from runner.client.log_resume import KEPT_BYTES

_PARTIAL_LINE_CHARS = 4096
_KEPT_SLACK_BYTES = 1 << 20


class LogCursor:
    """Prints the new part of a log whose bytes arrive (possibly again) at known offsets.

    Offsets count the log's raw bytes, so text delivered twice, or by two different
    sources, is printed once. Bytes that are not valid UTF-8 are shown as U+FFFD; a
    character split between two deliveries is decoded whole.
    """

    def __init__(self, out: TextIO, keep_lines: int = 20) -> None:
        self.out = out
        self.written = 0
        self.lines = 0
        self.first_byte_at: float | None = None
        self.last_byte_at: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._partial = ""
        self._kept = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._masking = SecretMask(()).stream()

    def mask_with(self, mask: SecretMask) -> None:
        """Mask the job's secrets in everything printed from now on (URL passwords are masked from the start)."""
        self._masking = mask.stream()

    def feed(self, chunk: bytes, start: int) -> None:
        """``chunk`` holds the log's bytes ``start`` … ``start + len(chunk)``."""
        end = start + len(chunk)
        if end <= self.written:
            return
        new = chunk[max(0, self.written - start):]
        self.written = end
        self.lines += new.count(b"\n")
        self.last_byte_at = time.monotonic()
        if self.first_byte_at is None:
            self.first_byte_at = self.last_byte_at
        self._kept += new
        if len(self._kept) > KEPT_BYTES + _KEPT_SLACK_BYTES:
            del self._kept[:len(self._kept) - KEPT_BYTES]
        self._write(self._decoder.decode(new))

    def finish(self) -> None:
        """The log is complete: an incomplete character at its very end is shown as U+FFFD."""
        self._write(self._decoder.decode(b"", final=True), final=True)

    def kept(self) -> bytes:
        """The last bytes printed (up to ``KEPT_BYTES``), to find the resume point in a tail."""
        with memoryview(self._kept) as kept:  # one copy, not two
            return bytes(kept[-KEPT_BYTES:])

    def lines_per_s(self) -> float:
        """How fast lines arrived so far (per second, over at least one second)."""
        if self.first_byte_at is None or self.last_byte_at is None:
            return 0.0
        return self.lines / max(1.0, self.last_byte_at - self.first_byte_at)

    def tail_lines(self) -> list[str]:
        """The last lines printed, each as a terminal shows it (after its last carriage return)."""
        lines = list(self.tail) + ([self._partial] if self._partial else [])
        shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]
        return shown[-(self.tail.maxlen or len(shown)):]

    def _write(self, text: str, final: bool = False) -> None:
        # Everything downstream (the screen, the failure's evidence, the log tail) sees the masked text.
        text = self._masking.feed(text) + (self._masking.finish() if final else "")
        if not text:
            return
        try:
            self.out.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show U+FFFD (or the job's own characters)
            encoding = self.out.encoding or "ascii"
            self.out.write(text.encode(encoding, "replace").decode(encoding))
        self.out.flush()
        lines = (self._partial + text).split("\n")
        # A line without end (a progress bar redrawn with \r for hours) must not grow without bound.
        self._partial = lines.pop()[-_PARTIAL_LINE_CHARS:]
        self.tail.extend(line[-_PARTIAL_LINE_CHARS:] for line in lines)
