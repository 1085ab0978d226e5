"""Whether a job lost whole is submitted again: the spec's retry_on and max_retries, as the follower reads them.

A failed entrypoint is retried by the agent beside it, inside the same job (``rayjobs_agent/retries.py``,
the one rule): the client follows those attempts and decides nothing about them. A job that was lost
whole (its supervisor died, it could not start, its node went) is submitted again by the cluster's
queue keeper by the same rule; the follower reads the rule here only to know whether to wait for the
keeper's next attempt.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from jobs.retry import retry_policy
from rayjobs_agent.retries import ENTRYPOINT_FAILED, Failure, RetryDecision, decide_retry

if TYPE_CHECKING:
    from jobs.spec import JobSpec

# Waits go through these names, so that a test can run them on a fake clock.
sleep: Callable[[float], None] = time.sleep
now: Callable[[], float] = time.monotonic


def decide_resubmit(spec: JobSpec, info: dict[str, Any], attempts_made: int) -> RetryDecision:
    """What to do after attempt number ``attempts_made`` ended FAILED: resubmit only a job lost whole.

    Args:
        spec: the spec (max_retries, retry_on, retry_backoff).
        info: Ray's record of the failed job (``error_type``).
        attempts_made: how many attempts ran so far, in place and submitted.
    """
    error_type = info.get("error_type")
    if error_type == ENTRYPOINT_FAILED or not error_type:
        return RetryDecision(False)  # its entrypoint ran: the agent beside it decided, and retried it if it could
    return decide_retry(retry_policy(spec), Failure(error_type=error_type), attempts_made, again="the cluster submits")
