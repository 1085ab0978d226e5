"""Writing one progress event: a ``rayjobs-event {json}`` line on stdout."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from .vocabulary import encode

# A metric's value is for a person reading progress, not for resuming a computation.
_SIGNIFICANT_DIGITS = 6


def emit(event: str, **fields: Any) -> None:
    """Print one event of kind ``event`` (a ``vocabulary.EventKind``) with ``fields`` (that kind's, in ``vocabulary``)."""
    # One write, so that lines of other threads cannot land inside it.
    sys.stdout.write(encode(event, fields, time.time()) + "\n")
    sys.stdout.flush()


def plain_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics that read as numbers or short text, rounded; NaN and infinity as text."""
    plain: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            plain[name] = value
        elif isinstance(value, float) or hasattr(value, "item"):
            try:
                number = float(value)
            except Exception:  # a tensor of many values, or an object that only looks numeric
                continue
            plain[name] = str(number) if not math.isfinite(number) else float(f"{number:.{_SIGNIFICANT_DIGITS}g}")
        elif isinstance(value, str) and len(value) <= 200:
            plain[name] = value
    return plain
