"""Draw docs/live-view.png: what `rayjobs submit` shows on a terminal while a job trains, from a real job's log.

    python docs/live_view.py RUN_FOLDER_OR_LOG_FILE [--at-report N] [--steps K] [--out docs/live-view.png]

The log (a run record's folder, or a driver log file) is replayed through the follower's own ``LogView``
and ``LiveProgress``, up to the Kth step event after its Nth report: the job's last lines as the terminal
shows them (Ray's chatter and the event lines taken out), and the live block under them, drawn as a
110-column terminal draws them.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.follow.display import LiveProgress  # noqa: E402
from runner.follow.log_view import LogView  # noqa: E402
from rayjobs_agent.vocabulary import decode  # noqa: E402
from runner.follow.progress import RunProgress  # noqa: E402

COLUMNS = 110
OUTPUT_LINES = 9
BACKGROUND, FOREGROUND = "#1e1e1e", "#d4d4d4"


def read_log_bytes(source: Path) -> bytes:
    """The driver log: a file, or the first attempt's log in a run record's folder."""
    if source.is_file():
        return source.read_bytes()
    from runner.records.store import Folder, attempt_log, read_run

    folder = Folder(str(source))
    return attempt_log(folder, str(read_run(folder)["attempts"][0]["submission_id"]))


def replay(text: str, at_report: int, steps: int) -> tuple[RunProgress, list[str], float]:
    """Progress and shown lines up to step event ``steps`` after report ``at_report``; the seconds since the
    first event."""
    progress, shown = RunProgress(), io.StringIO()
    times: list[float] = []

    def take(event: dict) -> None:
        progress.update(event)
        times.append(float(event.get("time") or 0))

    view = LogView(shown, take, strip_ansi=True)
    reports = steps_seen = 0
    for line in text.splitlines(keepends=True):
        event = decode(line)
        kind = event["event"] if event is not None else None
        if reports >= at_report and (kind not in (None, "step") or steps_seen >= steps):
            break
        view.write(line)
        reports += kind == "report"
        steps_seen += kind == "step" and reports >= at_report
    return progress, shown.getvalue().splitlines(), (times[-1] - times[0]) if times else 0.0


def draw(progress: RunProgress, lines: list[str], elapsed_s: float, job_id: str, out: Path) -> None:
    """Render the lines and the live block with rich, then each styled piece of text with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rich.console import Console, Group
    from rich.text import Text

    live = LiveProgress(progress, job_id, stream=io.StringIO())
    live.started = time.monotonic() - elapsed_s
    console = Console(width=COLUMNS, force_terminal=True, color_system="truecolor", file=io.StringIO())
    renderable = Group(*(Text(line[:COLUMNS]) for line in lines[-OUTPUT_LINES:]), live.__rich__())
    rendered = console.render_lines(renderable, console.options, pad=False)
    live.close()

    char_w, line_h, margin = 6.6, 14.0, 12.0  # points, for an 11 pt monospace font
    width = COLUMNS * char_w + 2 * margin
    height = len(rendered) * line_h + 2 * margin
    figure = plt.figure(figsize=(width / 72, height / 72), dpi=144, facecolor=BACKGROUND)
    for row, segments in enumerate(rendered):
        column = 0
        for segment in segments:
            if not segment.text:
                continue
            style = segment.style
            color = FOREGROUND
            if style is not None and style.color is not None and not style.color.is_default:
                color = style.color.get_truecolor().hex
            if style is not None and style.dim:
                color = "#8a8a8a"
            figure.text((margin + column * char_w) / width, 1 - (margin + (row + 0.8) * line_h) / height,
                        segment.text, color=color, family="DejaVu Sans Mono", fontsize=11,
                        weight="bold" if style is not None and style.bold else "normal")
            column += len(segment.text)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, facecolor=BACKGROUND)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a run record's folder, or a driver log file")
    parser.add_argument("--at-report", type=int, default=2, help="draw the screen after this many reports")
    parser.add_argument("--steps", type=int, default=2, help="and this many step events after it")
    parser.add_argument("--job-id", default="raysubmit_…", help="the job id the block names")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "live-view.png")
    args = parser.parse_args()
    progress, lines, elapsed = replay(read_log_bytes(args.source).decode("utf-8", "replace"), args.at_report, args.steps)
    draw(progress, lines, elapsed, args.job_id, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
