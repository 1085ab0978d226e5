"""How a followed job's progress is shown: one plain line per event, or a live status block on a terminal.

Plain (a pipe, a CI log, a file): each progress event becomes one ``rayjobs: …`` line on the notes
stream, in order with the job's output, with no colour and nothing that rewrites a line.

Live (stdout and stderr both a terminal): the job's output scrolls and a few lines below it show
where the run is: stage, a progress bar with the pace and ETA, the last metrics, attempts and
restarts, and where the workers run. rayjobs' own lines are printed above the block as well.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from runner.reporter import Reporter, own_line
from rayjobs_agent.vocabulary import EventKind, kind_of
from rayjobs_agent.wording import format_duration, format_value, usage_line
from runner.follow.progress import (RunProgress, epochs_done, event_line, pace_parts,
                                    position_text, short_reason, shown_metrics)

_REFRESH_PER_S = 4
# Events that get a line of their own above the live block.
_OWN_LINE_KINDS = frozenset({EventKind.RESTART, EventKind.TRAIN_END, EventKind.ATTEMPT, EventKind.STAGE})
_BAR_WIDTH = 30


def wants_live_view(out: TextIO, notes: TextIO) -> bool:
    """Whether a live block can be drawn: both streams are the same kind of thing, a terminal."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (out, notes))


class PlainProgress:
    """One ``rayjobs:`` line per event on ``notes``."""

    def __init__(self, progress: RunProgress, notes: TextIO) -> None:
        self.progress = progress
        self.notes = notes

    def event(self, event: dict[str, Any]) -> None:
        """Take in one event and print its line."""
        self.progress.update(event)
        line = event_line(event, self.progress)
        if line is not None:
            Reporter(self.notes).say(line)

    def close(self) -> None:
        """Nothing is left on screen to tidy."""


class _ConsoleLines:
    """A text stream that prints whole lines through a rich console, above its live block."""

    def __init__(self, console: Any, style: str | None = None) -> None:
        self.console = console
        self.style = style
        self.encoding = console.encoding
        self._partial = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        from rich.text import Text

        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            # A progress bar redrawn with carriage returns shows as its last state.
            shown = Text.from_ansi(line.rsplit("\r", 1)[-1])
            if self.style:
                shown.stylize(self.style)
            self.console.print(shown, soft_wrap=True, highlight=False, markup=False)
        return len(text)

    def flush(self) -> None:
        """Whole lines are printed as they come; an incomplete one waits for its end."""

    def close(self) -> None:
        if self._partial:
            self.write("\n")


class LiveProgress:
    """A live status block under the job's scrolling output; ``out`` and ``notes`` print above it."""

    def __init__(self, progress: RunProgress, job_id: str, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.progress = progress
        self.job_id = job_id
        self.started = time.monotonic()
        self.console = Console(file=stream or sys.stdout, highlight=False)
        self.out = _ConsoleLines(self.console)
        self.notes = _ConsoleLines(self.console, style="dim")
        self._live = Live(self, console=self.console, refresh_per_second=_REFRESH_PER_S, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()

    def event(self, event: dict[str, Any]) -> None:
        """Take in one event; restarts, the end of training and a trial's start and end also get a line of their
        own above the block."""
        self.progress.update(event)
        if kind_of(event) in _OWN_LINE_KINDS or (
                kind_of(event) == EventKind.TRIAL and event.get("state") != "running"):
            line = event_line(event, self.progress)
            if line is not None:
                Reporter(self.notes).say(line)

    def close(self) -> None:
        """Print what is left and take the block off the screen; the last state is printed once, plainly."""
        self.out.close()
        self.notes.close()
        self._live.stop()
        if self.progress.events:
            self.console.print(self._summary_text(), highlight=False, markup=False)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        progress = self.progress
        rows = [Text.assemble(("● ", "cyan"), (f"job {self.job_id}", "bold"),
                              f" · {format_duration(time.monotonic() - self.started)}",
                              f" · stage {progress.stage}" + (f" ({progress.stage_index}/{progress.stage_count})"
                                                             if progress.stage_index else "")
                              if progress.stage else "")]
        if progress.training_state is not None or progress.epoch is not None:
            rows.append(self._bar_row())
        if progress.metrics:
            precision = progress.metrics.get("precision")  # which arithmetic ran: bf16 or fp32, from the job
            rows.append(Text("  " + " · ".join([f"{name} {format_value(value)}" for name, value in shown_metrics(
                progress.metrics, 6)] + ([precision] if isinstance(precision, str) else [])), style="green"))
        if progress.attempts:
            rows.append(Text("  " + self._attempt_text(), style="yellow" if progress.restarts else "dim"))
        if progress.trials:
            rows.append(Text("  " + str(progress.trials_text()), style="cyan"))
        if progress.resources is not None:
            rows.append(Text("  " + usage_line(progress.resources), style="dim"))
        return Group(*rows)

    def _bar_row(self) -> Any:
        from rich.text import Text

        progress = self.progress
        if progress.step is not None and progress.steps and progress.step_epoch is not None:
            # Mid-epoch: the epoch under way, not the last one reported.
            total = f"/{progress.epochs}" if progress.epochs else ""
            row = Text(f"  epoch {progress.step_epoch}{total} · step {progress.step}/{progress.steps}")
        else:
            row = Text("  " + position_text(progress))
        if progress.epochs and (progress.epoch is not None or progress.steps):
            done = min(1.0, epochs_done(progress) / progress.epochs)
            filled = int(round(done * _BAR_WIDTH))
            row.append("  ")
            row.append("━" * filled, style="magenta")
            row.append("━" * (_BAR_WIDTH - filled), style="grey35")
            row.append(f" {done:4.0%}")
        for part in pace_parts(progress):
            row.append(f" · {part}")
        return row

    def _attempt_text(self) -> str:
        progress = self.progress
        nodes = progress.nodes
        text = (f"attempt {progress.attempts} · {len(progress.restarts)} restarts · {len(progress.workers)} "
                f"workers on {nodes} node{'s' if nodes != 1 else ''}")
        if progress.restarts:
            text += f" · last: {short_reason(progress.restarts[-1].reason)}"
        return text

    def _summary_text(self) -> str:
        progress = self.progress
        parts = [position_text(progress)] if progress.epoch is not None else []
        parts += [f"{name} {format_value(value)}" for name, value in shown_metrics(progress.metrics)]
        if progress.attempts > 1:
            parts.append(f"{progress.attempts} attempts")
        return own_line("last progress: " + " · ".join(parts) if parts else "no training progress reported")
