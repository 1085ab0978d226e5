"""rayjobs' own lines (``rayjobs: …``): the one writer of them on this side.

Every command, the follower and the run loop write their lines through a :class:`Reporter`; the agent
beside the job begins its lines in the job's log the same way (``rayjobs_agent.wire.OWN_LINE_PREFIX``), and
the follower shows those among these. A reporter writes to the stream it was given, or to the current
``sys.stderr`` when the line is written (so a redirected stderr is honoured).
"""

from __future__ import annotations

import sys
from typing import TextIO

from rayjobs_agent.wire import OWN_LINE_PREFIX


def own_line(text: str) -> str:
    """``text`` as one of rayjobs' own lines: ``rayjobs: text``."""
    return f"{OWN_LINE_PREFIX}{text}"


class Reporter:
    """rayjobs' own lines, to a stream chosen when they are written."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out

    def write(self, text: str) -> None:
        """Write one line as it is (a line already begun as rayjobs', or one indented under it)."""
        out = self._out or sys.stderr
        out.write(text + "\n")
        out.flush()

    def say(self, text: str) -> None:
        """Write one line as ``rayjobs: text``."""
        self.write(own_line(text))


def say(text: str) -> None:
    """One of rayjobs' own lines to stderr."""
    Reporter().say(text)
