"""The live view's block as a terminal would show it, for tests that read what it says."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any


def progress_after(events: Iterable[dict[str, Any]]) -> Any:
    """The ``RunProgress`` a follower holds after reading ``events``."""
    from runner.follow.progress import RunProgress

    progress = RunProgress()
    for event in events:
        progress.update(event)
    return progress


def rendered_live_view(progress: Any, submission_id: str = "raysubmit_x") -> str:
    """The text of the live block for ``progress``, drawn 120 columns wide without colour."""
    from rich.console import Console

    from runner.follow.display import LiveProgress

    live = LiveProgress(progress, submission_id, stream=io.StringIO())
    try:
        console = Console(file=io.StringIO(), width=120, color_system=None)
        console.print(live)
        return console.file.getvalue()
    finally:
        live.close()
