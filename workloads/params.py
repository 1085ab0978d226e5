"""How a workload receives the parameters of its spec's ``workload`` section.

rayjobs validates the section on the client, then hands it to the job as JSON in
the ``RAYJOBS_WORKLOAD`` environment variable (set through ``runtime_env.env_vars``).
A workload can also be run by hand with ``--params FILE`` (YAML or JSON). Parameters that
are not valid are :class:`jobs.errors.BadInput`: the entry point exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

from pydantic import BaseModel, BeforeValidator

from rayjobs_agent.wire import SWEEP_ENV_VAR, WORKLOAD_ENV_VAR
from rayjobs_agent.record_layout import run_of_this_submission
from jobs.paths import SPEC_DIR_CONTEXT_KEY, refuse_uri
from jobs.errors import BadInput

if TYPE_CHECKING:
    from jobs.sweep import SweepSpec

ModelT = TypeVar("ModelT", bound=BaseModel)

# A model's ``weights``: a local path or a word the workload knows ('none', 'imagenet', a hub id), never a
# URI. The workers read weights from their own disk, so an s3:// address would fail there, after the job
# started; refused when the spec is checked instead, in every workload that loads weights.
LocalWeights = Annotated[str, BeforeValidator(refuse_uri)]


def load_params(model: type[ModelT], params_file: str | Path | None = None) -> ModelT:
    """Return the workload's parameters: from ``params_file`` if given, else from
    ``$RAYJOBS_WORKLOAD``, else the model's defaults."""
    if params_file is not None:
        text = Path(params_file).read_text(encoding="utf-8")
        if str(params_file).endswith((".yaml", ".yml")):
            import yaml

            raw = yaml.safe_load(text) or {}
        else:
            raw = json.loads(text)
        # A params file may be a whole spec: take its workload section.
        if isinstance(raw, dict) and "entrypoint" in raw and "workload" in raw:
            raw = raw["workload"]
        return model.model_validate(_without_kind(raw), context={SPEC_DIR_CONTEXT_KEY: Path(params_file).parent})
    encoded = os.environ.get(WORKLOAD_ENV_VAR)
    params = model.model_validate(_without_kind(json.loads(encoded)) if encoded else {})
    run_name = getattr(params, "run_name", None)
    if isinstance(run_name, str):
        # Each run of a schedule is a new run, its folder named after its submission (the record's folder too).
        params = params.model_copy(update={"run_name": run_of_this_submission(run_name, os.environ)})
    return params


def load_sweep() -> SweepSpec | None:
    """The spec's checked ``sweep`` block from ``$RAYJOBS_SWEEP`` (None when the job runs no sweep)."""
    from jobs.sweep import SweepSpec

    encoded = os.environ.get(SWEEP_ENV_VAR)
    if not encoded:
        return None
    from pydantic import ValidationError

    try:
        return SweepSpec.model_validate(json.loads(encoded))
    except (ValidationError, ValueError) as exc:
        raise BadInput(f"invalid sweep in ${SWEEP_ENV_VAR}: {exc}") from None


def _without_kind(raw: object) -> object:
    # ``kind`` picks the parameter model; it is not one of the parameters.
    if isinstance(raw, dict):
        return {key: value for key, value in raw.items() if key != "kind"}
    return raw


def add_params_argument(parser: argparse.ArgumentParser) -> None:
    """Add the ``--params FILE`` option every workload entry point accepts."""
    parser.add_argument(
        "--params",
        metavar="FILE",
        default=None,
        help=f"YAML/JSON file with the workload parameters (default: ${WORKLOAD_ENV_VAR}, set by rayjobs)",
    )


def read_params(model: type[ModelT], params_file: str | Path | None, workload: str) -> ModelT:
    """:func:`load_params` for a workload's entry point: any problem becomes one :class:`BadInput` line
    naming the fields, for :func:`workloads.entry.workload_main` to print before the program exits 2."""
    from pydantic import ValidationError

    try:
        return load_params(model, params_file)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'workload'}: {e['msg']}" for e in exc.errors())
        raise BadInput(f"invalid {workload} parameters: {problems}") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read the {workload} parameters: {exc}") from None


def parse_command_line(model: type[ModelT], workload: str, prog: str, description: str,
                       argv: list[str] | None = None) -> ModelT:
    """Read ``[--params FILE]`` from the command line and return the validated parameters.

    Raises :class:`BadInput` naming the fields when the parameters are not valid; a bad flag
    ends the program as argparse does (exit status 2).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_params_argument(parser)
    return read_params(model, parser.parse_args(argv).params, workload)
