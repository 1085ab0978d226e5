"""What rayjobs sends to Ray for a spec: the keyword arguments of ``submit_job``."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.keys import (EVENT_MARKER, METADATA_NAME, METADATA_SECRETS, METADATA_SPEC_HASH, RECORD_ENV_VAR,
                       SWEEP_ENV_VAR, TRACKING_ENV_VAR, WORKLOAD_ENV_VAR)
from jobs.object_store import uri_scheme
from jobs.provenance import code_provenance
from jobs.secrets import masked_runtime_env
from jobs.workload_contract import workload_needs

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec


# Left out of every working_dir upload: they are never needed on the cluster and can
# push an upload past the dashboard's size limit.
DEFAULT_EXCLUDES = [
    ".git", ".hg", ".venv", "venv", "env/", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", ".hypothesis", "*.egg-info", "node_modules", ".ipynb_checkpoints", ".tox", ".DS_Store",
]


# The progress channel (workloads/rayjobs_observe): shipped as a py_modules entry, so that any job's
# processes can import it by this name whatever its working_dir holds.
OBSERVE_PACKAGE_DIR = Path(__file__).resolve().parents[1] / "workloads" / "rayjobs_observe"
OBSERVE_CALLBACK = "rayjobs_observe.train_callback.ProgressCallback"
TRAIN_CALLBACKS_ENV_VAR = "RAY_TRAIN_CALLBACKS"
TRAIN_STATE_ENV_VAR = "RAY_TRAIN_ENABLE_STATE_TRACKING"
# The run record's keeper, which runs the spec's entrypoint (see workloads/rayjobs_observe/record.py).
RECORD_COMMAND = "python -m rayjobs_observe.record --"
# Where a job keeps its record when its workload names no storage_path: the workloads' own default.
DEFAULT_RECORD_PATH = "~/rayjobs-results"
# Ray folds alike lines from different processes of a job into one; an event must never be folded.
DEDUP_ALLOW_ENV_VAR = "RAY_DEDUP_LOGS_ALLOW_REGEX"


def local_runtime_paths(runtime_env: dict[str, Any]) -> list[tuple[str, str]]:
    """The runtime_env entries that name local paths, as ``(field, path)``: what must be packaged and uploaded.

    Any URI (``s3://``, ``gs://``, ``https://…zip``, ``file://…zip``) is already where Ray fetches it from.
    """
    found = []
    working_dir = runtime_env.get("working_dir")
    if working_dir and uri_scheme(working_dir) is None:
        found.append(("working_dir", working_dir))
    found += [("py_modules", module) for module in runtime_env.get("py_modules") or [] if uri_scheme(module) is None]
    return found


def build_submission(loaded: LoadedSpec) -> dict[str, Any]:
    """Keyword arguments for ``JobSubmissionClient.submit_job`` (runtime_env paths absolute).

    Args:
        loaded: a validated spec (``jobs.loader.load_spec``).

    Returns:
        The arguments, with the workload's parameters in ``runtime_env.env_vars``, rayjobs' default
        excludes added to a local working_dir, and metadata ``rayjobs.name`` and ``rayjobs.spec_hash``.
    """
    spec = loaded.spec
    runtime_env = spec.runtime_env.model_dump(exclude_none=True) if spec.runtime_env else {}
    if loaded.workload is not None:
        env_vars = runtime_env.setdefault("env_vars", {})
        env_vars[WORKLOAD_ENV_VAR] = json.dumps(
            {"kind": loaded.workload_kind, **loaded.workload.model_dump(mode="json")}, sort_keys=True
        )
        if spec.sweep is not None:
            env_vars[SWEEP_ENV_VAR] = json.dumps(spec.sweep.model_dump(mode="json", exclude_none=True),
                                                 sort_keys=True)
        if spec.tracking is not None and spec.tracking.mlflow is not None:
            env_vars[TRACKING_ENV_VAR] = json.dumps(spec.tracking.model_dump(mode="json", exclude_none=True),
                                                    sort_keys=True)
    ships_code = bool(local_runtime_paths(runtime_env))
    if ships_code and spec.progress:
        add_progress_channel(runtime_env)
    if dict(local_runtime_paths(runtime_env)).get("working_dir"):
        excludes = list(runtime_env.get("excludes", []))
        runtime_env["excludes"] = excludes + [pattern for pattern in DEFAULT_EXCLUDES if pattern not in excludes]
    submission: dict[str, Any] = {
        "entrypoint": spec.entrypoint,
        "runtime_env": runtime_env or None,
        "submission_id": spec.submission_id,
        "entrypoint_num_cpus": spec.entrypoint_num_cpus,
        "entrypoint_num_gpus": spec.entrypoint_num_gpus,
        "entrypoint_memory": spec.entrypoint_memory,
        "entrypoint_resources": spec.entrypoint_resources,
        "entrypoint_label_selector": spec.entrypoint_label_selector,
    }
    submission = {key: value for key, value in submission.items() if value is not None}
    metadata = dict(spec.metadata or {})
    metadata[METADATA_NAME] = spec.name
    metadata[METADATA_SPEC_HASH] = spec_hash(submission)
    if spec.secret_env_vars:
        metadata[METADATA_SECRETS] = ",".join(spec.secret_env_vars)
    submission["metadata"] = metadata
    if ships_code and spec.record:
        add_run_record(submission, loaded, metadata[METADATA_SPEC_HASH])
    return submission


def ship_observe_package(runtime_env: dict[str, Any]) -> None:
    """Add ``workloads/rayjobs_observe`` to the job's ``py_modules`` (once), whatever its working_dir holds."""
    modules = list(runtime_env.get("py_modules") or [])
    if str(OBSERVE_PACKAGE_DIR) not in modules:
        runtime_env["py_modules"] = modules + [str(OBSERVE_PACKAGE_DIR)]


def add_run_record(submission: dict[str, Any], loaded: LoadedSpec, hash_of_spec: str) -> None:
    """Have the job keep its run record: its entrypoint runs under ``rayjobs_observe.record``, told where and what.

    The record's folder is the workload's run folder (``<storage_path>/<run_name>``) when it has one,
    else a folder under ``record_path`` named after the job. Secrets are masked in the spec it holds.
    """
    spec = loaded.spec
    runtime_env = submission["runtime_env"]
    ship_observe_package(runtime_env)
    config: dict[str, Any] = {
        "name": spec.name,
        "every_s": spec.record_every_s,
        "spec_hash": hash_of_spec,
        "spec": masked_runtime_env(resolved_spec(loaded), spec.secret_env_vars),
        "code": code_provenance(dict(local_runtime_paths(runtime_env)).get("working_dir")),
    }
    run_dir = workload_needs(loaded.workload).run_location
    if run_dir is not None:
        config["run_dir"] = run_dir
    else:
        config["base"] = spec.record_path or DEFAULT_RECORD_PATH
    runtime_env.setdefault("env_vars", {})[RECORD_ENV_VAR] = json.dumps(config, sort_keys=True, default=str)
    submission["entrypoint"] = f"{RECORD_COMMAND} {shlex.quote(submission['entrypoint'])}"


def user_entrypoint(entrypoint: str) -> str:
    """The spec's own entrypoint inside one that runs under the run record's keeper (any other as it is)."""
    prefix = RECORD_COMMAND + " "
    if not entrypoint.startswith(prefix):
        return entrypoint
    try:
        words = shlex.split(entrypoint[len(prefix):])
    except ValueError:
        return entrypoint
    return words[0] if len(words) == 1 else entrypoint


def resolved_spec(loaded: LoadedSpec) -> dict[str, Any]:
    """The spec as it ran: overrides applied, paths made absolute, defaults filled in (secrets not yet masked)."""
    document = loaded.spec.model_dump(mode="json", exclude_none=True)
    if loaded.workload is not None:
        document["workload"] = {"kind": loaded.workload_kind, **loaded.workload.model_dump(mode="json")}
    return document




def add_progress_channel(runtime_env: dict[str, Any]) -> None:
    """Ship the progress channel with a job and have Ray Train build its callback in every ``TorchTrainer``.

    Only jobs that already upload code get it (a working_dir or py_modules): a job without code of
    its own has no training script to follow, and stays a request that needs no upload at all.
    Callbacks and a dedup pattern the spec sets are kept beside rayjobs' own.
    """
    ship_observe_package(runtime_env)
    env_vars = runtime_env.setdefault("env_vars", {})
    callbacks = [name.strip() for name in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "").split(",") if name.strip()]
    env_vars[TRAIN_CALLBACKS_ENV_VAR] = ",".join(callbacks + [OBSERVE_CALLBACK] * (OBSERVE_CALLBACK not in callbacks))
    # Ray Train then keeps each run's attempts and workers for the dashboard, which `rayjobs status` shows.
    env_vars.setdefault(TRAIN_STATE_ENV_VAR, "1")
    allowed = env_vars.get(DEDUP_ALLOW_ENV_VAR)
    if not allowed:
        env_vars[DEDUP_ALLOW_ENV_VAR] = EVENT_MARKER
    elif EVENT_MARKER not in allowed:
        env_vars[DEDUP_ALLOW_ENV_VAR] = f"(?:{allowed})|{EVENT_MARKER}"


def spec_hash(submission: dict[str, Any]) -> str:
    """A short, stable hash of what a submission would run (metadata excluded)."""
    content = {key: value for key, value in submission.items() if key not in ("metadata", "submission_id")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def should_retry(info: dict[str, Any], retry_on: list[str]) -> bool:
    """Whether a FAILED job's error matches the spec's ``retry_on`` list.

    Args:
        info: the job's record (``error_type``, ``driver_exit_code``).
        retry_on: Ray error types, or ``exit_code:N`` for a driver that exited with N.

    Returns:
        True if the failure should be submitted again.
    """
    error_type = info.get("error_type") or ""
    if error_type in retry_on:
        return True
    exit_code = info.get("driver_exit_code")
    return error_type == "JOB_ENTRYPOINT_COMMAND_ERROR" and exit_code is not None and \
        f"exit_code:{exit_code}" in retry_on
