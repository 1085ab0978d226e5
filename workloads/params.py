"""How a workload receives the parameters of its spec's ``workload`` section.

rayjobs validates the section on the client, then hands it to the job as JSON in
the ``RAYJOBS_WORKLOAD`` environment variable (set through ``runtime_env.env_vars``).
A workload can also be run by hand with ``--params FILE`` (YAML or JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from jobs.keys import WORKLOAD_ENV_VAR
from jobs.ray_env import prepare_ray_env

ModelT = TypeVar("ModelT", bound=BaseModel)


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
        return model.model_validate(_without_kind(raw), context={"spec_dir": Path(params_file).parent})
    encoded = os.environ.get(WORKLOAD_ENV_VAR)
    if encoded:
        return model.model_validate(_without_kind(json.loads(encoded)))
    return model.model_validate({})


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
    """:func:`load_params` for a workload's entry point: any problem becomes one ``ValueError`` line
    naming the fields, for the program to print before it exits 2."""
    from pydantic import ValidationError

    try:
        return load_params(model, params_file)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'workload'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid {workload} parameters: {problems}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the {workload} parameters: {exc}") from None


def connect_to_cluster() -> None:
    """``ray.init()`` on loopback-safe settings: inside a Ray job RAY_ADDRESS names the job's
    cluster; a workload run by hand starts a local one."""
    import ray

    prepare_ray_env()
    ray.init()


def parse_command_line(model: type[ModelT], workload: str, prog: str, description: str,
                       argv: list[str] | None = None) -> ModelT:
    """Read ``[--params FILE]`` from the command line and return the validated parameters.

    Parameters that are not valid end the program as a bad flag does: one ``error:`` line
    naming the fields, exit status 2.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_params_argument(parser)
    args = parser.parse_args(argv)
    try:
        return read_params(model, args.params, workload)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")


def run_on_cluster(work, user_errors: tuple[type[BaseException], ...]) -> int:
    """Connect to the cluster, call ``work()`` and disconnect; 0 when it returns, 1 (after one
    ``error:`` line) when it raises one of ``user_errors``."""
    import ray

    connect_to_cluster()
    try:
        work()
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        ray.shutdown()
    return 0
