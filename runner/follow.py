"""Following a job to its end: status polling plus a live log stream.

Logs arrive over the dashboard's websocket (``/api/jobs/<id>/logs/tail``), which
replays the log from its start on every connection. The follower counts the
characters it has written, so when the socket drops while the job still runs
(ray#60665) it reconnects and skips what it already printed: no line is lost or
repeated. Status is polled separately over REST; the job is over only when the
status says so, never because a socket closed. Once it is over, one plain
``GET …/logs`` fetches whatever the stream had not delivered yet.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from runner.api import TERMINAL_STATUSES, JobsApi
from runner.errors import AuthFailed, ClusterUnreachable, JobNotFound, RayJobsError
from runner.exit_codes import ExitCode, exit_code_for_status

FIRST_POLL_S = 0.2
MAX_POLL_S = 1.0
DEFAULT_GIVE_UP_S = 60.0
STOP_GRACE_S = 60.0


@dataclass
class Outcome:
    """How following a job ended."""

    exit_code: ExitCode
    status: str | None
    info: dict[str, Any] | None
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)


class LogCursor:
    """Writes the new part of a log that is delivered (possibly again) from its start."""

    def __init__(self, out: TextIO, keep_lines: int = 20) -> None:
        self.out = out
        self.written = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._partial = ""

    def feed(self, chunk: str, start: int) -> None:
        """``chunk`` holds log characters ``start`` … ``start + len(chunk)``."""
        end = start + len(chunk)
        if end <= self.written:
            return
        new = chunk[max(0, self.written - start):]
        self.written = end
        self.out.write(new)
        self.out.flush()
        lines = (self._partial + new).split("\n")
        self._partial = lines.pop()
        self.tail.extend(lines)

    def tail_lines(self) -> list[str]:
        lines = list(self.tail) + ([self._partial] if self._partial else [])
        return lines[-(self.tail.maxlen or len(lines)):]


class Follower:
    """Follows one job until it is SUCCEEDED, FAILED or STOPPED, or contact is lost for too long."""

    def __init__(
        self,
        api: JobsApi,
        job_id: str,
        *,
        logs_out: TextIO | None = None,
        notes: TextIO | None = None,
        stream_logs: bool = True,
        give_up_after_s: float = DEFAULT_GIVE_UP_S,
        timeout_s: float | None = None,
        start_timeout_s: float | None = None,
        demand: dict[str, float] | None = None,
    ) -> None:
        self.api = api
        self.job_id = job_id
        self.cursor = LogCursor(logs_out or sys.stdout)
        self.notes = notes or sys.stderr
        self.stream_logs = stream_logs
        self.give_up_after_s = give_up_after_s
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.demand = demand or {}  # the entrypoint's resources, named in the start-timeout message
        self.requests = 0
        self._wake = asyncio.Event()
        self._over = False
        self.last_info: dict[str, Any] | None = None

    def note(self, text: str) -> None:
        self.notes.write(f"rayjobs: {text}\n")
        self.notes.flush()

    def run(self) -> Outcome:
        """Follow the job (blocking). Ctrl-C propagates as KeyboardInterrupt; the job is left alone."""
        return asyncio.run(self._run())

    async def _run(self) -> Outcome:
        self._wake = asyncio.Event()
        log_task = asyncio.create_task(self._stream_logs()) if self.stream_logs else None
        try:
            outcome = await self._watch_status()
        finally:
            self._over = True
            if log_task is not None:
                log_task.cancel()
                await asyncio.gather(log_task, return_exceptions=True)
        if self.stream_logs and outcome.status in TERMINAL_STATUSES:
            await self._flush_logs()
        outcome.log_tail = self.cursor.tail_lines()
        return outcome

    async def _call(self, method: Any, *args: Any) -> Any:
        self.requests += 1
        return await asyncio.to_thread(method, *args)

    async def _watch_status(self) -> Outcome:
        interval = FIRST_POLL_S
        last_contact = time.monotonic()
        lost_since: float | None = None
        last_status: str | None = None
        stop_reason: str | None = None
        stop_sent_at: float | None = None
        while True:
            try:
                info = await self._call(self.api.get_job, self.job_id)
            except (AuthFailed, JobNotFound) as exc:
                if isinstance(exc, JobNotFound) and self.last_info is not None:
                    return Outcome(ExitCode.CLUSTER_UNREACHABLE, last_status, self.last_info,
                                   "the job disappeared from the cluster (deleted, or the cluster restarted)")
                raise
            except ClusterUnreachable as exc:
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    self.note(f"lost contact with the cluster ({exc}); retrying for up to "
                              f"{self.give_up_after_s:g}s — the job itself is not affected")
                if now - last_contact > self.give_up_after_s:
                    return Outcome(ExitCode.CLUSTER_UNREACHABLE, last_status, self.last_info,
                                   f"no answer from the cluster for {now - last_contact:.0f}s; the job's state is "
                                   f"unknown and it may still be running (check with `rayjobs status {self.job_id}`)")
                await self._sleep(min(2.0, interval * 2))
                continue
            now = time.monotonic()
            if lost_since is not None:
                self.note(f"contact with the cluster is back after {now - lost_since:.1f}s")
                lost_since = None
            last_contact = now
            self.last_info = info
            status = info.get("status")
            if status != last_status:
                if status not in TERMINAL_STATUSES:
                    self.note(f"job {self.job_id} is {status}")
                last_status = status
            if status in TERMINAL_STATUSES:
                if stop_reason is not None:
                    return Outcome(ExitCode.TIMEOUT, status, info, stop_reason)
                return Outcome(exit_code_for_status(status), status, info)
            if stop_reason is None:
                stop_reason = self._deadline_passed(info)
                if stop_reason is not None:
                    self.note(f"{stop_reason}; stopping the job")
                    try:
                        await self._call(self.api.stop_job, self.job_id)
                    except RayJobsError as exc:
                        self.note(f"could not stop the job: {exc}")
                    stop_sent_at = time.monotonic()
                    if status == "PENDING":
                        # Ray delivers a stop to the job's supervisor actor, which has not been
                        # scheduled yet: the stop takes effect once it gets its resources.
                        return Outcome(ExitCode.TIMEOUT, status, info,
                                       f"{stop_reason}. The stop is queued: Ray applies it as soon as the job "
                                       "gets its resources")
            elif stop_sent_at is not None and time.monotonic() - stop_sent_at > STOP_GRACE_S:
                return Outcome(ExitCode.TIMEOUT, status, info,
                               f"{stop_reason}; a stop was requested but the job is still {status}")
            await self._sleep(interval)
            interval = min(interval * 1.5, MAX_POLL_S)

    def _deadline_passed(self, info: dict[str, Any]) -> str | None:
        started_ms = info.get("start_time")
        if not started_ms:
            return None
        age_s = time.time() - started_ms / 1000
        status = info.get("status")
        if self.start_timeout_s is not None and status == "PENDING" and age_s > self.start_timeout_s:
            wanted = ", ".join(f"{name} {amount:g}" for name, amount in self.demand.items())
            return (f"the job was still PENDING after {self.start_timeout_s:g}s (start_timeout_s): the cluster could "
                    f"not start its entrypoint" + (f", which asks for {wanted}" if wanted else "")
                    + (f" — {info['message']}" if info.get("message") else ""))
        if self.timeout_s is not None and age_s > self.timeout_s:
            return f"the job ran past its timeout_s of {self.timeout_s:g}s"
        return None

    async def _sleep(self, seconds: float) -> None:
        # asyncio.wait rather than wait_for: on Python 3.11, wait_for can turn a Ctrl-C
        # cancellation that coincides with its timeout into a TimeoutError, and the
        # follower would go on polling after the user asked it to stop.
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()
        self._wake.clear()

    async def _stream_logs(self) -> None:
        import aiohttp

        url = self.api.address.replace("http", "ws", 1) + f"/api/jobs/{self.job_id}/logs/tail"
        verify = self.api.connection.verify
        ssl_option: Any = None
        if url.startswith("wss"):
            ssl_option = False if verify is False else (ssl.create_default_context(cafile=verify)
                                                        if isinstance(verify, str) else None)
        backoff = 0.5
        async with aiohttp.ClientSession(headers=self.api.connection.headers) as session:
            while not self._over:
                received = 0
                try:
                    self.requests += 1
                    async with session.ws_connect(url, ssl=ssl_option, heartbeat=30, max_msg_size=0) as ws:
                        async for message in ws:
                            if message.type != aiohttp.WSMsgType.TEXT:
                                break
                            self.cursor.feed(message.data, received)
                            received += len(message.data)
                            backoff = 0.5
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status in (400, 404):
                        return  # not a submission job: it has no log stream to follow
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    pass
                # The socket closed: either the job is over or the connection broke.
                # Let the status poll decide; reconnect if the job goes on.
                self._wake.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _flush_logs(self) -> None:
        # This one fetch is all that stands between the stream's last chunk and the log's
        # end (for a job that had already ended, it is the whole log), so a transient
        # fault is retried like the status poll rather than losing the end of the log.
        deadline = time.monotonic() + self.give_up_after_s
        delay = FIRST_POLL_S
        while True:
            try:
                logs = await self._call(self.api.get_logs, self.job_id)
                break
            except ClusterUnreachable as exc:
                if time.monotonic() + delay > deadline:
                    self.note(f"could not fetch the end of the log: {exc}")
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except RayJobsError as exc:
                self.note(f"could not fetch the end of the log: {exc}")
                return
        self.cursor.feed(logs, 0)
