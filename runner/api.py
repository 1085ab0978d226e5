"""A small client for the Ray dashboard's job REST API (``/api/jobs/…``).

It uses only the standard library so that ``rayjobs status``/``list``/``logs``/``stop``
start in a fraction of the time ``import ray`` takes. Submission, which needs Ray's
working_dir packaging, goes through ``JobSubmissionClient`` in ``runner.submit``.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from runner.connection import Connection
from runner.errors import (
    AuthFailed,
    BadInput,
    ClusterRequestFailed,
    ClusterUnreachable,
    JobNotFound,
    NotADashboard,
)

_TRANSIENT_HTTP = {502, 503, 504}
# Ray's job manager checks each job's supervisor actor once a second until it sees the actor
# gone. If a delete lands before that check, the check finds no record and writes a new FAILED
# one (JOB_SUPERVISOR_ACTOR_DIED, "Entrypoint not found."), so the deleted job comes back.
# The supervisor exits right after writing the final status; this much margin covers a busy head.
_RECORD_SETTLE_S = 5.0

T = TypeVar("T")


class JobsApi:
    """Blocking calls to one cluster's job API; every failure is a ``RayJobsError``."""

    def __init__(self, connection: Connection, timeout_s: float = 10.0) -> None:
        self.connection = connection
        self.timeout_s = timeout_s
        self._ssl_context = _ssl_context(connection.verify) if connection.address.startswith("https") else None

    @property
    def address(self) -> str:
        return self.connection.address

    def version(self) -> dict[str, Any]:
        return self._request("GET", "/api/version")

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/api/jobs/{_quote(job_id)}", job_id=job_id)

    def list_jobs(self) -> list[dict[str, Any]]:
        return self._request("GET", "/api/jobs/")

    def get_logs(self, job_id: str) -> str:
        return self._request("GET", f"/api/jobs/{_quote(job_id)}/logs", job_id=job_id).get("logs", "")

    def job_log(self, job_id: str, tail: int | None = None) -> str:
        """The job's log (its last ``tail`` lines), invalid UTF-8 shown as U+FFFD.

        The job API's own log endpoint fails with 500 on a log that is not valid UTF-8 and
        turns carriage returns into line ends, so the raw bytes come from the state API;
        clusters without it get the job API's text.
        """
        if tail == 0:
            return ""
        node_id = self.get_job(job_id).get("driver_node_id")
        if node_id:
            query = urllib.parse.urlencode({"submission_id": job_id, "node_id": node_id, "lines": tail or -1,
                                            "timeout": 300})
            try:
                return self._request("GET", f"/api/v0/logs/file?{query}", raw=True).decode("utf-8", "replace")
            except NotADashboard:
                pass  # no state API on this cluster
        text = self.get_logs(job_id)
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail else text

    def stop_job(self, job_id: str) -> bool:
        return bool(self._request("POST", f"/api/jobs/{_quote(job_id)}/stop", job_id=job_id).get("stopped"))

    def delete_job(self, job_id: str) -> bool:
        return bool(self._request("DELETE", f"/api/jobs/{_quote(job_id)}", job_id=job_id).get("deleted"))

    def delete_finished_job(self, job_id: str, end_time_ms: int | None) -> None:
        """Delete a finished job so that it stays deleted.

        A job that ended less than a few seconds ago is watched until Ray's own bookkeeping of
        it is over, and deleted again if that bookkeeping recreated its record.
        """
        self.delete_job(job_id)
        ended_ago_s = time.time() - end_time_ms / 1000 if end_time_ms else _RECORD_SETTLE_S
        # Clocks of client and cluster may differ; never watch longer than the margin itself.
        watch_s = min(_RECORD_SETTLE_S, max(0.0, _RECORD_SETTLE_S - ended_ago_s))
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            time.sleep(0.25)
            try:
                self.get_job(job_id)
            except JobNotFound:
                continue
            except ClusterUnreachable:
                return  # the delete itself went through; a lost check is no reason to fail it
            self.delete_job(job_id)
            return

    def node_resources(self) -> list[dict[str, float]]:
        """Total resources of each alive node (Ray's logical resources: CPU, GPU, memory, custom)."""
        nodes = self._request("GET", "/nodes?view=summary").get("data", {}).get("summary", [])
        return [node.get("raylet", {}).get("resourcesTotal", {}) for node in nodes
                if node.get("raylet", {}).get("state") == "ALIVE"]

    def has_autoscaler(self) -> bool:
        """Whether the cluster can add nodes: its autoscaler lists worker node types it may launch.

        Every head runs a monitor that reports status, so a report alone proves nothing; a
        plain `ray start --head` cluster reports an empty "Worker node types:" section.
        """
        status = self._request("GET", "/api/cluster_status").get("data", {}).get("autoscalingStatus") or ""
        _, _, worker_types = status.partition("Worker node types:")
        return any(line.strip() for line in worker_types.splitlines())

    def _request(self, method: str, path: str, job_id: str | None = None, raw: bool = False) -> Any:
        url = self.connection.address + path
        request = urllib.request.Request(url, method=method, headers={"Accept": "application/json",
                                                                       **self.connection.headers})
        where = f"the Ray dashboard at {self.connection.address}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl_context) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, job_id, where) from None
        except http.client.HTTPException as exc:
            # A connection that ends mid-answer (a short body, a half status line) is not an
            # OSError but the same transient fault as a refused or reset one.
            raise ClusterUnreachable(f"the connection to {where} broke off mid-answer "
                                     f"({type(exc).__name__}); the cluster or the network between is "
                                     "unsteady") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ClusterUnreachable(f"cannot verify the TLS certificate of {where}: {reason.verify_message}; "
                                         "pass --ca-cert FILE, or --no-verify to skip the check") from None
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise ClusterUnreachable(f"{where} did not answer within {self.timeout_s:g}s") from None
            detail = getattr(reason, "strerror", None) or str(reason)
            raise ClusterUnreachable(f"cannot reach {where}: {detail}. Is the cluster running and the "
                                     "address right? (`rayjobs cluster status` shows the local one)") from None
        if raw:
            return body
        try:
            return json.loads(body)
        except ValueError:
            snippet = body[:80].decode("utf-8", "replace").strip().replace("\n", " ")
            raise NotADashboard(f"{where} answered {method} {path} with something that is not Ray's job API "
                                f"({snippet!r}…); check the address and port (the dashboard is usually :8265)") from None

    def _http_error(self, exc: urllib.error.HTTPError, job_id: str | None, where: str) -> Exception:
        try:
            text = exc.read().decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        if exc.code in (401, 403):
            had_token = any(name.lower() == "authorization" for name in self.connection.headers)
            hint = ("the token was refused; check RAY_AUTH_TOKEN / --header" if had_token else
                    "it needs a token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH), or pass --header "
                    "'Authorization: Bearer …'")
            return AuthFailed(f"{where} refused the request ({exc.code}): {hint}")
        if exc.code == 404 and job_id is not None and "does not exist" in text:
            return JobNotFound(f"no job {job_id!r} on the cluster at {self.connection.address} "
                               "(`rayjobs list` shows the jobs there)")
        if exc.code == 404:
            return NotADashboard(f"{where} has no Ray job API at {exc.url}; check the address and port")
        if exc.code in _TRANSIENT_HTTP:
            return ClusterUnreachable(f"{where} answered {exc.code} {exc.reason}; the cluster or a proxy in front "
                                      "of it is not ready")
        if exc.code == 400:
            return BadInput(f"the cluster rejected the request: {last_line(text)}")
        return ClusterRequestFailed(f"{where} failed the request ({exc.code}): {last_line(text)}")


def retrying(call: Callable[[], T], give_up_after_s: float, on_retry: Callable[[Exception, float], None] | None = None,
             first_delay_s: float = 0.2, max_delay_s: float = 2.0) -> T:
    """Run ``call``; retry with exponential backoff while the cluster is unreachable, up to ``give_up_after_s``."""
    deadline = time.monotonic() + give_up_after_s
    delay = first_delay_s
    while True:
        try:
            return call()
        except ClusterUnreachable as exc:
            if isinstance(exc, NotADashboard) or time.monotonic() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, max_delay_s)


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")


def last_line(text: str) -> str:
    """The last non-blank line of an error body, at most 500 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no details given"


def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()
