"""Waiting for a condition instead of sleeping for a guessed time."""

from __future__ import annotations

import time
from typing import Callable


def wait_for_condition(predicate: Callable[[], object], timeout_s: float = 30, interval_s: float = 0.2) -> object:
    """Poll ``predicate`` until it returns something truthy; return that value.

    ``timeout_s`` is a hang guard, not a speed requirement: give it room for a loaded machine.
    Raises AssertionError after it, naming the last exception the predicate raised, if any.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # the condition may not be checkable yet
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error!r}" if last_error else ""
            raise AssertionError(f"condition not met within {timeout_s} s{detail}")
        time.sleep(interval_s)


# Seconds after which a step that should take a few is taken to hang. Only a hang exceeds it, however
# loaded the machine: how fast a step really is belongs to a benchmark, not to a test.
HANG_GUARD_S = 120.0
