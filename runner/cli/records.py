"""The commands that read run records, with no cluster: ``runs``, ``show``, ``compare`` (and ``logs RUN``), and
what ``rerun`` checks and links before it submits."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rayjobs_agent.record_layout import DEFAULT_RECORD_PATH
from runner.cli.options import OutputOption, check_output, handles_errors
from runner.cli.options import say as _say
from runner.errors import BadInput, RayJobsError

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.cli.options import ConnectionOptions

RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="A run's folder, local or s3:// (for the built-in "
                                            "workloads <storage_path>/<run_name>).", show_default=False)]


def is_run_location(text: str) -> bool:
    """Whether a command's argument names a run's folder rather than a job id (ids hold no '/'; URIs do)."""
    return text.startswith(("~", ".")) or "/" in text


@handles_errors
def runs(
    location: Annotated[str, typer.Argument(metavar="LOCATION", help="A folder of runs, local or s3://BUCKET/PREFIX "
                                            "(a storage_path or record_path).")] = DEFAULT_RECORD_PATH,
    pipeline: Annotated[str | None, typer.Option("--pipeline", metavar="RUN", help="Show one pipeline run instead: "
                                                 "its jobs layer by layer, what each ran after, its status and run "
                                                 "folder (RUN: the id `rayjobs submit PIPELINE.yaml` printed).",
                                                 show_default=False)] = None,
    output: OutputOption = "text",
) -> None:
    """List the runs recorded in LOCATION, newest first, or one pipeline run's graph (no cluster needed)."""
    from runner.records.report import listed_run, runs_table
    from runner.records.store import Folder, list_runs

    check_output(output)
    folder = Folder(location)
    found = list_runs(folder)
    if pipeline is not None:
        from runner.records.pipeline import graph_text, pipeline_graph

        graph = pipeline_graph(found, pipeline)
        typer.echo(json.dumps(graph, indent=2) if output == "json" else graph_text(graph))
        return
    if output == "json":
        typer.echo(json.dumps([listed_run(run_folder, document) for run_folder, document in found], indent=2))
        return
    if not found:
        _say(f"no runs recorded in {folder.location}")
        return
    typer.echo(runs_table(found))


@handles_errors
def show(run: RunArgument, output: OutputOption = "text") -> None:
    """Show what a recorded run ran (spec, code, versions, cluster) and how it went (no cluster needed)."""
    from rayjobs_agent.usage import prices_from
    from runner.records.report import masked_record, run_resource_totals, show_text
    from runner.records.store import Folder, read_run

    check_output(output)
    try:
        prices = prices_from(os.environ)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    folder = Folder(run)
    document = masked_record(read_run(folder))
    if output == "json":
        typer.echo(json.dumps({**document, "resource_totals": run_resource_totals(document, prices)}, indent=2))
    else:
        typer.echo(show_text(folder, document, prices))


def print_saved_log(run: str, tail: int | None) -> None:
    """``rayjobs logs RUN``: the driver log its record saved, every attempt in order (a line on stderr between)."""
    from runner.records.report import masked_log
    from runner.records.store import Folder, attempt_log, read_run

    folder = Folder(run)
    attempts = read_run(folder).get("attempts") or []
    chunks = []
    for attempt in attempts:
        text = masked_log(attempt_log(folder, str(attempt.get("submission_id"))).decode("utf-8", errors="replace"))
        chunks.append((attempt, text))
    if tail is not None:
        lines = "".join(text for _, text in chunks).splitlines(keepends=True)
        sys.stdout.write("".join(lines[-tail:] if tail else []))
        sys.stdout.flush()
        return
    for attempt, text in chunks:
        if len(attempts) > 1:
            sys.stdout.flush()
            _say(f"── attempt {attempt.get('attempt', '?')}: {attempt.get('submission_id')} ({attempt.get('status')})")
        sys.stdout.write(text)
        sys.stdout.flush()


@handles_errors
def compare(
    run_folders: Annotated[list[str], typer.Argument(metavar="RUN...", help="Two or more runs' folders, local or "
                                                     "s3://.", show_default=False)],
    plot: Annotated[Path, typer.Option("--plot", metavar="PNG", help="Where to draw the runs' curves overlaid.")]
    = Path("rayjobs-compare.png"),
    output: OutputOption = "text",
) -> None:
    """Compare recorded runs: final metrics side by side, and their curves overlaid in a PNG (no cluster needed)."""
    from runner.records.report import compare_plot, compare_table, listed_run
    from rayjobs_agent.vocabulary import EventKind, kind_of
    from runner.records.store import Folder, attempt_events, read_run

    check_output(output)
    if len(run_folders) < 2:
        raise BadInput("compare needs at least two runs' folders")
    loaded = [(folder, read_run(folder)) for folder in map(Folder, run_folders)]
    curves = {}
    for folder, document in loaded:
        label = folder.name if [f.name for f, _ in loaded].count(folder.name) == 1 else folder.location
        curves[label] = [event for attempt in document.get("attempts") or []
                         for event in attempt_events(folder, str(attempt.get("submission_id")))
                         if kind_of(event) == EventKind.REPORT]
    drawn = compare_plot(curves, plot)
    if output == "json":
        typer.echo(json.dumps({"runs": [listed_run(folder, document) for folder, document in loaded],
                               "plot": str(plot) if drawn else None, "plotted_metrics": drawn}, indent=2))
        return
    typer.echo(compare_table(loaded))
    _say(f"curves of {', '.join(drawn)}: {plot}" if drawn else "no run reported metrics over time: no plot drawn")


@handles_errors
def ui(
    location: Annotated[str, typer.Argument(metavar="LOCATION", help="A folder of runs, local or s3://BUCKET/PREFIX "
                                            "(a storage_path or record_path), or one run's folder.")]
    = DEFAULT_RECORD_PATH,
    host: Annotated[str, typer.Option("--host", help="Where to listen. Anything but loopback asks for a token, "
                                      "printed once with the URL.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The port to listen on (0: any free one).")] = 8270,
    export: Annotated[Path | None, typer.Option("--export", metavar="DIR", help="Write the pages as static files "
                                                "into DIR instead of serving them.", show_default=False)] = None,
) -> None:
    """A history page over the runs recorded in LOCATION: runs, one run, runs compared (no cluster needed)."""
    from runner.records.store import Folder
    from runner.ui.data import Records

    records = Records(Folder(location))
    if export is not None:
        from runner.ui.export import export as write_pages

        written = write_pages(records, export)
        _say(f"wrote {written['run_pages']} run page(s) of {written['runs']} run(s) and {written['log_pages']} log "
             f"page(s): open {export / 'index.html'}")
        return
    from runner.ui.server import serve

    serve(records, host, port, _say)


def cluster_ray_version(connection: ConnectionOptions, loaded: LoadedSpec) -> str | None:
    """The cluster's Ray version from its job API, or None when it does not answer (submitting will say why)."""
    from runner.client import jobs_api

    try:
        client = jobs_api.open_client(connection.resolve(loaded.spec.address, loaded.source_of("address")))
        return client.version().get("ray_version")
    except RayJobsError:
        return None


def register(app: typer.Typer) -> None:
    """Add the record commands to the ``rayjobs`` command."""
    app.command("runs")(runs)
    app.command()(show)
    app.command()(compare)
    app.command()(ui)

