"""The one client for a Ray cluster's job API: every request rayjobs makes goes through ``JobsApi``.

REST calls are sent by :func:`jobs.infra.http.fetch` (the proxy rules live there); log streams
by aiohttp here; a job with a working_dir to upload by Ray's ``JobSubmissionClient``
(``runner.client.submission``).

Status, lists, stops and deletes use only the standard library, so ``rayjobs status``/``list``/
``logs``/``stop`` start in a fraction of the time ``import ray`` takes; so does ``submit`` of a job with
nothing to upload (``runner.client.submission``). Ray's ``JobSubmissionClient`` and aiohttp (for log tails) are
imported only when used. Job ids are quoted into URLs and the TLS context is built here, once per client.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

from jobs.infra.status import is_terminal
from runner.backoff import Deadline, retrying
from runner.client.connection import Connection, resolve_connection
from jobs.infra.http import Answer, Unanswered, fetch, is_loopback_host, ssl_context_for, through_proxy_note
from runner.errors import (AuthFailed, BadInput, ClusterRequestFailed, ClusterUnreachable, JobNotFound, NoLogApi,
                           NotADashboard, ProfilingDisabled)
from runner.client.log_resume import LogChunk, ResumePlan, resumed_chunks

_TRANSIENT_HTTP = {502, 503, 504}
# Ray's job manager checks each job's supervisor actor once a second until it sees the actor
# gone. If a delete lands before that check, the check finds no record and writes a new FAILED
# one (JOB_SUPERVISOR_ACTOR_DIED, "Entrypoint not found."), so the deleted job comes back.
# The supervisor exits right after writing the final status; this much margin covers a busy head.
_RECORD_SETTLE_S = 5.0
_LOG_POLL_S = 0.5  # how often Ray's log agent looks for new bytes in a followed file
_FILE_FETCH_TIMEOUT_S = 300  # Ray's default of 30 s cuts a large log short
# No overall limit: a followed log stays open as long as the job runs.
_STREAM_TIMEOUT_S = {"total": None, "sock_connect": 10}

def connect(address: str | None = None, *, cluster: str | None = None, headers: list[str] | None = None,
            verify: bool = True, ca_cert: str | None = None, spec_address: str | None = None,
            spec_address_source: str = "the spec") -> JobsApi:
    """A client for the cluster the documented address precedence picks (see ``runner.client.connection``).

    Args:
        address: the dashboard address (highest precedence), e.g. ``http://127.0.0.1:8265``.
        cluster: a local cluster by name, instead of an address.
        headers: extra headers as ``'Name: value'`` texts.
        verify: whether to verify the dashboard's TLS certificate.
        ca_cert: a CA bundle to verify it with.
        spec_address: the spec's ``address``, below ``address`` and ``cluster``.
        spec_address_source: how messages name where ``spec_address`` came from.

    Returns:
        The client. Nothing is contacted yet.

    Raises:
        BadInput: a malformed address, header or CA file, or ``address`` and ``cluster`` naming two clusters.
        NoCluster: nothing names a cluster and no local one runs, or the named local cluster does not run.
    """
    return JobsApi(resolve_connection(address, spec_address, spec_address_source, headers, verify=verify,
                                      ca_cert=ca_cert, cluster_name=cluster))


class JobsApi:
    """Calls to one cluster's job API: blocking REST calls, ``submit``, and async log tails.

    Every failure is a ``RayJobsError``: ``ClusterUnreachable`` (worth retrying), ``AuthFailed``,
    ``JobNotFound``, ``BadInput``, ``ClusterRequestFailed``.
    """

    def __init__(self, connection: Connection, timeout_s: float = 10.0, retry_for_s: float = 0.0) -> None:
        self.connection = connection
        self.timeout_s = timeout_s
        # One-shot commands (status, list, stop, ...) ride out a brief outage; the follower has its
        # own give-up policy, so its client does not retry underneath it.
        self.retry_for_s = retry_for_s
        self._ssl_context = ssl_context_for(connection.verify) if connection.address.startswith("https") else None

    @property
    def _proxies_apply(self) -> bool:
        # aiohttp ignores the environment's proxies unless told; the REST calls' rules hold for streams too.
        return not is_loopback_host(urllib.parse.urlsplit(self.connection.address).hostname)

    @property
    def address(self) -> str:
        """The dashboard's address (normalized: scheme, host, port)."""
        return self.connection.address

    def version(self) -> dict[str, Any]:
        """The dashboard's version answer; a cheap way to see that the address is a Ray dashboard."""
        return self._request("GET", "/api/version")

    def get_job(self, job_id: str) -> dict[str, Any]:
        """Ray's record of one job (status, times, message, metadata, ...). Raises ``JobNotFound``."""
        return self._request("GET", f"/api/jobs/{_quote(job_id)}", job_id=job_id)

    def list_jobs(self) -> list[dict[str, Any]]:
        """The records of every job on the cluster."""
        return self._request("GET", "/api/jobs/")

    def get_json(self, path: str) -> Any:
        """The JSON answer to ``GET path`` from the dashboard (an API rayjobs reads beside the job API)."""
        return self._request("GET", path)

    def get_raw(self, path: str) -> bytes:
        """The raw answer to ``GET path`` from the dashboard (a file Ray's log API serves)."""
        return self._request("GET", path, raw=True)

    def get_logs(self, job_id: str) -> str:
        """The job API's text of the log (carriage returns become line ends; fails on invalid UTF-8)."""
        return self._request("GET", f"/api/jobs/{_quote(job_id)}/logs", job_id=job_id).get("logs", "")

    def submit(self, submission: dict[str, Any], *, warn: Callable[[str], None] = lambda text: None,
               progress: Callable[[str], None] = lambda text: None) -> str:
        """Submit a job: through Ray's ``JobSubmissionClient`` when it has a working_dir to upload or a
        runtime_env to check, else with one ``create_job`` request (see ``runner.client.submission``).

        Args:
            submission: keyword arguments of ``submit_job`` (``jobs.submission.build_submission``).
            warn: hears of a working_dir that nears the dashboard's upload limit.
            progress: hears of a large working_dir before it is packaged and uploaded.

        Returns:
            The submission id (chosen here when the submission names none).

        Raises:
            SubmitInterrupted: Ctrl-C; it tells whether the job request had gone out.
            BadInput: the upload is too large, or the cluster or Ray refused the job as malformed.
            AuthFailed, ClusterUnreachable, ClusterRequestFailed: as for every call.
        """
        from runner.client.submission import submit_job

        return submit_job(self.connection, submission, warn=warn, progress=progress, rest=self)

    def prepare(self, submission: dict[str, Any], *, warn: Callable[[str], None] = lambda text: None,
                progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
        """What :meth:`submit` would send, without creating the job: its code uploaded, the request's body returned
        (a queue submits it when the job's turn comes)."""
        from runner.client.submission import submit_job

        kept: list[dict[str, Any]] = []
        submit_job(self.connection, submission, warn=warn, progress=progress, rest=self, deliver=kept.append)
        return kept[0]

    def ensure_package(self, name: str, data: bytes) -> bool:
        """Store a runtime_env package as ``gcs://NAME`` on the cluster unless it is there; returns whether it sent it
        (the requests Ray's client makes for a py_modules entry, ``/api/packages/gcs/NAME``, without Ray)."""
        path, where = f"/api/packages/gcs/{_quote(name)}", f"the Ray dashboard at {self.connection.address}"
        for method, body in (("GET", None), ("PUT", data)):
            try:
                answer = fetch(self.connection.address + path, method=method, headers=dict(self.connection.headers),
                               body=body, timeout_s=self.timeout_s, ssl_context=self._ssl_context)
            except Unanswered as exc:
                raise self._unanswered(exc, where) from None
            if method == "GET" and answer.status in (200, 404):
                if answer.status == 200:
                    return False
            elif answer.status >= 400:
                raise self._http_error(answer, path, None, where)
        return True

    def create_job(self, request: dict[str, Any]) -> str:
        """POST a job request (the JSON body Ray's client would send) and return the job's submission id.

        No timeout, as with Ray's client: the dashboard may first wait for a job agent, and a
        request given up on could still have created the job.
        """
        answer = self._request("POST", "/api/jobs/", json_body=request, patient=True)
        return (answer.get("submission_id") if isinstance(answer, dict) else None) or request["submission_id"]

    def job_log(self, job_id: str, tail: int | None = None, driver_node_id: str | None = None) -> str:
        """The job's log (its last ``tail`` lines), invalid UTF-8 shown as U+FFFD.

        The job API's own log endpoint fails with 500 on a log that is not valid UTF-8 and
        turns carriage returns into line ends, so the raw bytes come from the state API;
        clusters without it get the job API's text. ``driver_node_id`` (from a record the caller
        already has) saves looking the job up again.
        """
        if tail == 0:
            return ""
        node_id = driver_node_id or self.get_job(job_id).get("driver_node_id")
        if node_id:
            try:
                return self._request("GET", _driver_log_path(job_id, node_id, tail or -1, follow=False),
                                     raw=True).decode("utf-8", "replace")
            except NotADashboard:
                pass  # no state API on this cluster
        text = self.get_logs(job_id)
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail else text

    def process_traceback(self, pid: str, node_id: str | None = None, ip: str | None = None) -> str:
        """The Python stack of process ``pid`` on a node of the cluster (py-spy, run by Ray's dashboard there)."""
        where = f"node_id={_quote(node_id)}" if node_id else f"ip={_quote(ip or '')}"
        return self._request("GET", f"/worker/traceback?pid={_quote(str(pid))}&{where}&native=0",
                             raw=True).decode("utf-8", "replace")

    def stop_job(self, job_id: str) -> bool:
        """Ask the cluster to stop a job. Returns False if it had already ended."""
        return bool(self._request("POST", f"/api/jobs/{_quote(job_id)}/stop", job_id=job_id).get("stopped"))

    def delete_job(self, job_id: str) -> bool:
        """Delete a finished job's record (once; see ``delete_finished_job``)."""
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

    async def tail_job_logs(self, job_id: str, *, node_id: str, resume: ResumePlan,
                            follow: bool = True) -> AsyncIterator[LogChunk]:
        """The driver log's raw bytes from Ray's state API, as Ray's ``JobSubmissionClient.tail_job_logs`` does
        with text: an async iterator that ends when the server closes the stream.

        Args:
            job_id: the submission id.
            node_id: the node the driver runs on (``driver_node_id`` in the job's record).
            resume: which part of the log to ask for, and where the bytes already printed end.
            follow: keep the stream open for new bytes; False fetches what there is now, once.

        Yields:
            LogChunk: bytes placed at their offset in the log.

        Raises:
            NoLogApi: the cluster has no state API (follow the websocket instead).
            Misaligned: the tail did not hold ``resume``'s resume point.
            ClusterUnreachable: the connection failed or broke off.
            ClusterRequestFailed: any other answer than 200 or 404.
        """
        import aiohttp

        url = self.address + _driver_log_path(job_id, node_id, resume.lines, follow)
        try:
            async with aiohttp.ClientSession(headers=self.connection.headers, trust_env=self._proxies_apply) as session:
                async with session.get(url, ssl=self._aiohttp_ssl(),
                                       timeout=aiohttp.ClientTimeout(**_STREAM_TIMEOUT_S)) as response:
                    if response.status == 404:
                        raise NoLogApi(f"the Ray dashboard at {self.address} has no state API log endpoint")
                    if response.status != 200:
                        raise ClusterRequestFailed(f"the cluster answered {response.status} "
                                                   f"{last_line(await response.text(errors='replace'))}")
                    async for chunk in resumed_chunks(response.content, resume):
                        yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ClusterUnreachable(f"the log download broke off ({type(exc).__name__})") from None

    async def tail_job_logs_websocket(self, job_id: str) -> AsyncIterator[LogChunk]:
        """The log as the job API's websocket sends it (clusters without the state API).

        Every connection replays the log from its start as text, so offsets start at 0 each time.

        Yields:
            LogChunk: the UTF-8 bytes of each message, at their offset.

        Raises:
            NoLogApi: the job has no log stream (not a submission job).
            ClusterUnreachable: the connection failed or broke off.
        """
        import aiohttp

        url = self.address.replace("http", "ws", 1) + f"/api/jobs/{_quote(job_id)}/logs/tail"
        received = 0
        try:
            async with aiohttp.ClientSession(headers=self.connection.headers, trust_env=self._proxies_apply) as session:
                async with session.ws_connect(url, ssl=self._aiohttp_ssl(), heartbeat=30, max_msg_size=0) as ws:
                    async for message in ws:
                        if message.type != aiohttp.WSMsgType.TEXT:
                            break
                        data = message.data.encode()
                        yield LogChunk(data, received)
                        received += len(data)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (400, 404):
                raise NoLogApi(f"job {job_id} has no log stream to follow") from None
            raise ClusterUnreachable(f"the log stream was refused ({exc.status})") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ClusterUnreachable(f"the log stream broke off ({type(exc).__name__})") from None

    def _aiohttp_ssl(self) -> ssl.SSLContext | bool:
        return self._ssl_context or True  # True: aiohttp's default (ignored for plain http)

    def _request(self, method: str, path: str, job_id: str | None = None, raw: bool = False,
                 json_body: Any = None, patient: bool = False) -> Any:
        if self.retry_for_s <= 0 or patient:
            return self._request_once(method, path, job_id, raw, json_body, patient)
        return retrying(lambda: self._request_once(method, path, job_id, raw, json_body, patient),
                        give_up_after_s=self.retry_for_s)

    def _request_once(self, method: str, path: str, job_id: str | None, raw: bool, json_body: Any,
                      patient: bool) -> Any:
        data = None if json_body is None else json.dumps(json_body).encode()
        headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if data else {}),
                   **self.connection.headers}
        where = f"the Ray dashboard at {self.connection.address}"
        try:
            answer = fetch(self.connection.address + path, method=method, headers=headers, body=data,
                           timeout_s=None if patient else self.timeout_s, ssl_context=self._ssl_context)
        except Unanswered as exc:
            raise self._unanswered(exc, where) from None
        if answer.status >= 400:
            raise self._http_error(answer, path, job_id, where)
        if raw:
            return answer.body
        try:
            return json.loads(answer.body)
        except ValueError:
            snippet = answer.body[:80].decode("utf-8", "replace").strip().replace("\n", " ")
            raise NotADashboard(f"{where} answered {method} {path} with something that is not Ray's job API "
                                f"({snippet!r}…); check the address and port (the dashboard is usually :8265)"
                                f"{through_proxy_note(self.connection.address + path)}") from None

    def _unanswered(self, exc: Unanswered, where: str) -> ClusterUnreachable:
        reason, via = exc.reason, exc.proxy_note()
        if isinstance(reason, http.client.HTTPException):
            # A connection that ends mid-answer (a short body, a half status line) is not an
            # OSError but the same transient fault as a refused or reset one.
            return ClusterUnreachable(f"the connection to {where} broke off mid-answer ({type(reason).__name__}); "
                                      f"the cluster or the network between is unsteady{via}")
        if isinstance(reason, ssl.SSLCertVerificationError):
            return ClusterUnreachable(f"cannot verify the TLS certificate of {where}: {reason.verify_message}; "
                                      "pass --ca-cert FILE, or --no-verify to skip the check")
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return ClusterUnreachable(f"{where} did not answer within {self.timeout_s:g}s{via}")
        detail = getattr(reason, "strerror", None) or str(reason)
        return ClusterUnreachable(f"cannot reach {where}: {detail}{via}. Is the cluster running and the "
                                  "address right? (`rayjobs cluster status` shows the local one)")

    def _http_error(self, answer: Answer, path: str, job_id: str | None, where: str) -> Exception:
        text = answer.body.decode("utf-8", "replace").strip()
        code = answer.status
        if code == 403 and "Profiling is disabled" in text:
            return ProfilingDisabled(f"{where} does not read process stacks: profiling is off on its head node. "
                                     "Set RAY_DASHBOARD_ENABLE_PROFILING=1 in the head node's environment "
                                     "(clusters started by `rayjobs cluster up` have it)")
        if code in (401, 403):
            had_token = any(name.lower() == "authorization" for name in self.connection.headers)
            hint = ("the token was refused; check RAY_AUTH_TOKEN / --header" if had_token else
                    "it needs a token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH), or pass --header "
                    "'Authorization: Bearer …'")
            return AuthFailed(f"{where} refused the request ({code}): {hint}")
        if code == 404 and job_id is not None and "does not exist" in text:
            return JobNotFound(f"no job {job_id!r} on the cluster at {self.connection.address} "
                               "(`rayjobs list` shows the jobs there)")
        via = through_proxy_note(self.connection.address + path)
        if code == 404:
            return NotADashboard(f"{where} has no Ray job API at {self.connection.address + path}; check the "
                                 f"address and port{via}")
        if code in _TRANSIENT_HTTP:
            return ClusterUnreachable(f"{where} answered {code} {answer.reason}; the cluster or a proxy in front "
                                      f"of it is not ready{via}")
        if code == 400:
            return BadInput(f"the cluster rejected the request: {last_line(text)}")
        return ClusterRequestFailed(f"{where} failed the request ({code}): {last_line(text)}{via}")




