"""The commands about spec files themselves, with no cluster: ``validate`` and ``schema``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from runner.cli.options import ValidateSetOption
from runner.cli.options import fail as _fail, say as _say
from runner.errors import ExitCode


def validate(
    spec_files: Annotated[list[str], typer.Argument(metavar="SPEC...", help="Spec files to check.",
                                                    show_default=False)],
    set_: ValidateSetOption = None,
) -> None:
    """Check spec files without contacting a cluster (exit code 2 if any is invalid)."""
    from jobs.errors import SpecError
    from jobs.loader import load_spec
    from runner.run.preflight import entrypoint_note

    failed = 0
    for spec_file in spec_files:
        try:
            loaded = load_spec(spec_file, set_ or [])
        except SpecError as exc:
            failed += 1
            typer.echo(str(exc), err=True)
            continue
        kind = f", workload {loaded.workload_kind}" if loaded.workload_kind else ""
        typer.echo(f"{spec_file}: ok ({loaded.spec.name}{kind})")
        if (note := entrypoint_note(loaded)) is not None:
            _say(f"warning: {spec_file}: {note}")
    raise typer.Exit(int(ExitCode.BAD_INPUT) if failed else 0)


def schema(
    workload: Annotated[Optional[str], typer.Option("--workload", metavar="KIND", help="Print the schema of this workload kind's "
                        "parameters instead (e.g. vision).", show_default=False)] = None,
    record: Annotated[bool, typer.Option("--record", help="Print the schema of a run record's run.json instead.")]
    = False,
) -> None:
    """Print the JSON Schema of a spec file (for editor validation of specs/*.yaml), or of a run record."""
    if record and workload is not None:
        _fail("--record and --workload name different schemas: give one of them", ExitCode.BAD_INPUT)
    if record:
        from rayjobs_agent.record_layout import json_schema

        typer.echo(json.dumps(json_schema(), indent=2))
        return
    try:
        document = schema_document(workload)
    except ValueError as exc:
        _fail(str(exc), ExitCode.BAD_INPUT)
    typer.echo(json.dumps(document, indent=2))


def schema_document(workload: str | None = None) -> dict:
    """The JSON Schema ``rayjobs schema`` prints: of a spec, or of workload ``workload``'s parameters.

    The documentation's spec reference is generated from this too, so editors and the docs never disagree.

    Raises:
        ValueError: an unknown workload kind, or one whose model cannot be loaded.
    """
    from jobs.spec import JobSpec
    from jobs.workload_kinds import workload_model

    if workload is None:
        document = JobSpec.model_json_schema()
        document["title"] = "rayjobs spec"
        return document
    return workload_model(workload).model_json_schema()


def register(app: typer.Typer) -> None:
    """Add the spec-file commands to the ``rayjobs`` command."""
    app.command()(validate)
    app.command()(schema)
