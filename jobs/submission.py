"""What rayjobs sends to Ray for a spec: the keyword arguments of ``submit_job``."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.notify import job_notify_settings, notify_document
from jobs.provenance import code_provenance
from jobs.queueing import queue_metadata
from jobs.retry import retry_policy
from jobs.secrets import masked_runtime_env
from jobs.workload_contract import workload_needs
from rayjobs_agent import AGENT_PACKAGE_DIR
from rayjobs_agent.package import is_agent_module
from rayjobs_agent.record_layout import DEFAULT_RECORD_PATH, default_run_dir, run_of_this_submission
from rayjobs_agent.storage_location import uri_scheme
from rayjobs_agent.vocabulary import EVENT_MARKER
from rayjobs_agent.wire import (RAY_JOB_CONFIG_ENV_VAR, RUN_PER_SUBMISSION_ENV_VAR, SUBMISSION_ID_KEY, METADATA_NAME, METADATA_RERUN_OF, METADATA_SECRETS, METADATA_SPEC_HASH, NOTIFY_ENV_VAR,
                                PROGRESS_CALLBACK, RECORD_COMMAND, RECORD_ENV_VAR, RETRY_ENV_VAR, SWEEP_ENV_VAR,
                                TRACKING_CALLBACK, WATCH_ENV_VAR,
                                TRACKING_ENV_VAR, TRAIN_CALLBACKS_ENV_VAR, WORKLOAD_ENV_VAR, ray_env_json)

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec


# Left out of every working_dir upload: they are never needed on the cluster and can
# push an upload past the dashboard's size limit.
DEFAULT_EXCLUDES = [
    ".git", ".hg", ".venv", "venv", "env/", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", ".hypothesis", "*.egg-info", "node_modules", ".ipynb_checkpoints", ".tox", ".DS_Store",
]


# The agent beside every job (rayjobs_agent): shipped as a py_modules entry, so that any job's processes can import
# it by this name whatever its working_dir holds.
TRAIN_STATE_ENV_VAR = "RAY_TRAIN_ENABLE_STATE_TRACKING"
# Where a job keeps its record when its workload names no storage_path: the workloads' own default.
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


def build_submission(loaded: LoadedSpec, *, beside_agent: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``JobSubmissionClient.submit_job`` (runtime_env paths absolute).

    Args:
        loaded: a validated spec (``jobs.loader.load_spec``).
        beside_agent: run the entrypoint beside the agent (``rayjobs_agent.supervisor``, shipped with the job). Only
            an export that cannot ship it leaves it out, for a spec that keeps no record.

    Returns:
        The arguments, with the workload's parameters in ``runtime_env.env_vars``, rayjobs' default
        excludes added to a local working_dir, and metadata ``rayjobs.name`` and ``rayjobs.spec_hash``.
    """
    spec = loaded.spec
    runtime_env = spec.runtime_env.model_dump(exclude_none=True) if spec.runtime_env else {}
    if loaded.workload is not None:
        env_vars = runtime_env.setdefault("env_vars", {})
        env_vars[WORKLOAD_ENV_VAR] = ray_env_json({"kind": loaded.workload_kind,
                                                   **loaded.workload.model_dump(mode="json")})
        if spec.sweep is not None:
            env_vars[SWEEP_ENV_VAR] = ray_env_json(spec.sweep.model_dump(mode="json", exclude_none=True))
        if spec.tracking is not None and spec.tracking.mlflow is not None:
            env_vars[TRACKING_ENV_VAR] = ray_env_json(spec.tracking.model_dump(mode="json", exclude_none=True))
    ships_code = bool(local_runtime_paths(runtime_env))
    if loaded.workload is None and ships_code and spec.tracking is not None and spec.tracking.mlflow is not None:
        add_tracking_callback(runtime_env, spec.tracking.model_dump(mode="json", exclude_none=True))
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
    # Relative paths in a spec start at its folder (the working folder for a spec given as data).
    spec_dir = loaded.path.parent.resolve() if loaded.path else Path.cwd()
    metadata[METADATA_SPEC_HASH] = spec_hash(submission, spec_dir)
    if spec.secret_env_vars:
        metadata[METADATA_SECRETS] = ",".join(spec.secret_env_vars)
    metadata.update(queue_metadata(loaded))
    submission["metadata"] = metadata
    if not beside_agent and not keeps_record(loaded, ships_code):
        return submission
    # Every job runs beside the agent: it decides why an attempt failed and whether it runs again, whoever follows.
    run_under_agent(submission)
    if keeps_record(loaded, ships_code):
        add_run_record(submission, loaded, metadata[METADATA_SPEC_HASH])
    if spec.max_retries:
        submission["runtime_env"].setdefault("env_vars", {})[RETRY_ENV_VAR] = retry_policy(spec).to_variable()
    if spec.stall_after_s is not None:
        submission["runtime_env"].setdefault("env_vars", {})[WATCH_ENV_VAR] = ray_env_json(
            {"stall_after_s": spec.stall_after_s})
    return submission


