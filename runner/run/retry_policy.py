"""Whether a job lost whole is submitted again, and after how long: the spec's retry_on, max_retries, retry_backoff.

A failed entrypoint is retried by the agent beside it, inside the same job (``rayjobs_agent/retries.py``,
the one rule): the client follows those attempts and decides nothing about them. What the agent
cannot see is a job that was lost whole (its supervisor died, it could not start): for that, by the
same rule, the client submits it again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from jobs.retry import retry_policy
from rayjobs_agent.retries import ENTRYPOINT_FAILED, Failure, RetryDecision, decide_retry

if TYPE_CHECKING:
    from jobs.spec import JobSpec

# Waits go through this name, so that a test can run them on a fake clock.
sleep: Callable[[float], None] = time.sleep


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
    return decide_retry(retry_policy(spec), Failure(error_type=error_type), attempts_made, again="submitting")


def wait_before_retry(delay_s: float) -> bool:
    """Wait ``delay_s`` before the next attempt; False when Ctrl-C cut the wait short (nothing more is submitted)."""
    if delay_s <= 0:
        return True
    try:
        sleep(delay_s)
    except KeyboardInterrupt:
        return False
    return True
