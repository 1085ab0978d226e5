"""``rayjobs rerun RUN``: the spec a run recorded, checked against the code that is in its working_dir now."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.errors import SpecError
from jobs.secrets import MASK
from runner.errors import BadInput
from runner.runs.store import Folder, read_run

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec


def recorded_spec(run: str, overrides: list[str], *, force: bool) -> tuple[LoadedSpec, str | None]:
    """The validated spec recorded in ``run``'s ``run.json``, ``--set`` overrides applied, and a warning or None.

    Secrets were masked in the record; their values come from this shell's environment, by name.

    Raises:
        BadInput: a secret's variable is not set here; the recorded spec no longer validates; or the
            working_dir's code is not what the run ran (unless ``force``, which makes that the warning).
    """
    from jobs.loader import validate_spec_data

    folder = Folder(run)
    document = read_run(folder)
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise BadInput(f"the record at {folder.location} holds no spec to run again")
    env_vars = (spec.get("runtime_env") or {}).get("env_vars") or {}
    masked_names = sorted(name for name, value in env_vars.items() if value == MASK)
    missing = [name for name in masked_names if name not in os.environ]
    if missing:
        raise BadInput(f"the record keeps no secrets: set {', '.join(missing)} in this shell's environment (their "
                       f"values go to the job as the original run's did), then run `rayjobs rerun {run}` again")
    for name in masked_names:
        env_vars[name] = os.environ[name]
    try:
        loaded = validate_spec_data(spec, None, None, overrides)
    except SpecError as exc:
        raise BadInput(f"the spec recorded at {folder.location} is not valid here (a path it names may be gone, "
                       f"or this rayjobs may read specs differently): {exc}") from None
    problem = code_change(document, loaded)
    if problem is None:
        return loaded, None
    if not force:
        raise BadInput(f"{problem}; the rerun would not run the recorded code. Restore it (the record names its "
                       "commit: rayjobs show RUN), or pass --force to run the code as it is now")
    return loaded, f"{problem}; running the code as it is now (--force)"


def code_change(document: dict[str, Any], loaded: LoadedSpec) -> str | None:
    """What differs between the working_dir a run recorded and the one now, or None when it is the same code."""
    from jobs import ray_internals
    from jobs.provenance import code_provenance
    from jobs.submission import build_submission, local_runtime_paths

    recorded = (document.get("code") or {}).get("working_dir_package")
    submission = build_submission(loaded)
    working_dir = dict(local_runtime_paths(submission.get("runtime_env") or {})).get("working_dir")
    if not recorded or not working_dir:
        return None
    if not Path(working_dir).is_dir():
        return f"the working_dir {working_dir} the run uploaded is gone"
    excludes = ray_internals.default_working_dir_excludes() + list(submission["runtime_env"].get("excludes") or [])
    with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
        current = ray_internals.package_name(Path(working_dir), excludes)
    if current == recorded:
        return None
    then = (document.get("code") or {}).get("git") or {}
    now = code_provenance(working_dir).get("git") or {}
    detail = ""
    if then.get("commit") and now.get("commit"):
        detail = (f" (recorded: commit {then['commit'][:12]}{' with changes' if then.get('dirty') else ''}; now: commit "
                  f"{now['commit'][:12]}{' with changes' if now.get('dirty') else ''})")
    return f"the code in {working_dir} has changed since the run: its package is {current}, the run's was {recorded}" \
           f"{detail}"
