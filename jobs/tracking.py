"""A spec's ``tracking`` block: where the job records its training runs for people to find them (MLflow).

Checked on the client like the rest of the spec. The job receives it in ``RAYJOBS_TRACKING``. A built-in
workload records through :mod:`workloads.ray_train.tracking`; a user's own Ray Train script through the
callback rayjobs ships with its code (``rayjobs_agent/train_hooks/tracking_callback.py``), which runs in
the Train controller. Imports pydantic only.
"""

from __future__ import annotations

import importlib.util
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from rayjobs_agent.storage_location import uri_scheme
from jobs.secrets import without_credentials
from jobs.strict import StrictModel

INSTALL_MLFLOW = "pip install 'rayjobs[mlflow]'"


class MlflowTracking(StrictModel):
    """An MLflow tracking server and the experiment the job's runs go to."""

    tracking_uri: str = Field(description="The tracking server, http(s)://HOST:PORT (credentials from MLflow's own "
                              "variables in runtime_env.env_vars: MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD).")
    experiment: str = Field(min_length=1, description="The experiment every run of the job is recorded in; made "
                            "when missing.")

    @field_validator("tracking_uri")
    @classmethod
    def _served(cls, value: str) -> str:
        if uri_scheme(value) not in ("http", "https"):
            raise ValueError(f"{without_credentials(value)!r} is not a tracking server's address: write "
                             "http(s)://HOST:PORT")
        address = urlsplit(value)
        if "@" in value or address.query or address.fragment:
            # The address travels in the job's variables and in Ray's own driver log, where no mask reaches.
            raise ValueError("the address carries more than a server's (credentials, a query or a fragment): write "
                             "http(s)://HOST:PORT[/PATH] and give credentials in runtime_env.env_vars as "
                             "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (masked "
                             "like every secret)")
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError(f"needs MLflow's client, which is not installed here: {INSTALL_MLFLOW} (the cluster "
                             "needs it as well, e.g. in runtime_env.pip)")
        return value.rstrip("/")


class TrackingSpec(StrictModel):
    """Where the job's training runs are recorded."""

    mlflow: MlflowTracking | None = Field(None, description="One MLflow run per training run (a sweep: a parent run "
                                          "and one child run per trial), with parameters, metrics per epoch, plots.")


# Ray Train's switch between its v1 and v2 APIs; only v2 builds the callbacks named in the job's environment.
TRAIN_V2_ENV_VAR = "RAY_TRAIN_V2_ENABLED"


def unrecorded_tracking(spec: Any) -> str | None:
    """Why a spec's ``tracking`` block would record nothing, or None when it will be recorded.

    A workload records its own runs. A user's script is recorded by a callback shipped with the code the
    job uploads, which Ray Train v2 builds in its controller: a spec that uploads no code, or turns v2
    off, would silently record nothing.
    """
    if spec.tracking is None or spec.tracking.mlflow is None or spec.workload is not None:
        return None
    runtime_env = spec.runtime_env
    paths = [runtime_env.working_dir, *(runtime_env.py_modules or [])] if runtime_env is not None else []
    if not any(path and uri_scheme(path) is None for path in paths):
        return ("tracking needs code uploaded with the job (a local runtime_env.working_dir or py_modules): a "
                "script's Ray Train runs are recorded by a callback rayjobs ships with uploaded code, and this "
                "spec uploads none, so nothing would be recorded")
    env_vars = (runtime_env.env_vars if runtime_env is not None else None) or {}
    if str(env_vars.get(TRAIN_V2_ENV_VAR, "1")).strip().lower() in ("0", "false", "no", "off"):
        return (f"tracking records a script's runs from Ray Train v2's controller, and runtime_env.env_vars sets "
                f"{TRAIN_V2_ENV_VAR} to turn v2 off; remove that variable or the tracking block")
    return None