def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")


def _driver_log_path(job_id: str, node_id: str, lines: int, follow: bool) -> str:
    query: dict[str, Any] = {"submission_id": job_id, "node_id": node_id, "lines": lines}
    if follow:
        query["interval"] = _LOG_POLL_S
    else:
        query["timeout"] = _FILE_FETCH_TIMEOUT_S
    return f"/api/v0/logs/{'stream' if follow else 'file'}?{urllib.parse.urlencode(query)}"


# How long each request of a one-shot command (status, stop, list) rides out an unreachable cluster; a followed job's
# client has none, since the follower has its own give-up policy and must see an outage when it starts.
ONE_SHOT_RETRY_S = 5.0


def open_client(connection: Connection, retry_for_s: float = 0.0) -> JobsApi:
    """The one place a cluster client is made, for every command and the Python API (tests replace it here)."""
    return JobsApi(connection, retry_for_s=retry_for_s)


def wait_until_ended(client: JobsApi, job_id: str, *, within_s: float, poll_s: float = 0.3) -> tuple[str | None, bool]:
    """Poll a job's status until it is SUCCEEDED, FAILED or STOPPED, for at most ``within_s``.

    Returns:
        The last status seen, and whether the job ended in time.

    Raises:
        ClusterUnreachable: no answer for 10 s in a row; any other ``RayJobsError`` at once.
    """
    deadline = Deadline(within_s)
    status: str | None = None
    while deadline.left() > 0:
        status = retrying(lambda: client.get_job(job_id), give_up_after_s=10).get("status")
        if is_terminal(status):
            return status, True
        time.sleep(poll_s)
    return status, False


def last_line(text: str) -> str:
    """The last non-blank line of an error body, at most 500 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no details given"

