"""The run record's layout: the names in a run's folder, and ``run.json``'s fields, version and JSON Schema.

The job writes the record (``recorder.py``) and the client reads it (``runner/records``); both take its
names from here, and ``rayjobs schema --record`` prints
the schema built from the same field list. Standard library only: it ships to the cluster alone.

``schema_version`` is ``MAJOR.MINOR``. A minor version adds fields and never changes one, so a reader
keeps and ignores what it does not know; a new major version changes what a field means, and a
reader of an older major says so rather than misread it. A record without ``schema_version``
(written before it existed) has the layout of 1.0 less that field.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple

from .wire import METADATA_PARENT as PARENT_KEY
from .wire import RECORD_ENV_VAR, job_metadata, RUN_PER_SUBMISSION_ENV_VAR, SUBMISSION_ID_KEY

# Where a spec with neither record_path nor storage_path keeps its runs (on the node that runs the job).
DEFAULT_RECORD_PATH = "~/rayjobs-results"
RUN_FILE = "run.json"
RECORD_DIR = "run-record"
LOGS_FOLDER = f"{RECORD_DIR}/logs"
EVENTS_FOLDER = f"{RECORD_DIR}/events"
STACKS_FOLDER = f"{RECORD_DIR}/stacks"
LOG_PART_SUFFIX = ".log"
EVENT_PART_SUFFIX = ".jsonl"

SCHEMA_VERSION = "1.3"
SCHEMA_VERSION_FIELD = "schema_version"
# ``format`` predates ``schema_version``; it is still written so that records read the same to older readers.
FORMAT_FIELD = "format"
FORMAT_VERSION = 1
ATTEMPTS_FIELD = "attempts"
RERUN_OF_FIELD = "rerun_of"
RERUNS_FIELD = "reruns"
PIPELINE_FIELD = "pipeline"


def default_run_dir(config: Mapping[str, Any], job_metadata: Mapping[str, Any]) -> str:
    """``<base>/<name>-<first submission id>`` for a job whose workload names no run folder: a retried attempt
    (``rayjobs.parent``) joins the first one's folder."""
    first = job_metadata.get(PARENT_KEY) or job_metadata.get(SUBMISSION_ID_KEY) or f"local-{os.getpid()}"
    return f"{str(config['base']).rstrip('/')}/{config.get('name') or 'job'}-{first}"


def run_of_this_submission(name: str, environ: Mapping[str, str]) -> str:
    """A run's name (or folder) as this submission keeps it: ``NAME-<submission id>`` for a job whose every
    submission is a new run (``RAYJOBS_RUN_PER_SUBMISSION``: each run of a RayCronJob), else ``name`` itself.

    The workload names its run folder and the record keeper its record's folder by this one rule, so the two
    stay one folder, and no scheduled run resumes (or overwrites) another's.
    """
    if environ.get(RUN_PER_SUBMISSION_ENV_VAR) != "1":
        return name
    metadata = job_metadata(environ)
    # A retried attempt (the keeper's next one, after a loss) goes on in its first attempt's folder, as the record does.
    submission = str(metadata.get(PARENT_KEY) or metadata.get(SUBMISSION_ID_KEY) or "")
    return f"{name.rstrip('/')}-{submission}" if submission else name


class Field(NamedTuple):
    """One field of ``run.json``: its name, the JSON types it may hold, and what it says."""

    name: str
    types: tuple[str, ...]
    description: str


ATTEMPT_FIELDS = (
    Field("submission_id", ("string",), "Ray's submission id of this attempt"),
    Field("attempt", ("integer",), "the attempt's number within its run, from 1"),
    Field("host", ("string", "null"), "the node its driver ran on"),
    Field("spec_hash", ("string", "null"), "the hash of the spec this attempt ran"),
    Field("started", ("number",), "Unix seconds"),
    Field("updated", ("number",), "Unix seconds of its last upload"),
    Field("ended", ("number", "null"), "Unix seconds; null while it runs"),
    Field("status", ("string",), "RUNNING, SUCCEEDED, FAILED or STOPPED"),
    Field("exit_code", ("integer", "null"), "the entrypoint's exit code; negative for a signal"),
    Field("log_bytes", ("integer",), "bytes of driver log kept"),
    Field("log_parts", ("integer",), f"parts of {LOGS_FOLDER}/<submission_id>/"),
    Field("events", ("integer",), "progress events seen"),
    Field("event_parts", ("integer",), f"parts of {EVENTS_FOLDER}/<submission_id>/"),
    Field("cause", ("object", "null"), "why it failed, as the agent decided: cause, text, advice, evidence, retryable "
                                       "(1.1)"),
    Field("resources", ("object",), "what its processes used, summed over its samples: samples, seconds, "
                                    "cpu_core_s, gpu_s, peak_rss_bytes, peak_gpu_mem_bytes, cpu_sum, gpu_util_sum, "
                                    "gpu_samples, data_wait_s, epoch_s (1.2)"),
)

