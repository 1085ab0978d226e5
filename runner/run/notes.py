"""rayjobs' own ``rayjobs: …`` lines, as a run writes them."""

from __future__ import annotations

import sys
from typing import TextIO


class Notes:
    """rayjobs' own lines, to a stream chosen when they are written (so a redirected stderr is honoured)."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out

    def write(self, text: str) -> None:
        """Write one line as it is."""
        out = self._out or sys.stderr
        out.write(text + "\n")
        out.flush()

    def say(self, text: str) -> None:
        """Write one line as ``rayjobs: text``."""
        self.write(f"rayjobs: {text}")
