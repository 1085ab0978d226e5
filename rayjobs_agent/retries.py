"""Whether a failed attempt runs again, and after how long: the spec's ``max_retries``, ``retry_on`` and backoff.

One rule for both places a retry is decided. The agent beside the job decides for a failed entrypoint
(its exit code and the cause it read), and runs it again inside the same Ray job, so a job nobody
follows is retried as a followed one is. The client decides only for a job that was lost whole (its
supervisor died, it never started), which the agent inside it cannot see.

``retry_on`` names Ray's error types (``JOB_ENTRYPOINT_COMMAND_ERROR``: any exit of the entrypoint
but 0), ``exit_code:N`` (a signal's two spellings alike), or causes of ``causes.py``. A cause no new
attempt can get past (a missing module, refused credentials) is never retried, whatever the spec says,
and why is said.

Standard library only: it runs in the job's wrapper, and the client imports it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

from .causes import PERMANENT_CAUSES, same_exit_codes
from .wire import RETRY_ENV_VAR, ray_env_json

# Ray's error type of a job whose entrypoint ran and exited with a code other than 0.
ENTRYPOINT_FAILED = "JOB_ENTRYPOINT_COMMAND_ERROR"
# The longest wait before a retry (a day): the job holds its cluster's resources, and its queue slot, while it waits.
MAX_BACKOFF_S = 24 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries``, ``retry_on`` and the backoff (``initial_s``, doubled each retry, at most ``max_s``)."""

    max_retries: int = 0
    retry_on: tuple[str, ...] = ()
    initial_s: float = 10.0
    max_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= MAX_BACKOFF_S):
                raise ValueError(f"retry_backoff.{name} must be a number of seconds from 0 to {MAX_BACKOFF_S:g}, "
                                 f"not {value!r}")

    def delay_s(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the second attempt)."""
        return min(self.max_s, self.initial_s * 2.0 ** max(0, retry - 1))

    def to_variable(self) -> str:
        """The policy as the job gets it (``RAYJOBS_RETRY``)."""
        return ray_env_json({"max_retries": self.max_retries, "retry_on": list(self.retry_on),
                             "initial_s": self.initial_s, "max_s": self.max_s})

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RetryPolicy:
        """The policy the client gave the job (none: no retries in place)."""
        text = environ.get(RETRY_ENV_VAR)
        if not text:
            return cls()
        document = json.loads(text)
        return cls(int(document.get("max_retries") or 0), tuple(document.get("retry_on") or ()),
                   float(document.get("initial_s", 10.0)), float(document.get("max_s", 300.0)))


@dataclass(frozen=True)
class Failure:
    """What is known of a failed attempt: Ray's error type, the entrypoint's exit code, the cause read from its log."""

    error_type: str | None = None
    exit_code: int | None = None
    cause: str | None = None


@dataclass(frozen=True)
class RetryDecision:
    """Run again or not; ``note`` is the line that says so (None: nothing worth saying)."""

    retry: bool
    note: str | None = None
    delay_s: float = 0.0
    matched: str | None = field(default=None, compare=False)


def matches(failure: Failure, retry_on: tuple[str, ...] | list[str]) -> str | None:
    """The entry of ``retry_on`` the failure matches (its cause, its error type, its exit code), or None."""
    if failure.cause is not None and failure.cause in retry_on:
        return failure.cause
    if failure.error_type and failure.error_type in retry_on:
        return failure.error_type
    if failure.error_type == ENTRYPOINT_FAILED and failure.exit_code is not None:
        return next((f"exit_code:{code}" for code in sorted(same_exit_codes(int(failure.exit_code)))
                     if f"exit_code:{code}" in retry_on), None)
    return None


def decide_retry(policy: RetryPolicy, failure: Failure, attempts_made: int, *, again: str = "running") -> RetryDecision:
    """What to do after attempt number ``attempts_made`` failed (``again``: how the next attempt starts, in words)."""
    if attempts_made > policy.max_retries:
        return RetryDecision(False)
    if failure.cause in PERMANENT_CAUSES:
        return RetryDecision(False, f"not retried, although max_retries is {policy.max_retries}: the failure is "
                                    f"{failure.cause}, and {PERMANENT_CAUSES[failure.cause]}")
    matched = matches(failure, policy.retry_on)
    if matched is None:
        return RetryDecision(False)
    delay_s = policy.delay_s(attempts_made)
    wait = f" in {delay_s:g}s (retry_backoff)" if delay_s > 0 else ""
    return RetryDecision(True, f"attempt {attempts_made} failed with {matched} (in retry_on); {again} attempt "
                               f"{attempts_made + 1} of {policy.max_retries + 1}{wait}", delay_s, matched)


def retries_whole_jobs(policy: RetryPolicy) -> bool:
    """Whether ``policy`` may submit a job again that was lost whole (by one of Ray's error types other than a
    failed entrypoint, which the agent beside the job retries in place)."""
    return policy.max_retries > 0 and any(item.startswith("JOB_") and item != ENTRYPOINT_FAILED
                                          for item in policy.retry_on)


__all__ = ["ENTRYPOINT_FAILED", "MAX_BACKOFF_S", "Failure", "RetryDecision", "RetryPolicy", "decide_retry", "matches",
           "retries_whole_jobs"]
