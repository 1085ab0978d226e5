"""The states of a Ray job, as Ray's Jobs API reports them."""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    """A Ray job's status; compares equal to Ray's own string (``JobStatus.FAILED == "FAILED"``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return self.value


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


def is_terminal(status: str | None) -> bool:
    """True when ``status`` (Ray's string, or None when unknown) is a state a job never leaves."""
    return status in TERMINAL_STATUSES
