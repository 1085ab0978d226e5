"""What a spec's retry policy may name beside Ray's error types, and how long it waits between attempts.

The failure causes are those ``runner/follow/diagnosis.py`` reads from a failed job's log, spelled out
so that validating a spec does not import the runner (tests/test_run_policy.py holds them equal).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from jobs.strict import StrictModel

# Causes another attempt may get past (a busy node, a lost peer or node, a full disk someone cleans up).
RETRYABLE_CAUSES = ("host_out_of_memory", "cuda_out_of_memory", "disk_full", "placement_infeasible",
                    "collective_timeout", "node_lost", "max_failures_used_up")
# Causes no attempt gets past: the same code, environment and credentials fail the same way. Never retried.
PERMANENT_CAUSES = {
    "module_missing": "a missing module is missing again in the next attempt",
    "storage_credentials": "refused credentials are refused again in the next attempt",
}


class RetryBackoff(StrictModel):
    """How long to wait before each retry: ``initial_s``, doubled at each retry, at most ``max_s``."""

    initial_s: float = Field(10.0, ge=0, description="Seconds before the first retry; 0 retries at once.")
    max_s: float = Field(300.0, ge=0, description="The longest wait between two attempts.")

    def delay_s(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the second attempt)."""
        return min(self.max_s, self.initial_s * 2.0 ** max(0, retry - 1))

    @model_validator(mode="after")
    def _ordered(self) -> RetryBackoff:
        if self.max_s < self.initial_s:
            raise ValueError(f"max_s ({self.max_s:g}) is shorter than initial_s ({self.initial_s:g})")
        return self
