"""The job spec: every field a spec file may hold, validated strictly.

``JobSpec`` mirrors the arguments of Ray's ``JobSubmissionClient.submit_job`` plus
rayjobs' own policy (timeouts, retries) and the optional ``workload`` section.
Unknown keys are errors everywhere, including inside ``runtime_env``, because Ray
itself ignores misspelled ``runtime_env`` keys without a word.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jobs.infra.address import normalize_address
from jobs.kuberay import KubeRaySpec
from jobs.errors import did_you_mean
from jobs.notify import NotifyTarget, unsent_notifications
from rayjobs_agent.storage_location import StorageLocation, uri_scheme
from jobs.retry import PERMANENT_CAUSES, RETRYABLE_CAUSES, RetryBackoff
from jobs.paths import SPEC_DIR_CONTEXT_KEY, resolve_spec_path
from jobs.strict import StrictModel
from jobs.sweep import SweepSpec
from jobs.tracking import TrackingSpec, unrecorded_tracking
from rayjobs_agent.queueing import QUEUE_NAME, QUEUE_NAME_RULE
from rayjobs_agent.wire import JOB_ID_PATTERN

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from an integer or a size such as ``8GiB``, ``512Mi`` or ``2GB`` (KB/MB/GB are powers of 1000)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 8GiB or a number of bytes, got a boolean")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("must be a finite size")
        number = int(value)
    elif isinstance(value, str):
        match = _SIZE_PATTERN.match(value)
        unit = match.group(2).lower() if match else None
        if not match or unit not in _SIZE_UNITS:
            raise ValueError(f"{value!r} is not a size; write bytes (8589934592) or a size like 8GiB, 512MiB, 2GB")
        number = int(float(match.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ValueError(f"expected a size such as 8GiB or a number of bytes, got {type(value).__name__}")
    if number < 0:
        raise ValueError("must not be negative")
    return number


def _finite_non_negative(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if value < 0:
        raise ValueError("must not be negative")
    return value


# Strict: YAML `true` or "2" is not a CPU count.
ResourceAmount = Annotated[float, Field(strict=True), AfterValidator(_finite_non_negative)]
# A Ray resource's name (CPU, GPU, accelerator_type:A100, a custom one): it reaches `ray start --resources`
# of an exported RayJob's head through a shell, so nothing a shell reads (quotes, $, spaces) is allowed.
ResourceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/-]{1,128}$")]
ByteSize = Annotated[int, BeforeValidator(parse_size)]


def _env_value_to_str(value: Any) -> Any:
    # Environment variables are text. Writing `OMP_NUM_THREADS: 1` in YAML is so common
    # that plain scalars are converted (true/false as lowercase); anything else is an error.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        raise ValueError("has no value; write an empty string \"\" to set it empty")
    if not isinstance(value, str):
        raise ValueError(f"environment variable values must be text, got a {type(value).__name__}")
    return value


EnvValue = Annotated[str, BeforeValidator(_env_value_to_str)]



def _check_local_path(value: str, info: ValidationInfo) -> str:
    """A local path must exist; it is made absolute against the spec's directory."""
    if uri_scheme(value) is not None:
        return value  # a remote URI (s3://, gs://, https://…zip) is the cluster's business
    path = resolve_spec_path(value, (info.context or {}).get(SPEC_DIR_CONTEXT_KEY) or Path.cwd())
    try:
        found = path.exists()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{value!r} cannot be used as a path: {getattr(exc, 'strerror', None) or exc}") from None
    if not found:
        raise ValueError(f"{value!r} does not exist (looked for {path})")
    return str(path)


class PipConfig(StrictModel):
    """Ray's ``runtime_env.pip`` in its long form."""

    packages: list[str] = Field(description="Requirement strings, as in a requirements.txt.")
    pip_check: bool = Field(False, description="Run `pip check` after installing.")
    pip_version: str | None = Field(None, description="A pip version specifier such as '==23.3.1'.")
    pip_install_options: list[str] | None = Field(None, description="Extra `pip install` arguments.")


