"""Keeping an observer's failure out of the run it observes: one guard for every hook rayjobs adds to a job.

Ray turns an exception in a Ray Train callback's hook into a failed run. A hook wrapped in
:func:`guarded` never raises: its first failure turns its callback off for the rest of the run and is
said once, in the log (``rayjobs: progress unavailable: <reason>; the run goes on``) and as a
``progress_unavailable`` event, which the run record keeps among its notes. Standard library only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .events import emit
from .vocabulary import EventKind
from .wire import say

UNAVAILABLE_EVENT = EventKind.PROGRESS_UNAVAILABLE
_NOTE_CHARS = 300


def guarded(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` of a callback that must never fail the run: an exception turns the callback off, said once."""

    @functools.wraps(hook)
    def run_guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "unavailable", None):
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:
            turn_off(self, f"{hook.__name__} failed ({type(exc).__name__}: {exc})")
            return None

    return run_guarded


def turn_off(callback: Any, reason: str) -> None:
    """Stop ``callback`` for the rest of the run and say why, once, in the log and as an event."""
    if getattr(callback, "unavailable", None):
        return
    reason = " ".join(str(reason).split())[:_NOTE_CHARS]
    try:
        callback.unavailable = reason
    except Exception:  # an object that takes no attribute: it is said anyway
        pass
    say(f"progress unavailable: {reason}; the run goes on")
    try:
        emit(UNAVAILABLE_EVENT, reason=reason)
    except Exception:
        pass
