"""Where a workload's work ran, in the words its summaries use."""

from __future__ import annotations

from collections.abc import Iterable


def nodes_phrase(node_ids: Iterable[str]) -> str:
    """``1 node`` or ``N nodes``: how many distinct Ray nodes ``node_ids`` name."""
    count = len(set(node_ids))
    return f"{count} node{'s' if count != 1 else ''}"