class UvConfig(StrictModel):
    """Ray's ``runtime_env.uv`` in its long form."""

    packages: list[str] = Field(description="Requirement strings, as in a requirements.txt.")
    uv_check: bool = Field(False, description="Run `pip check` after installing.")
    uv_version: str | None = Field(None, description="A uv version specifier such as '==0.4.0'.")
    uv_pip_install_options: list[str] | None = Field(None, description="Extra `uv pip install` arguments.")


class RuntimeEnvConfig(StrictModel):
    """Ray's ``runtime_env.config``: how the environment is set up."""

    setup_timeout_seconds: int = Field(600, description="Seconds to set up the environment; -1 waits forever.")
    eager_install: bool = Field(True, description="Install the environment when the job starts, not at first use.")
    log_files: list[str] | None = Field(None, description="Worker log files to stream to the driver.")


class RuntimeEnv(StrictModel):
    """Ray's ``runtime_env``: the environment the entrypoint and its workers run in."""

    working_dir: str | None = Field(
        None, description="Local directory (uploaded; relative to the spec file) or remote zip URI."
    )
    py_modules: list[str] | None = Field(None, description="Local module directories or URIs to ship.")
    py_executable: str | None = Field(None, description="Command that runs Python for the workers, e.g. 'uv run'.")
    excludes: list[str] | None = Field(
        None, description="gitignore-style patterns left out of the upload (rayjobs adds .git, venvs, caches)."
    )
    pip: list[str] | str | PipConfig | None = Field(
        None, description="Packages to pip-install: a list, a requirements.txt path, or the long form."
    )
    uv: list[str] | str | UvConfig | None = Field(
        None, description="Packages to install with uv: a list, a requirements.txt path, or the long form."
    )
    conda: str | dict[str, Any] | None = Field(
        None, description="A conda environment: its name, an environment.yml path, or its content."
    )
    env_vars: dict[str, EnvValue] | None = Field(
        None, description="Environment of the entrypoint and its workers; plain numbers/booleans become text."
    )
    image_uri: str | None = Field(None, description="Container image the job's workers run in.")
    container: dict[str, Any] | None = Field(None, description="Ray's older container settings (image, run options).")
    java_jars: list[str] | None = Field(None, description="Jar files or URIs for Java workers.")
    config: RuntimeEnvConfig | None = Field(None, description="How the environment is set up.")
    worker_process_setup_hook: str | None = Field(
        None, description="'module.function' each worker process calls once at start (logging set-up, patches)."
    )

    @field_validator("working_dir")
    @classmethod
    def _working_dir_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        checked = _check_local_path(value, info)
        if uri_scheme(checked) is None and not Path(checked).is_dir():
            raise ValueError(f"{value!r} is not a directory")
        return checked

    @field_validator("py_modules")
    @classmethod
    def _py_modules_exist(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return None
        return [_check_local_path(item, info) for item in value]

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name in value or {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _one_package_manager(self) -> RuntimeEnv:
        chosen = [name for name in ("pip", "uv", "conda") if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)} cannot be used together; Ray installs packages with one of them")
        if self.image_uri is not None and self.container is not None:
            raise ValueError("image_uri and container cannot be used together")
        return self


NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"

# Ray's JobErrorType values (ray.dashboard.modules.job.common), spelled out so that
# validating a spec does not import ray.
RAY_ERROR_TYPES = (
    "RUNTIME_ENV_SETUP_FAILURE",
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
    "JOB_SUPERVISOR_ACTOR_START_FAILURE",
    "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE",
    "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE",
    "JOB_SUPERVISOR_ACTOR_DIED",
    "JOB_ENTRYPOINT_COMMAND_START_ERROR",
    "JOB_ENTRYPOINT_COMMAND_ERROR",
)
# Failures of the machinery around a job, not of the job's own code: worth another attempt.
INFRASTRUCTURE_FAILURES = (
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
    "JOB_SUPERVISOR_ACTOR_START_FAILURE",
    "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE",
    "JOB_SUPERVISOR_ACTOR_DIED",
)


class JobSpec(StrictModel):
    """A rayjobs spec file."""

    name: str = Field(description="Job name: lowercase letters, digits and '-', at most 63 characters.")
    entrypoint: str = Field(description="Shell command the job runs on the cluster (Ray's entrypoint).")
    runtime_env: RuntimeEnv | None = Field(None, description="Ray runtime_env.")
    entrypoint_num_cpus: ResourceAmount | None = Field(None, description="CPUs reserved for the entrypoint.")
    entrypoint_num_gpus: ResourceAmount | None = Field(None, description="GPUs reserved for the entrypoint.")
    entrypoint_memory: ByteSize | None = Field(None, description="Memory reserved for the entrypoint: bytes or 8GiB.")
    entrypoint_resources: dict[ResourceName, ResourceAmount] | None = Field(
        None, description="Custom resources reserved (names: letters, digits, '_', '.', ':', '/', '-').")
    entrypoint_label_selector: dict[str, str] | None = Field(None, description="Node labels the entrypoint needs.")
    metadata: dict[str, str] | None = Field(None, description="Text key/values stored with the job.")
    submission_id: str | None = Field(
        None, pattern=JOB_ID_PATTERN, description="Fixed job id (default: Ray picks one)."
    )
    address: str | None = Field(None, description="Dashboard address, e.g. http://head:8265.")
    timeout_s: float | None = Field(None, gt=0, description="Stop the job when it has run longer than this.")
    start_timeout_s: float | None = Field(None, gt=0, description="Stop the job when still PENDING after this.")
    stall_after_s: float | None = Field(
        None, gt=0, description="While following: warn, with the Python stacks of the driver and the training "
        "workers, when a RUNNING job has printed nothing and reported no progress for this long. Default: three "
        "times the longest wait between two reports so far, and at least 300. The job is left running.")
    progress: bool = Field(
        True, description="Ship rayjobs' progress channel with the job (when it uploads code), so that every "
        "ray.train.report and training restart shows while following it. false: the job runs exactly as written.")
    record: bool = Field(
        True, description="Have the job keep its run record (run.json with spec, code and versions, its driver log "
        "and progress events) in the run's folder, uploaded as it runs so that it outlives the cluster. Needs the "
        "progress channel's package, so only jobs that upload code keep one.")
    record_path: str | None = Field(
        None, description="Where a job whose workload names no storage_path keeps its record: a folder on the "
        "cluster or s3://BUCKET/PREFIX; each run gets <record_path>/<name>-<first submission id>. Default "
        "~/rayjobs-results.")
    record_every_s: float = Field(30.0, ge=1, description="Seconds between uploads of the run record while the "
                                  "job runs (and once at its end).")
    code_path: str | None = Field(
        None, description="s3://BUCKET/PREFIX where the job's local working_dir and py_modules are uploaded as "
        "content-addressed zips (once per content) instead of through the dashboard, whose uploads stop at "
        "100 MiB; every node then downloads them from there, so the cluster's own processes need the bucket's "
        "credentials. Default: a working_dir too large for the dashboard goes to the run's object storage "
        "(record_path or the workload's storage_path) when that is s3://, and everything else through the "
        "dashboard.", examples=["s3://my-bucket/rayjobs-code"])
    queue: str | None = Field(
        None, pattern=f"^{QUEUE_NAME.pattern}$", description="The cluster queue the job waits in before it "
        "starts: it runs when the queue has fewer jobs running than its limit (rayjobs queue set NAME "
        "--max-running N, kept on the cluster), no job ahead of it waits, and the cluster has free what it needs. "
        "Until then the job is an entry in the cluster's key-value store: no process, no resources. A name is "
        f"{QUEUE_NAME_RULE}. Default: no queue, the job starts at once.",
        examples=["team-a"])
    priority: int = Field(0, ge=-1000, le=1000, description="Order in the queue: higher first, then the time of "
                          "submission.")
    needs: dict[ResourceName, ResourceAmount] | None = Field(
        None, description="What the job will use while it runs, in Ray's resource names ({CPU: 4, GPU: 1}), for "
        "the queue to wait until the cluster has it free. Default: what the workload declares (its widest stage's "
        "workers) plus the entrypoint's own resources; give it for your own script.", examples=[{"CPU": 4}])
    max_retries: int = Field(0, ge=0, le=100, description="Submit again when an attempt fails (see retry_on).")
    retry_on: list[str] = Field(
        default_factory=lambda: list(INFRASTRUCTURE_FAILURES),
        description="Failures that trigger a retry: Ray error types, 'exit_code:N' for one driver exit code, "
        "JOB_ENTRYPOINT_COMMAND_ERROR for any, or a cause rayjobs reads from the log (" + ", ".join(RETRYABLE_CAUSES)
        + "). Default: infrastructure failures only, not your code's exits. A missing module or refused "
        "credentials are never retried.",
    )
    retry_backoff: RetryBackoff = Field(
        default_factory=RetryBackoff, description="The wait before each retry: initial_s (default 10), doubled at "
        "each retry up to max_s (default 300).")
    secret_env_vars: list[str] = Field(
        default_factory=list,
        description="runtime_env.env_vars names to mask in every output, besides names that look secret.",
    )
    workload: dict[str, Any] | None = Field(
        None, description="Parameters of the program the entrypoint runs; 'kind' names its parameter model."
    )
    tracking: TrackingSpec | None = Field(
        None, description="Where the job records its training runs: tracking.mlflow (tracking_uri, experiment).")
    notify: list[NotifyTarget] | None = Field(
        None, description="Where the job itself sends word of how it went (Apprise URLs: Slack, Teams, Discord, "
        "email, ntfy, JSON webhooks…), and on which events; sent from the cluster, so it works with --no-wait and "
        "from KubeRay. Needs the run record (record: true, and code uploaded from a local working_dir or "
        "py_modules), and Apprise on the cluster.")
    sweep: SweepSpec | None = Field(
        None, description="A hyperparameter sweep of the workload's fields, run as one job with Ray Tune: "
        "each trial trains with its own values, the best trial's checkpoint goes on to inference.")
    kuberay: KubeRaySpec | None = Field(
        None, description="What `rayjobs export kuberay` adds to the RayJob (deletion_rules); a Ray cluster "
        "ignores it.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a valid name: use lowercase letters, digits and '-', "
                "start and end with a letter or digit, at most 63 characters"
            )
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, value: list[str]) -> list[str]:
        for item in value:
            if item in RAY_ERROR_TYPES or item in RETRYABLE_CAUSES or re.fullmatch(r"exit_code:-?\d+", item):
                continue
            if item in PERMANENT_CAUSES:
                raise ValueError(f"{item!r} is never retried: {PERMANENT_CAUSES[item]}; fix it and submit again")
            hint = did_you_mean(item, RAY_ERROR_TYPES + RETRYABLE_CAUSES)
            raise ValueError(f"{item!r} is not a Ray error type, a failure cause or exit_code:N{hint}; error types: "
                             + ", ".join(RAY_ERROR_TYPES) + "; causes: " + ", ".join(RETRYABLE_CAUSES))
        return value

    @model_validator(mode="after")
    def _notify_has_a_sender(self) -> JobSpec:
        if (problem := unsent_notifications(self)) is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _tracking_has_an_observer(self) -> JobSpec:
        if (problem := unrecorded_tracking(self)) is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _secrets_are_env_vars(self) -> JobSpec:
        env_vars = (self.runtime_env.env_vars if self.runtime_env else None) or {}
        unknown = [name for name in self.secret_env_vars if name not in env_vars]
        if unknown:
            raise ValueError(f"secret_env_vars names {', '.join(unknown)}, which runtime_env.env_vars does not set")
        return self

    @field_validator("code_path")
    @classmethod
    def _code_path(cls, value: str | None) -> str | None:
        # Ray's nodes fetch remote packages themselves; of the stores rayjobs can write to, that is S3.
        if value is not None:
            StorageLocation.parse_s3(value)
        return value.rstrip("/") if value is not None else None

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            normalize_address(value)
        return value
