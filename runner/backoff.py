"""Exponential backoff: the one schedule behind every retry and reconnect loop in rayjobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays that grow by ``factor`` (doubling by default) from ``first_s`` up to ``max_s``; ``reset()`` after a
    success starts over.

    Used the same way by blocking and async loops: ask :meth:`next_delay`, sleep that long yourself.
    """

    first_s: float = 0.2
    max_s: float = 2.0
    factor: float = 2.0
    _current: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        self._current = self.first_s

    def next_delay(self) -> float:
        """The delay to wait now; the following call returns ``factor`` times as much (at most ``max_s``)."""
        delay = self._current
        self._current = min(self._current * self.factor, self.max_s)
        return delay

    def peek(self) -> float:
        """The delay :meth:`next_delay` would return, without advancing."""
        return self._current

    def reset(self) -> None:
        """Start again from ``first_s`` (after a success)."""
        self._current = self.first_s


@dataclass(frozen=True)
class Deadline:
    """A point in time on the monotonic clock, ``seconds`` from when it was made."""

    seconds: float
    _at: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_at", time.monotonic() + self.seconds)

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self._at - time.monotonic()

    def allows(self, wait_s: float) -> bool:
        """True if waiting ``wait_s`` more seconds still ends before the deadline."""
        return wait_s <= self.left()
