"""The commands that read run records, with no cluster: ``runs``, ``show``, ``compare`` (and ``logs RUN``), and
what ``rerun`` checks and links before it submits."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobs.submission import DEFAULT_RECORD_PATH
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
    output: OutputOption = "text",
) -> None:
    """List the runs recorded in LOCATION, newest first (no cluster needed)."""
    from runner.runs.report import listed_run, runs_table
    from runner.runs.store import Folder, list_runs

    check_output(output)
    folder = Folder(location)
    found = list_runs(folder)
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
    from runner.runs.report import masked_record, show_text
    from runner.runs.store import Folder, read_run

    check_output(output)
    folder = Folder(run)
    document = masked_record(read_run(folder))
    typer.echo(json.dumps(document, indent=2) if output == "json" else show_text(folder, document))


def print_saved_log(run: str, tail: int | None) -> None:
    """``rayjobs logs RUN``: the driver log its record saved, every attempt in order (a line on stderr between)."""
    from runner.runs.report import masked_log
    from runner.runs.store import Folder, attempt_log, read_run

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
    from runner.runs.report import compare_plot, compare_table, listed_run
    from jobs.run_vocabulary import EventKind, kind_of
    from runner.runs.store import Folder, attempt_events, read_run

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


def checked_rerun(run: str, overrides: list[str], connection: ConnectionOptions, *, force: bool, continue_run: bool,
                  dry_run: bool) -> LoadedSpec:
    """The spec ``rayjobs rerun`` submits: what differs from the recorded run said (changed code refused
    without ``force``), the cluster's Ray version compared, and the old record told of the new run.

    Raises:
        BadInput: the record cannot be run again, or its code changed and ``force`` is not given.
    """
    from runner.runs.rerun import link_rerun, prepare_rerun, version_differences

    plan = prepare_rerun(run, overrides, continue_run=continue_run)
    if plan.code_changes and not force:
        raise BadInput(f"{'; '.join(plan.code_changes)}; the rerun would not run the recorded code. Restore it (the "
                       "record names its commit: rayjobs show RUN), or pass --force to run the code as it is now")
    warnings = [f"{change}; running the code as it is now (--force)" for change in plan.code_changes]
    warnings += plan.differences
    if not dry_run:
        warnings += version_differences(plan.document, _cluster_ray_version(connection, plan.loaded))
    for warning in warnings:
        _say(f"warning: {warning}")
    if plan.new_run_dir is None:
        _say(f"rerun: continuing the run in {plan.old_run_dir}" if continue_run
             else "rerun: a new run (its job keeps no record to link)")
    elif dry_run:
        _say(f"rerun: the new run would be {plan.new_run_dir} (rerun of {plan.old_run_dir})")
    else:
        problem = link_rerun(plan.old, plan.new_run_dir)
        _say(f"rerun: a new run in {plan.new_run_dir} (rerun of {plan.old_run_dir}" + (
            ", whose record now lists it)" if problem is None else
            f"); its record could not be told of it ({problem}), and the rerun goes ahead"))
    return plan.loaded


def _cluster_ray_version(connection: ConnectionOptions, loaded: LoadedSpec) -> str | None:
    """The cluster's Ray version from its job API, or None when it does not answer (submitting will say why)."""
    from runner.client.jobs_api import JobsApi

    try:
        client = JobsApi(connection.resolve(loaded.spec.address, loaded.source_of("address")), retry_for_s=0)
        return client.version().get("ray_version")
    except RayJobsError:
        return None


def register(app: typer.Typer) -> None:
    """Add the record commands to the ``rayjobs`` command."""
    app.command("runs")(runs)
    app.command()(show)
    app.command()(compare)

