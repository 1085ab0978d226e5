"""What a spec's retry policy may name beside Ray's error types, and how long it waits between attempts.

The failure causes and the retry rule are the agent's (``rayjobs_agent/causes.py`` and ``retries.py``),
which decides on the cluster; the spec names them and ships its policy to the job.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from jobs.strict import StrictModel
from rayjobs_agent.causes import PERMANENT_CAUSES, RETRYABLE_CAUSES  # noqa: F401 - the causes retry_on may name
from rayjobs_agent.retries import MAX_BACKOFF_S, RetryPolicy


class RetryBackoff(StrictModel):
    """How long to wait before each retry: ``initial_s``, doubled at each retry, at most ``max_s``.

    Both are at most a day (``MAX_BACKOFF_S``): the job keeps its resources, and its queue slot, while it waits.
    """

    initial_s: float = Field(10.0, ge=0, le=MAX_BACKOFF_S, allow_inf_nan=False,
                             description=f"Seconds before the first retry; 0 retries at once; at most "
                             f"{MAX_BACKOFF_S:g} (a day).")
    max_s: float = Field(300.0, ge=0, le=MAX_BACKOFF_S, allow_inf_nan=False,
                         description=f"The longest wait between two attempts, in seconds; at most {MAX_BACKOFF_S:g} "
                         "(a day).")

    @model_validator(mode="after")
    def _ordered(self) -> RetryBackoff:
        if self.max_s < self.initial_s:
            raise ValueError(f"max_s ({self.max_s:g}) is shorter than initial_s ({self.initial_s:g})")
        return self


def retry_policy(spec: Any) -> RetryPolicy:
    """A spec's retry policy, as the agent beside its job applies it (and the client for a job lost whole)."""
    return RetryPolicy(spec.max_retries, tuple(spec.retry_on), spec.retry_backoff.initial_s,
                       spec.retry_backoff.max_s)