def keeps_record(loaded: LoadedSpec, ships_code: bool) -> bool:
    """Whether the job keeps a run record: it uploads code, names where its record goes, or is queued.

    A job that uploads nothing and names no record_path keeps no record by default (there is no folder of
    its own to keep it in); the agent beside it still decides and says how it went. A queued job always
    keeps one: its record says how long it waited.
    """
    spec = loaded.spec
    return spec.record and (ships_code or spec.record_path is not None or spec.queue is not None)


def ship_agent_package(runtime_env: dict[str, Any]) -> None:
    """Add ``rayjobs_agent`` to the job's ``py_modules`` (once), whatever its working_dir holds."""
    modules = list(runtime_env.get("py_modules") or [])
    if not any(is_agent_module(module) for module in modules):
        runtime_env["py_modules"] = modules + [str(AGENT_PACKAGE_DIR)]


def run_under_agent(submission: dict[str, Any]) -> None:
    """Run the entrypoint under ``rayjobs_agent.supervisor`` (the agent's package, a few dozen KiB, is shipped with the
    job, once per cluster): it reads the job's output, decides why an attempt failed and whether it runs again,
    keeps the record when there is one, and gives a queued job's slot back the moment its entrypoint ends."""
    ship_agent_package(submission.setdefault("runtime_env", {}))
    submission["entrypoint"] = f"{RECORD_COMMAND} {shlex.quote(submission['entrypoint'])}"


def add_run_record(submission: dict[str, Any], loaded: LoadedSpec, hash_of_spec: str) -> None:
    """Have the job keep its run record: its entrypoint runs under ``rayjobs_agent.supervisor``, told where and what.

    The record's folder is the workload's run folder (``<storage_path>/<run_name>``) when it has one,
    else a folder under ``record_path`` named after the job. Secrets are masked in the spec it holds.
    When the progress channel is on, the keeper, not this client, installs the Ray Train callback
    (``progress`` in its config): it sees the cluster's Ray version before the entrypoint starts.
    """
    spec = loaded.spec
    runtime_env = submission.setdefault("runtime_env", {})
    config: dict[str, Any] = {
        "name": spec.name,
        "every_s": spec.record_every_s,
        "spec_hash": hash_of_spec,
        "spec": masked_runtime_env(resolved_spec(loaded), spec.secret_env_vars),
        "code": code_provenance(dict(local_runtime_paths(runtime_env)).get("working_dir")),
    }
    env_vars = runtime_env.setdefault("env_vars", {})
    named = [name.strip() for name in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "").split(",") if name.strip()]
    if PROGRESS_CALLBACK in named:
        # The keeper names the callback itself, on the cluster, once it knows the cluster's Ray is one the
        # callback is tested on; the job's own callbacks stay as the spec set them, first.
        config["progress"] = True
        named.remove(PROGRESS_CALLBACK)
        if named:
            env_vars[TRAIN_CALLBACKS_ENV_VAR] = ",".join(named)
        else:
            del env_vars[TRAIN_CALLBACKS_ENV_VAR]
    run_dir = workload_needs(loaded.workload).run_location
    if run_dir is not None:
        config["run_dir"] = run_dir
    else:
        config["base"] = spec.record_path or DEFAULT_RECORD_PATH
    rerun_of = (spec.metadata or {}).get(METADATA_RERUN_OF)
    if rerun_of:
        config["links"] = {"rerun_of": rerun_of}
    if spec.notify:  # the URLs' tokens travel in a variable every output masks; the record shows them masked
        config["notify"] = config["spec"]["notify"] = notify_document(spec.notify, masked=True)
        env_vars[NOTIFY_ENV_VAR] = job_notify_settings(spec.notify, spec.max_retries + 1)
    # Ray would expand the spec's `echo $API_TOKEN` on the cluster, and the record would hold the token.
    env_vars[RECORD_ENV_VAR] = ray_env_json(config)


