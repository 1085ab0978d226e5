"""Whether a failed attempt is submitted again, and after how long: the spec's retry_on, max_retries, retry_backoff.

A failure is matched by Ray's error type, the driver's exit code, or the cause read from its log
(``runner.follow.diagnosis``). A cause that no new attempt can fix (``jobs.retry.PERMANENT_CAUSES``: a
missing module, refused credentials) is never retried, whatever the spec says, and the reason is said.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from jobs.retry import PERMANENT_CAUSES
from jobs.submission import should_retry

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from runner.follow.diagnosis import Diagnosis

# Waits go through this name, so that a test can run them on a fake clock.
sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class RetryDecision:
    """Submit again or not; ``note`` is the line that says so (None: nothing worth saying)."""

    retry: bool
    note: str | None = None
    delay_s: float = 0.0


def decide_retry(spec: JobSpec, info: dict[str, Any], diagnosis: Diagnosis | None, attempts_made: int) -> RetryDecision:
    """What to do after attempt number ``attempts_made`` FAILED.

    Args:
        spec: the spec (max_retries, retry_on, retry_backoff).
        info: Ray's record of the failed attempt (``error_type``, ``driver_exit_code``).
        diagnosis: the cause read from its log, if one was.
        attempts_made: how many attempts were submitted so far.
    """
    if attempts_made > spec.max_retries:
        return RetryDecision(False)
    cause = diagnosis.cause if diagnosis is not None else None
    if cause in PERMANENT_CAUSES:
        return RetryDecision(False, f"not retried, although max_retries is {spec.max_retries}: the failure is "
                                    f"{cause}, and {PERMANENT_CAUSES[cause]}")
    if not should_retry(info, spec.retry_on, cause):
        return RetryDecision(False)
    matched = cause if cause is not None and cause in spec.retry_on else info.get("error_type")
    delay_s = spec.retry_backoff.delay_s(attempts_made)
    wait = f" in {delay_s:g}s (retry_backoff)" if delay_s > 0 else ""
    return RetryDecision(True, f"attempt {attempts_made} failed with {matched} (in retry_on); submitting attempt "
                               f"{attempts_made + 1} of {spec.max_retries + 1}{wait}", delay_s)


def wait_before_retry(delay_s: float) -> bool:
    """Wait ``delay_s`` before the next attempt; False when Ctrl-C cut the wait short (nothing more is submitted)."""
    if delay_s <= 0:
        return True
    try:
        sleep(delay_s)
    except KeyboardInterrupt:
        return False
    return True
