"""The names the client and the job share on the wire: job metadata keys, and the variables Ray hands a job.

Each is spelled here once (``tests/test_shared_declarations.py`` finds any other spelling). The job reads
them on the cluster, where only this package is shipped; the client writes them, importing them from here.
Standard library only: names, and the one way a JSON document becomes such a variable (:func:`ray_env_json`).
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

# What Ray's job manager hands every job's driver: its runtime_env (with the uploaded packages' URIs) and
# its metadata, under which Ray puts the submission id.
RAY_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
SUBMISSION_ID_KEY = "job_submission_id"
# A job id rayjobs takes from a user (a spec's submission_id, a queue order's job): it is also a key in the
# cluster's store and a folder's name in the run record, so it holds no "/" and nothing a shell would read.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"

# How a job's entrypoint runs under the run record's keeper (``supervisor.py``): this, then the quoted entrypoint.
RECORD_COMMAND = "python -m rayjobs_agent.supervisor --"
# The same wrapper in jobs an earlier rayjobs submitted (its module was then named record.py): read, never written.
# Such a job carries the agent's package of its own time, which has that module.
FORMER_RECORD_COMMANDS = ("python -m rayjobs_agent.record --",)

# The variables that carry a spec's checked sections to the job (JSON): its workload's parameters, its sweep, its
# tracking, what its run record keeps and where.
WORKLOAD_ENV_VAR = "RAYJOBS_WORKLOAD"
SWEEP_ENV_VAR = "RAYJOBS_SWEEP"
TRACKING_ENV_VAR = "RAYJOBS_TRACKING"
RECORD_ENV_VAR = "RAYJOBS_RECORD"
# And how a failed entrypoint is retried in place (rayjobs_agent/retries.py), and how long a silence makes a
# stall (rayjobs_agent/watch.py).
RETRY_ENV_VAR = "RAYJOBS_RETRY"
WATCH_ENV_VAR = "RAYJOBS_WATCH"
# Ray Train builds the callbacks this variable names in every TorchTrainer of the job: the agent's own are these.
TRAIN_CALLBACKS_ENV_VAR = "RAY_TRAIN_CALLBACKS"
PROGRESS_CALLBACK = "rayjobs_agent.train_hooks.progress_callback.ProgressCallback"
TRACKING_CALLBACK = "rayjobs_agent.train_hooks.tracking_callback.TrackingCallback"

# The notification targets in full (their URLs hold tokens): a variable every output masks.
NOTIFY_ENV_VAR = "RAYJOBS_NOTIFY_SECRET"

# Set on a job whose every submission is a new run (each run of a RayCronJob): its run folder is then named after
# its submission too (``record_layout.run_of_this_submission``), by the workload and by the record alike.
RUN_PER_SUBMISSION_ENV_VAR = "RAYJOBS_RUN_PER_SUBMISSION"

# Set on a job of a pipeline: the run folders of the jobs it runs after, as JSON ({name: folder}); and the same, one
# variable each, ``RAYJOBS_AFTER_<NAME>`` (the job's name in capitals, "-" as "_"), for a shell's entrypoint.
AFTER_ENV_VAR = "RAYJOBS_AFTER"

# Job metadata rayjobs adds to a submission.
METADATA_NAME = "rayjobs.name"
METADATA_SPEC_HASH = "rayjobs.spec_hash"
METADATA_SECRETS = "rayjobs.secret_env_vars"  # the spec's own secret_env_vars, comma-separated
METADATA_ATTEMPT = "rayjobs.attempt"  # a retried run's attempt number
METADATA_PARENT = "rayjobs.parent"  # and its first attempt's id
METADATA_RERUN_OF = "rayjobs.rerun_of"  # the run folder `rayjobs rerun` reran
METADATA_QUEUE = "rayjobs.queue"  # the cluster queue a job went through
METADATA_PRIORITY = "rayjobs.priority"
METADATA_ENQUEUES = "rayjobs.enqueues"  # on a queue's helper job: the queue it enters a job into
METADATA_QUEUED_ID = "rayjobs.queued_id"  # and that job's id
METADATA_AGENT_VERSION = "rayjobs.agent_version"  # on an order job: the code of the client's agent package
METADATA_PIPELINE = "rayjobs.pipeline"  # the pipeline run a job is part of

def job_config(environ: Any) -> dict[str, Any]:
    """The job config Ray hands every process of a job (its ``runtime_env`` and ``metadata``), read from
    ``environ``; empty when there is none or it does not read as one (a job must run whatever it holds)."""
    try:
        config = json.loads(environ.get(RAY_JOB_CONFIG_ENV_VAR) or "{}")
    except (ValueError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def job_metadata(environ: Any) -> dict[str, Any]:
    """The job's metadata from its job config (:func:`job_config`): its submission id and rayjobs' keys."""
    metadata = job_config(environ).get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def after_variable(name: str) -> str:
    """The variable that holds the run folder of job ``name``, for the jobs that run after it in a pipeline."""
    return f"{AFTER_ENV_VAR}_{name.upper().replace('-', '_')}"


def ray_env_json(document: Any) -> str:
    """``document`` as JSON for a variable that Ray sets: Ray expands ``$NAME`` in every variable's value on the
    cluster, and JSON's own escape for ``$`` reads back the same while leaving nothing to expand."""
    return json.dumps(document, sort_keys=True, default=str).replace("$", "\\u0024")