def link_record(submission: dict[str, Any], links: dict[str, Any]) -> None:
    """Have the run record of ``submission`` (built by :func:`build_submission`) hold ``links`` among its fields:
    what this run is part of (``{"pipeline": …}``), written by the job as it writes ``run.json``. A job that keeps
    no record is left as it is."""
    env_vars = (submission.get("runtime_env") or {}).get("env_vars") or {}
    if RECORD_ENV_VAR not in env_vars:
        return
    config = json.loads(env_vars[RECORD_ENV_VAR])
    config["links"] = {**(config.get("links") or {}), **links}
    env_vars[RECORD_ENV_VAR] = ray_env_json(config)


def run_folder(loaded: LoadedSpec, job_id: str, *, per_submission: bool = False) -> str:
    """Where job ``job_id`` of this spec keeps its run (its record, and a workload's outputs): by the agent's own
    rules, so that the client can tell a job of a pipeline where the jobs it runs after keep theirs.

    ``per_submission``: the job runs with ``RAYJOBS_RUN_PER_SUBMISSION`` (each pipeline run is a run of its own).
    """
    run_dir = workload_needs(loaded.workload).run_location
    if run_dir is not None:
        environ = {RAY_JOB_CONFIG_ENV_VAR: json.dumps({"metadata": {SUBMISSION_ID_KEY: job_id}})}
        if per_submission:
            environ[RUN_PER_SUBMISSION_ENV_VAR] = "1"
        return run_of_this_submission(run_dir, environ)
    return default_run_dir({"base": loaded.spec.record_path or DEFAULT_RECORD_PATH, "name": loaded.spec.name},
                           {SUBMISSION_ID_KEY: job_id})


def resolved_spec(loaded: LoadedSpec) -> dict[str, Any]:
    """The spec as it ran: overrides applied, paths made absolute, defaults filled in (secrets not yet masked)."""
    document = loaded.spec.model_dump(mode="json", exclude_none=True)
    if loaded.workload is not None:
        document["workload"] = {"kind": loaded.workload_kind, **loaded.workload.model_dump(mode="json")}
    return document




def add_tracking_callback(runtime_env: dict[str, Any], tracking: dict[str, Any]) -> None:
    """Have Ray Train record every run of a user's own script in MLflow (``tracking``: the spec's block),
    through the agent's callback in the Train controller (validation refuses a spec that ships no code)."""
    ship_agent_package(runtime_env)
    env_vars = runtime_env.setdefault("env_vars", {})
    env_vars[TRACKING_ENV_VAR] = ray_env_json(tracking)
    callbacks = [name.strip() for name in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "").split(",") if name.strip()]
    if TRACKING_CALLBACK not in callbacks:
        env_vars[TRAIN_CALLBACKS_ENV_VAR] = ",".join(callbacks + [TRACKING_CALLBACK])


def add_progress_channel(runtime_env: dict[str, Any]) -> None:
    """Ship the progress channel with a job and have Ray Train build its callback in every ``TorchTrainer``.

    Only jobs that already upload code get it (a working_dir or py_modules): a job without code of
    its own has no training script to follow, and stays a request that needs no upload at all.
    Callbacks and a dedup pattern the spec sets are kept beside rayjobs' own. A job that keeps its run
    record has the callback moved into the record keeper's hands by :func:`add_run_record`; one that
    keeps none (``record: false``) names it here, and the callback then checks the Ray version itself.
    """
    ship_agent_package(runtime_env)
    env_vars = runtime_env.setdefault("env_vars", {})
    callbacks = [name.strip() for name in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "").split(",") if name.strip()]
    env_vars[TRAIN_CALLBACKS_ENV_VAR] = ",".join(callbacks + [PROGRESS_CALLBACK] * (PROGRESS_CALLBACK not in callbacks))
    # Ray Train then keeps each run's attempts and workers for the dashboard, which `rayjobs status` shows.
    env_vars.setdefault(TRAIN_STATE_ENV_VAR, "1")
    allowed = env_vars.get(DEDUP_ALLOW_ENV_VAR)
    if not allowed:
        env_vars[DEDUP_ALLOW_ENV_VAR] = EVENT_MARKER
    elif EVENT_MARKER not in allowed:
        env_vars[DEDUP_ALLOW_ENV_VAR] = f"(?:{allowed})|{EVENT_MARKER}"


