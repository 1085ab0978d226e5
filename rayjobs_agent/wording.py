"""How rayjobs words numbers for a person: durations, times, metric values, aligned rows. One module, used by the
agent's notifications and every client command alike, so a duration reads the same in a Slack message, the
terminal and ``rayjobs runs``.

Standard library only: it runs in the job's wrapper.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

_METRICS_IN_A_LINE = 8


def format_duration(seconds: float | None) -> str:
    """``12.3s``, ``4m05s`` or ``1h02m03s``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_value(value: Any) -> str:
    """A metric as a person reads it: four significant digits, integers whole."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_metrics(metrics: dict[str, Any], most: int = _METRICS_IN_A_LINE) -> str:
    """``loss=0.1234, accuracy=0.9``: at most ``most`` of them, in the job's order (nested values left out)."""
    return ", ".join(f"{key}={format_value(value)}" for key, value in list(metrics.items())[:most]
                     if not isinstance(value, (dict, list)))


def local_time(seconds: float | None) -> str:
    """Local time of a Unix timestamp in seconds (``2026-11-24 18:26:13``); ``-`` for none."""
    return "-" if not seconds else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def plain_table(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows as aligned columns, two spaces apart; the last column is left ragged (it may be long)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1]
                     for row in rows)


def labelled_rows(rows: Sequence[tuple[str, str]]) -> str:
    """``label:  value`` lines, the values aligned after the longest label."""
    width = max((len(label) for label, _ in rows), default=0) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)
