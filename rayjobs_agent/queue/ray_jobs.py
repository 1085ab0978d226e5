"""Ray's job API as the queue uses it: submit a job, stop it, delete it, and end one in Ray's table.

The keeper reaches it through the dashboard of its own cluster (its address is in the GCS), with a bound on every
request: a dashboard that hangs must not hang the queue.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

# The longest the keeper waits for Ray's job API to answer one request.
REQUEST_TIMEOUT_S = 30.0


class Refused(Exception):
    """Ray refused a job request for good (a malformed request, an id taken by another job)."""

class AlreadySubmitted(Exception):
    """Ray already has a job of this id: the keeper submitted it before it died, and then its entry stayed."""

class RayJobs(Protocol):
    """What the keeper asks of Ray's job API."""

    def submit(self, request: dict[str, Any]) -> None: ...

    def stop(self, job_id: str) -> bool: ...

    def delete(self, job_id: str) -> None: ...

    def settle(self, job_id: str, status: str, message: str, *, lost: bool = False) -> None: ...

class DashboardJobs:
    """:class:`RayJobs` through the job API of the dashboard on this cluster (its address is in the GCS)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._client: Any = None

    def _job_client(self) -> Any:
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            from ..ray_internals import dashboard_address

            # The client adds the cluster's token itself when the cluster uses token authentication.
            self._client = JobSubmissionClient("http://" + dashboard_address(self.store.client))
        return self._client

    def submit(self, request: dict[str, Any]) -> None:
        """Submit ``request`` (the JSON body ``JobSubmissionClient`` sends), with its own submission id.

        Raises:
            AlreadySubmitted, Refused: Ray's answers; TimeoutError: no answer in :data:`REQUEST_TIMEOUT_S` (the
            job may or may not have been created); another exception: Ray could not take it now.
        """
        try:
            _within(REQUEST_TIMEOUT_S, lambda: self._job_client().submit_job(**request))
        except RuntimeError as exc:
            text = str(exc)
            if "already exists" in text:
                raise AlreadySubmitted(request["submission_id"]) from None
            if "status code 400" in text:
                raise Refused(last_line(text)) from None
            self._client = None  # a fresh client next time: the dashboard may have restarted
            raise

    def stop(self, job_id: str) -> bool:
        """Ask Ray to stop a job; False when it had ended or is unknown."""
        try:
            return bool(_within(REQUEST_TIMEOUT_S, lambda: self._job_client().stop_job(job_id)))
        except (RuntimeError, TimeoutError):
            return False

    def delete(self, job_id: str) -> None:
        """Delete a finished job from Ray's table."""
        _within(REQUEST_TIMEOUT_S, lambda: self._job_client().delete_job(job_id))

    def settle(self, job_id: str, status: str, message: str, *, lost: bool = False) -> None:
        """End job ``job_id`` in Ray's table as ``status`` with ``message`` (an order read, a job found lost)."""
        from ..ray_internals import settle_job

        settle_job(self.store.client, job_id, status, message, lost=lost)

    def supervised_orders(self) -> list[str]:
        """The order jobs whose supervisor actor exists, pending or alive."""
        from ..queueing import ORDER_PREFIX
        from ..ray_internals import supervised_jobs

        return supervised_jobs(ORDER_PREFIX)

    def kill_supervisor(self, job_id: str) -> None:
        """Take down job ``job_id``'s supervisor actor, if it has one."""
        from ..ray_internals import kill_supervisor

        kill_supervisor(job_id)

    def has_supervisor(self, job_id: str) -> bool | None:
        """Whether job ``job_id``'s supervisor actor exists (None: the cluster could not say)."""
        from ..ray_internals import has_supervisor

        return has_supervisor(job_id)

def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``, or TimeoutError when it has not returned after ``seconds`` (it is left to finish on its own)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="rayjobs-queue-request", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"Ray's job API did not answer within {seconds:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def last_line(text: str) -> str:
    """The last non-blank line of an error's text (at most 300 characters), for one line of the keeper's log."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no details"