def spec_hash(submission: dict[str, Any], spec_dir: Path | None = None) -> str:
    """A short, stable hash of what a submission would run (metadata excluded), wherever it was submitted from.

    What decides a run is hashed, not where its files sit: a local working_dir or py_modules entry counts
    by its content (Ray's own package hash: the files it would upload), and a path under ``spec_dir``
    (the spec's folder, where relative paths in the spec start) counts by its place in that folder. The
    same spec in two checkouts of one commit has one hash; a changed file gives another.
    """
    content = {key: value for key, value in submission.items() if key not in ("metadata", "submission_id")}
    if content.get("runtime_env"):
        content["runtime_env"] = _runtime_env_by_content(content["runtime_env"])
    text = json.dumps(content, sort_keys=True, default=str)
    if spec_dir is not None:
        text = _paths_relative_to(text, spec_dir)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _runtime_env_by_content(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with each local path that Ray uploads replaced by the hash of what it holds."""
    excludes = list(runtime_env.get("excludes") or [])
    local = dict(local_runtime_paths(runtime_env))
    result = dict(runtime_env)
    if local.get("working_dir"):
        result["working_dir"] = _content_hash(runtime_env["working_dir"], excludes)
    if runtime_env.get("py_modules"):
        result["py_modules"] = [module if uri_scheme(module) is not None else _content_hash(module, excludes)
                                for module in runtime_env["py_modules"]]
    return result


def _content_hash(path: str, excludes: list[str]) -> str:
    """``content:<hash>`` of a local folder (as Ray names its package) or file; the path itself if unreadable."""
    from jobs.infra import ray_internals

    local = Path(path)
    try:
        if local.is_dir():
            files: list[Path] = []

            def add(entry: Path) -> None:
                # Regular files only: opening a named pipe (or a device) would wait for a writer forever.
                if entry.is_file() and stat.S_ISREG(entry.stat().st_mode):
                    files.append(entry)

            # The files Ray would upload, walked as Ray walks them (excludes, .gitignore and .rayignore);
            # Ray names each .gitignore it leaves out at INFO: a hash is no upload, and says nothing.
            with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
                ray_internals.walk_upload(local, excludes, add)
            digest = hashlib.sha256()
            # In name order: the order a folder lists its entries in differs from one disk to another. Each file is
            # one record of its name's length, its name and its content's hash, so that no two folders read alike
            # (file "a" holding "b\0c" and files "a" and "b" would, were names and contents simply strung along).
            for entry in sorted(files, key=lambda item: item.relative_to(local).as_posix()):
                name = entry.relative_to(local).as_posix().encode()
                content = hashlib.sha256()
                with entry.open("rb") as handle:
                    while chunk := handle.read(1 << 20):
                        content.update(chunk)
                digest.update(len(name).to_bytes(8, "big") + name + content.digest())
            return "content:" + digest.hexdigest()[:32]
        if local.is_file():
            return "content:" + hashlib.sha256(local.read_bytes()).hexdigest()
    except OSError:
        pass
    # Missing or unreadable: the submission fails on it with Ray's own message; the hash needs no more.
    return path


def _paths_relative_to(text: str, spec_dir: Path) -> str:
    """``text`` (JSON, possibly holding JSON in its strings) with the spec folder's path in any path under it
    replaced by ``<spec-dir>``."""
    plain = str(spec_dir)
    once = json.dumps(plain)[1:-1]
    forms = sorted({plain, once, json.dumps(once)[1:-1]}, key=len, reverse=True)
    # Only a whole folder name: /work/a is not the start of /work/ab.
    pattern = re.compile("(?:" + "|".join(map(re.escape, forms)) + r')(?=[/\\"])')
    return pattern.sub("<spec-dir>", text)
