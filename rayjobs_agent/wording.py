"""How rayjobs words numbers for a person: durations, times, metric values, aligned rows, resource use. One module,
used by the agent's notifications and every client command alike, so a duration reads the same in a Slack message,
the terminal and ``rayjobs runs``.

Standard library only: it runs in the job's wrapper.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from .wire import CPU_PRICE_ENV_VAR, GPU_PRICE_ENV_VAR

_METRICS_IN_A_LINE = 8
_GIB = 1024 ** 3


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


def local_time(seconds: Any, zone: bool = False) -> str:
    """Local time of a Unix timestamp in seconds (``2026-11-24 18:26:13``, with ``zone`` ``… UTC``: for a page that
    may be read in another zone); ``-`` for none; a number no calendar holds (a record written by hand) as the number."""
    if not seconds:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z" if zone else "%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    except (OverflowError, OSError, ValueError, TypeError):
        return f"{seconds} (Unix seconds)"


def format_bytes(size: Any) -> str:
    """``512 B``, ``1.5 KiB``, ``3.0 GiB``; ``-`` for what is no amount."""
    if not sample_amount(size):
        return "-"
    amount = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def cluster_text(cluster: Any) -> str:
    """``2 nodes, 8 CPUs, 0 GPUs``: the cluster a Ray Train run reported ("" when it reported none)."""
    if not isinstance(cluster, Mapping) or not cluster:
        return ""
    nodes = cluster.get("nodes")
    return (f"{nodes} node{'s' if nodes != 1 else ''}, {format_value(cluster.get('cpus'))} CPUs, "
            f"{format_value(cluster.get('gpus') or 0)} GPUs")


def plain_table(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows as aligned columns, two spaces apart; the last column is left ragged (it may be long)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1]
                     for row in rows)


def labelled_rows(rows: Sequence[tuple[str, str]]) -> str:
    """``label:  value`` lines, the values aligned after the longest label."""
    width = max((len(label) for label, _ in rows), default=0) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)


def usage_line(event: Mapping[str, Any]) -> str:
    """The live view's line for one sample: ``CPU 1.9/2 · RSS 3.1 GiB · GPU 64 % · 2.0/80 GiB``."""
    parts = [f"CPU {_number(event.get('cpu')):.1f}/{_number(event.get('cpus')):g}",
             f"RSS {_number(event.get('rss_bytes')) / _GIB:.1f} GiB"]
    if _number(event.get("gpus")) > 0:
        parts.append(f"GPU {_number(event.get('gpu_util')):.0f} %")
        parts.append(f"{_number(event.get('gpu_mem_bytes')) / _GIB:.1f}/"
                     f"{_number(event.get('gpu_mem_total_bytes')) / _GIB:.0f} GiB")
    return " · ".join(parts)


def totals_lines(totals: Mapping[str, Any]) -> list[str]:
    """``rayjobs show``'s lines for the totals (none when the run has no samples)."""
    if not totals.get("samples"):
        return []
    # A run whose samples covered no time to speak of (it ended within a tick of starting) has no mean.
    mean = "" if totals.get("mean_cpu") is None else f" (mean {totals['mean_cpu']:.2f} cores)"
    lines = [f"CPU {totals['cpu_hours']:.3f} core·h{mean} · peak RSS {totals['peak_rss_bytes'] / _GIB:.2f} GiB"]
    if totals.get("gpu_hours"):
        # A record's totals may hold GPU seconds without the samples they came from (written by hand).
        mean = "" if totals.get("mean_gpu_util") is None else f" (mean utilisation {totals['mean_gpu_util']:.0f} %)"
        lines.append(f"GPU {totals['gpu_hours']:.3f} GPU·h{mean} · "
                     f"peak GPU memory {totals['peak_gpu_mem_bytes'] / _GIB:.2f} GiB")
    if totals.get("data_wait_share") is not None:
        lines.append(f"waiting for data: {totals['data_wait_share']:.0%} of training time")
    if totals.get("cost") is not None:
        lines.append(f"cost: {totals['cost']:.4f} (at the prices in {CPU_PRICE_ENV_VAR}/{GPU_PRICE_ENV_VAR})")
    return lines


# No reading of one process reaches this (2**53 bytes is 8 PiB; 2**53 seconds, 285 million years): above it a sample
# was written by hand, and sums of such could overflow to infinity, which no JSON reader takes.
LARGEST_AMOUNT = float(2 ** 53)


def sample_amount(value: Any) -> bool:
    """Whether ``value`` is an amount of a resource: a number, 0 or more and at most :data:`LARGEST_AMOUNT` (a sample
    or record written by hand with text, NaN, a negative or a huge number there counts as absent, so no total goes
    below zero or to infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0 <= value <= LARGEST_AMOUNT
    except OverflowError:  # an int too large for a float
        return False


def _number(value: Any) -> float:
    """``value`` for a line: 0 for what is no amount (:func:`sample_amount`)."""
    return float(value) if sample_amount(value) else 0.0
