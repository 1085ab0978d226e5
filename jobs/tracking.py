"""A spec's ``tracking`` block: where the job records its training runs for people to find them (MLflow).

Checked on the client like the rest of the spec. The job receives it in ``RAYJOBS_TRACKING`` and
records through :mod:`workloads.training.tracking`. Imports pydantic only.
"""

from __future__ import annotations

import importlib.util

from pydantic import Field, field_validator

from jobs.object_store import uri_scheme
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
            raise ValueError(f"{value!r} is not a tracking server's address: write http(s)://HOST:PORT")
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError(f"needs MLflow's client, which is not installed here: {INSTALL_MLFLOW} (the cluster "
                             "needs it as well, e.g. in runtime_env.pip)")
        return value.rstrip("/")


class TrackingSpec(StrictModel):
    """Where the job's training runs are recorded."""

    mlflow: MlflowTracking | None = Field(None, description="One MLflow run per training run (a sweep: a parent run "
                                          "and one child run per trial), with parameters, metrics per epoch, plots.")
