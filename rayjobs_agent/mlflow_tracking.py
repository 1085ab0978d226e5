"""What every writer of a job's MLflow runs shares: the spec's settings, the run's parameters and tags, and the
requests that open a run and log metrics.

Two writers use it: the built-in workloads (``workloads/ray_train/tracking.py``) and, for a user's own
Ray Train script, the callback in the Train controller (:mod:`.train_hooks.tracking_callback`). It runs on the
cluster without the rest of rayjobs, so it needs the standard library alone: MLflow's client is
imported inside the calls that use it, and a cluster without it is said once by the caller.
"""

from __future__ import annotations

import json
import os
import time
import re
from collections.abc import Mapping
from typing import Any

from .masking import environment_mask
from .wire import (METADATA_ATTEMPT, METADATA_SPEC_HASH, RECORD_ENV_VAR, SUBMISSION_ID_KEY, TRACKING_ENV_VAR,
                   job_metadata)

RUN_DIR_TAG = "rayjobs.run_dir"
# MLflow's client retries a failed request for minutes by default; a job must not wait on it that long.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
PARAM_CHARS = 6000  # MLflow's limit on a parameter's value
# What MLflow refuses in a metric's name (it takes letters, digits, "_", "-", ".", " ", ":" and "/"): such a
# character becomes "_", so that `acc@1` is recorded as `acc_1` rather than the whole report refused.
_UNSAFE_METRIC_CHARS = re.compile(r"[^\w.\- :/]")
# Metrics kept for a server that does not answer, oldest given up first beyond it (a long outage of a long run).
MAX_PENDING = 10_000
_BATCH = 100  # MLflow's limit on parameters per request
# The job's metadata a run is tagged with, under the same names (its submission id under one of rayjobs').
_JOB_METADATA_TAGS = ((METADATA_SPEC_HASH, METADATA_SPEC_HASH), (SUBMISSION_ID_KEY, "rayjobs.submission_id"),
                      (METADATA_ATTEMPT, METADATA_ATTEMPT))


def mlflow_settings(environ: Mapping[str, str] = os.environ) -> dict[str, str] | None:
    """``tracking.mlflow`` of the job's spec (``tracking_uri``, ``experiment``), or None when it tracks nothing."""
    encoded = environ.get(TRACKING_ENV_VAR)
    if not encoded:
        return None
    return (json.loads(encoded) or {}).get("mlflow")


def flat_params(document: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.1}}`` as ``{"train.lr": "0.1"}``: MLflow's parameters are flat text."""
    flat: dict[str, str] = {}
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, name + "."))
        elif isinstance(value, (list, bool)) or value is None:
            flat[name] = json.dumps(value, default=str)[:PARAM_CHARS]
        else:
            flat[name] = str(value)[:PARAM_CHARS]
    return flat


def job_tags(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What Ray and rayjobs tell the job about itself: spec hash, submission id, attempt, git commit."""
    tags: dict[str, str] = {}
    metadata = job_metadata(environ)
    try:
        record = json.loads(environ.get(RECORD_ENV_VAR) or "{}")
    except (ValueError, AttributeError):
        return tags
    for key, tag in _JOB_METADATA_TAGS:
        if metadata.get(key):
            tags[tag] = str(metadata[key])
    commit = ((record.get("code") or {}).get("git") or {}).get("commit")
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def mlflow_client(settings: Mapping[str, str]) -> Any:
    """MLflow's client of the spec's server, with requests that give up in seconds rather than minutes.

    Raises:
        ImportError: MLflow is not installed where this runs.
    """
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(settings["tracking_uri"])


def open_run(client: Any, settings: Mapping[str, str], run_dir: str, name: str, params: Mapping[str, Any],
             tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
    """The id of the MLflow run of ``run_dir``: continued when an earlier attempt made one (found by its
    ``rayjobs.run_dir`` tag), else created, in the spec's experiment (made when missing)."""
    from mlflow.entities import Param

    experiment = client.get_experiment_by_name(settings["experiment"])
    experiment_id = (experiment.experiment_id if experiment is not None
                     else client.create_experiment(settings["experiment"]))
    tags = {RUN_DIR_TAG: run_dir, **tags}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'", max_results=1)
    if found:
        run = found[0]
        client.update_run(run.info.run_id, status="RUNNING")
        for key, value in tags.items():
            client.set_tag(run.info.run_id, key, value)
        print(f"MLflow: continuing run {run.info.run_id} of experiment {settings['experiment']!r}", flush=True)
    else:
        run = client.create_run(experiment_id, run_name=name, tags=tags)
        print(f"MLflow: run {run.info.run_id} in experiment {settings['experiment']!r} at {settings['tracking_uri']}",
              flush=True)
    logged = run.data.params if found else {}
    # A parameter cannot change in MLflow: a continued run keeps the values it started with. Its values are masked
    # as the job's log is (a train_loop_config may carry a token, an s3:// URL its password).
    mask = environment_mask(os.environ)
    new = [Param(key, mask.mask_text(value)) for key, value in flat_params(params).items() if key not in logged]
    for start in range(0, len(new), _BATCH):
        client.log_batch(run.info.run_id, params=new[start:start + _BATCH])
    return run.info.run_id


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics MLflow can take: numbers (a tensor's or array's single value too), never booleans, under names
    MLflow accepts."""
    numbers = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
            continue
        try:
            numbers[_UNSAFE_METRIC_CHARS.sub("_", str(key))] = float(value)
        except (TypeError, ValueError):  # a tensor of many values, or text that looks like an object
            continue
    return numbers


def refused_for_good(exc: BaseException) -> bool:
    """Whether MLflow refused a request for what it held (4xx but 429): sending it again would be refused again."""
    status = getattr(exc, "get_http_status_code", lambda: None)()
    return isinstance(status, int) and 400 <= status < 500 and status != 429


def send_pending(client: Any, run_id: str, pending: list[dict[str, Any]]) -> list[str]:
    """Log each ``{"metrics": {...}, "step": n}`` of ``pending`` in order, removing each once sent.

    A report MLflow refuses for good (a value or name it does not take) is dropped, so that it cannot hold
    back every report after it; a report that could not be sent for now stays first and raises. Beyond
    :data:`MAX_PENDING` reports, the oldest are given up. Returns why each dropped report was dropped.
    """
    from mlflow.entities import Metric

    dropped = [f"step {entry.get('step')}: more than {MAX_PENDING} reports waited for the server"
               for entry in pending[:-MAX_PENDING]]
    del pending[:-MAX_PENDING]
    now = int(time.time() * 1000)
    while pending:
        entry = pending[0]
        try:
            client.log_batch(run_id, metrics=[Metric(key, value, now, entry["step"])
                                              for key, value in entry["metrics"].items()])
        except Exception as exc:
            if not refused_for_good(exc):
                raise
            dropped.append(f"step {entry.get('step')}: {first_line(exc)}")
        pending.pop(0)
    return dropped


def first_line(exc: BaseException) -> str:
    """An exception in one short line, for a message in the job's log."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
