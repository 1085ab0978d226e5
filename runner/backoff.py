"""Exponential backoff: the one schedule behind every retry and reconnect loop in rayjobs, and ``retrying``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from runner.errors import ClusterUnreachable, NotADashboard

T = TypeVar("T")


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

def retrying(call: Callable[[], T], give_up_after_s: float, on_retry: Callable[[Exception, float], None] | None = None,
             first_delay_s: float = 0.2, max_delay_s: float = 2.0) -> T:
    """Run ``call``, retrying with backoff while the cluster is unreachable.

    Args:
        call: the request to make.
        give_up_after_s: no retry starts later than this after the first try.
        on_retry: hears of each failure and the delay before the next try.
        first_delay_s, max_delay_s: the backoff's first and largest delay.

    Returns:
        What ``call`` returned.

    Raises:
        ClusterUnreachable: still unreachable at the deadline; ``NotADashboard`` at once (retrying will not help).
        RayJobsError: any other failure of ``call``, at once.
    """
    deadline = Deadline(give_up_after_s)
    backoff = Backoff(first_delay_s, max_delay_s)
    while True:
        try:
            return call()
        except ClusterUnreachable as exc:
            delay = backoff.next_delay()
            if isinstance(exc, NotADashboard) or not deadline.allows(delay):
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            time.sleep(delay)