RUN_FIELDS = (
    Field(SCHEMA_VERSION_FIELD, ("string",), "MAJOR.MINOR of this layout; absent in records written before it"),
    Field(FORMAT_FIELD, ("integer",), "the layout's number before schema_version existed (1)"),
    Field("name", ("string", "null"), "the spec's name"),
    Field("run_dir", ("string",), "where the record is: a local folder or s3://"),
    Field("status", ("string",), "the last attempt's status"),
    Field("started", ("number", "null"), "Unix seconds the first attempt started"),
    Field("ended", ("number", "null"), "Unix seconds the last attempt ended; null while it runs"),
    Field("spec", ("object", "null"), "the spec as resolved, secrets masked"),
    Field("spec_hash", ("string", "null"), "the spec's hash"),
    Field("code", ("object",), "working_dir, git commit and changes, Ray's package names"),
    Field("versions", ("object",), "Python's and the main packages' versions on the cluster"),
    Field("cluster", ("object", "null"), "nodes, CPUs and GPUs, from Ray Train's controller"),
    Field("metrics", ("object", "null"), "the last report's metrics"),
    Field("iterations", ("integer", "null"), "reports of the last attempt"),
    Field("epochs", ("integer", "null"), "planned epochs"),
    Field("restarts", ("integer",), "training restarts of the last attempt"),
    Field("cause", ("object", "null"), "why the last attempt failed, as the agent decided (1.1)"),
    Field("upload_every_s", ("number",), "seconds between uploads"),
    Field("notes", ("array",), "what the record or the progress channel lacks, and why"),
    Field("record_health", ("object",), "failed_uploads, retried, waiting, lost, last_error"),
    Field(RERUN_OF_FIELD, ("string",), "the run this one reruns (rayjobs rerun)"),
    Field(RERUNS_FIELD, ("array",), "the runs that rerun this one"),
    Field(PIPELINE_FIELD, ("object",), "the pipeline run this run is a job of: run (its id), job (this job's name in "
                                       "it), after (each job it ran after: name -> run folder) (1.3)"),
    Field(ATTEMPTS_FIELD, ("array",), "every attempt of the run, oldest first"),
)
REQUIRED_FIELDS = ("status", ATTEMPTS_FIELD)
ATTEMPT_REQUIRED_FIELDS = ("submission_id", "status")
RUN_FIELD_NAMES = frozenset(field.name for field in RUN_FIELDS)


def log_folder(submission_id: str) -> str:
    """The folder of one attempt's log parts, inside the run's folder."""
    return f"{LOGS_FOLDER}/{submission_id}"


def event_folder(submission_id: str) -> str:
    """The folder of one attempt's event parts, inside the run's folder."""
    return f"{EVENTS_FOLDER}/{submission_id}"


def _property(field: Field) -> dict[str, Any]:
    types = list(field.types)
    return {"type": types[0] if len(types) == 1 else types, "description": field.description}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``run.json`` (draft 2020-12); unknown fields are allowed, as readers keep them."""
    attempt = {"type": "object", "properties": {field.name: _property(field) for field in ATTEMPT_FIELDS},
               "required": list(ATTEMPT_REQUIRED_FIELDS), "additionalProperties": True}
    properties = {field.name: _property(field) for field in RUN_FIELDS}
    properties[SCHEMA_VERSION_FIELD]["pattern"] = r"^\d+\.\d+$"
    properties["notes"]["items"] = {"type": "string"}
    properties[RERUNS_FIELD]["items"] = {"type": "string"}
    properties[ATTEMPTS_FIELD]["items"] = attempt
    properties[PIPELINE_FIELD].update(
        properties={"run": {"type": "string", "description": "the pipeline run's id"},
                    "job": {"type": "string", "description": "this job's name in the pipeline"},
                    "after": {"type": "object", "additionalProperties": {"type": "string"},
                              "description": "each job this one ran after, by name: its run folder"}},
        required=["run", "job"], additionalProperties=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "rayjobs run record (run.json)",
            "description": f"schema_version {SCHEMA_VERSION}", "type": "object", "properties": properties,
            "required": list(REQUIRED_FIELDS), "additionalProperties": True}


def schema_major(version: Any) -> int | None:
    """The major number of a ``schema_version`` value; None when it is not ``MAJOR.MINOR``."""
    if not isinstance(version, str):
        return None
    major, dot, minor = version.partition(".")
    return int(major) if dot and major.isdigit() and minor.isdigit() else None


def unreadable_version(document: dict[str, Any]) -> str | None:
    """Why this version cannot read ``document``: a newer major layout, or a version it cannot parse; None: readable.

    A record without ``schema_version`` is the layout before it existed, and reads.
    """
    if SCHEMA_VERSION_FIELD not in document:
        return None
    version = document[SCHEMA_VERSION_FIELD]
    major = schema_major(version)
    ours = schema_major(SCHEMA_VERSION)
    if major is not None and ours is not None and major <= ours:
        return None
    return (f"it was written by a newer rayjobs (run record schema {version}; this one reads {ours}.x): "
            "upgrade rayjobs to read it")


__all__ = ["ATTEMPTS_FIELD", "ATTEMPT_FIELDS", "EVENTS_FOLDER", "EVENT_PART_SUFFIX", "FORMAT_FIELD",
           "FORMAT_VERSION", "LOGS_FOLDER", "LOG_PART_SUFFIX", "PIPELINE_FIELD", "RECORD_DIR", "RECORD_ENV_VAR",
           "RERUNS_FIELD", "RERUN_OF_FIELD", "RUN_FIELDS", "RUN_FIELD_NAMES", "RUN_FILE", "SCHEMA_VERSION",
           "SCHEMA_VERSION_FIELD", "STACKS_FOLDER", "event_folder", "json_schema", "log_folder", "schema_major",
           "unreadable_version"]