# Prices for ``rayjobs show``'s cost (per CPU core·hour and per GPU·hour, in the user's currency).
CPU_PRICE_ENV_VAR = "RAYJOBS_PRICE_CPU_HOUR"
GPU_PRICE_ENV_VAR = "RAYJOBS_PRICE_GPU_HOUR"

def wrapper_command(entrypoint: str) -> str | None:
    """The wrapper command ``entrypoint`` runs under (this rayjobs' or an earlier one's), or None: a job without it."""
    return next((command for command in (RECORD_COMMAND, *FORMER_RECORD_COMMANDS) if entrypoint.startswith(command)),
                None)

def user_entrypoint(entrypoint: str) -> str:
    """The spec's own entrypoint inside one that runs under the run record's keeper (any other as it is)."""
    command = wrapper_command(entrypoint)
    prefix = f"{command} "
    if command is None or not entrypoint.startswith(prefix):
        return entrypoint
    try:
        words = shlex.split(entrypoint[len(prefix):])
    except ValueError:
        return entrypoint
    return words[0] if len(words) == 1 else entrypoint


__all__ = ["CPU_PRICE_ENV_VAR", "GPU_PRICE_ENV_VAR", "AFTER_ENV_VAR", "METADATA_AGENT_VERSION", "METADATA_PIPELINE", "METADATA_ATTEMPT", "METADATA_ENQUEUES", "METADATA_NAME", "METADATA_PARENT", "METADATA_PRIORITY", "METADATA_QUEUE", "METADATA_QUEUED_ID", "METADATA_RERUN_OF", "METADATA_SECRETS", "METADATA_SPEC_HASH", "NOTIFY_ENV_VAR", "PROGRESS_CALLBACK", "RAY_JOB_CONFIG_ENV_VAR", "FORMER_RECORD_COMMANDS", "RECORD_COMMAND", "RECORD_ENV_VAR", "RETRY_ENV_VAR", "RUN_PER_SUBMISSION_ENV_VAR", "SUBMISSION_ID_KEY", "SWEEP_ENV_VAR", "TRACKING_CALLBACK", "TRACKING_ENV_VAR", "TRAIN_CALLBACKS_ENV_VAR", "WORKLOAD_ENV_VAR", "after_variable", "job_config", "job_metadata", "ray_env_json", "say", "user_entrypoint", "wrapper_command"]

# How every line rayjobs writes of its own begins: the client's on the terminal and the agent's in the job's log
# (which the follower shows among its own, apart from the job's output).
OWN_LINE_PREFIX = "rayjobs: "


def say(text: str, stream: Any = None) -> None:
    """Write one of rayjobs' own lines, ``rayjobs: text``, to ``stream`` (default: stderr, the job's log): the one
    way the agent says a line. A log that cannot be written is no reason to stop a job: nothing is raised."""
    try:
        out = stream if stream is not None else sys.stderr
        out.write(f"{OWN_LINE_PREFIX}{text}\n")
        out.flush()
    except Exception:  # noqa: BLE001 - a closed or full log must not fail the job
        pass
