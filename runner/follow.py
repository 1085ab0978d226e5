"""Following a job to its end: status polling plus a live log stream.

The log is read as raw bytes from Ray's state API (``/api/v0/logs/stream`` for the
driver log), so bytes that are not valid UTF-8 reach the user as U+FFFD instead of
breaking the whole log, as they break the job API's text endpoints. The follower counts
the bytes it has printed; when the connection drops while the job still runs, it asks
for a tail of the log that reaches back a little before that point and skips what it
already printed (``runner.log_resume``), so no line is lost or repeated and a long log is
not downloaded again on every reconnect. Status is polled separately over REST; the job
is over only when the status says so, never because a stream ended. Once it is over, one
last fetch of the log's tail delivers whatever the stream had not. Clusters without the
state API are followed through the job API's websocket, as before.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, TextIO

from jobs.status import is_terminal
from runner.api import JobsApi, last_line
from runner.errors import AuthFailed, ClusterRequestFailed, ClusterUnreachable, JobNotFound, RayJobsError
from runner.exit_codes import ExitCode, exit_code_for_status
from runner.log_resume import KEPT_BYTES, Misaligned, ResumePlan, TailAligner, plan_resume

FIRST_POLL_S = 0.2
MAX_POLL_S = 1.0
DEFAULT_GIVE_UP_S = 60.0
STOP_GRACE_S = 60.0
_LOG_POLL_S = 0.5  # how often Ray's log agent looks for new bytes in a followed file
_FIRST_LOG_BACKOFF_S = 0.5
_ALIGN_IDLE_S = 5.0  # a tail arrives at once; this long without its resume point means it has none
_FILE_FETCH_TIMEOUT_S = 300
_PARTIAL_LINE_CHARS = 4096
_KEPT_SLACK_BYTES = 1 << 20
_FLUSH_SERVER_ERRORS = 3
# No overall limit: a followed log stays open as long as the job runs.
_STREAM_TIMEOUT_S = {"total": None, "sock_connect": 10}


@dataclass
class Outcome:
    """How following a job ended."""

    exit_code: ExitCode
    status: str | None
    info: dict[str, Any] | None
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)


class LogCursor:
    """Prints the new part of a log whose bytes arrive (possibly again) at known offsets.

    Offsets count the log's raw bytes, so text delivered twice, or by two different
    sources, is printed once. Bytes that are not valid UTF-8 are shown as U+FFFD; a
    character split between two deliveries is decoded whole.
    """

    def __init__(self, out: TextIO, keep_lines: int = 20) -> None:
        self.out = out
        self.written = 0
        self.lines = 0
        self.first_byte_at: float | None = None
        self.last_byte_at: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._partial = ""
        self._kept = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, chunk: bytes, start: int) -> None:
        """``chunk`` holds the log's bytes ``start`` … ``start + len(chunk)``."""
        end = start + len(chunk)
        if end <= self.written:
            return
        new = chunk[max(0, self.written - start):]
        self.written = end
        self.lines += new.count(b"\n")
        self.last_byte_at = time.monotonic()
        if self.first_byte_at is None:
            self.first_byte_at = self.last_byte_at
        self._kept += new
        if len(self._kept) > KEPT_BYTES + _KEPT_SLACK_BYTES:
            del self._kept[:len(self._kept) - KEPT_BYTES]
        self._write(self._decoder.decode(new))

    def finish(self) -> None:
        """The log is complete: an incomplete character at its very end is shown as U+FFFD."""
        self._write(self._decoder.decode(b"", final=True))

    def kept(self) -> bytes:
        """The last bytes printed (up to ``KEPT_BYTES``), to find the resume point in a tail."""
        with memoryview(self._kept) as kept:  # one copy, not two
            return bytes(kept[-KEPT_BYTES:])

    def lines_per_s(self) -> float:
        if self.first_byte_at is None or self.last_byte_at is None:
            return 0.0
        return self.lines / max(1.0, self.last_byte_at - self.first_byte_at)

    def tail_lines(self) -> list[str]:
        """The last lines printed, each as a terminal shows it (after its last carriage return)."""
        lines = list(self.tail) + ([self._partial] if self._partial else [])
        shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]
        return shown[-(self.tail.maxlen or len(shown)):]

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.out.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show U+FFFD (or the job's own characters)
            encoding = self.out.encoding or "ascii"
            self.out.write(text.encode(encoding, "replace").decode(encoding))
        self.out.flush()
        lines = (self._partial + text).split("\n")
        # A line without end (a progress bar redrawn with \r for hours) must not grow without bound.
        self._partial = lines.pop()[-_PARTIAL_LINE_CHARS:]
        self.tail.extend(line[-_PARTIAL_LINE_CHARS:] for line in lines)


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
        self._driver_known = asyncio.Event()
        self._driver_node: str | None = None
        self._legacy_logs = False
        self._log_backoff = _FIRST_LOG_BACKOFF_S
        self._escalation = 0  # tails in a row that missed the resume point
        self._over = False
        self.last_info: dict[str, Any] | None = None
        verify = api.connection.verify
        self._ssl_option: Any = True  # aiohttp's default verification; ignored for http
        if api.address.startswith("https") and verify is not True:
            self._ssl_option = False if verify is False else ssl.create_default_context(cafile=verify)

    def note(self, text: str) -> None:
        self.notes.write(f"rayjobs: {text}\n")
        self.notes.flush()

    def run(self) -> Outcome:
        """Follow the job (blocking). Ctrl-C propagates as KeyboardInterrupt; the job is left alone."""
        return asyncio.run(self._run())

    async def _run(self) -> Outcome:
        self._wake = asyncio.Event()
        self._driver_known = asyncio.Event()
        if not self.stream_logs:
            return await self._watch_status()
        import aiohttp

        async with aiohttp.ClientSession(headers=self.api.connection.headers) as session:
            log_task = asyncio.create_task(self._stream_logs(session))
            try:
                outcome = await self._watch_status()
            finally:
                self._over = True
                log_task.cancel()
                await asyncio.gather(log_task, return_exceptions=True)
            if is_terminal(outcome.status):
                await self._flush_logs(session, outcome.info)
        self.cursor.finish()
        outcome.log_tail = self.cursor.tail_lines()
        return outcome

    async def _call(self, method: Any, *args: Any) -> Any:
        self.requests += 1
        return await asyncio.to_thread(method, *args)

    async def _watch_status(self) -> Outcome:
        interval = FIRST_POLL_S
        last_contact = time.monotonic()
        lost_since: float | None = None
        reasons_seen: set[str] = set()
        last_status: str | None = None
        stop_reason: str | None = None
        stop_sent_at: float | None = None
        was_lost = False
        while True:
            try:
                info = await self._call(self.api.get_job, self.job_id)
            except (AuthFailed, JobNotFound) as exc:
                if isinstance(exc, JobNotFound) and self.last_info is not None:
                    return Outcome(ExitCode.CLUSTER_UNREACHABLE, last_status, self.last_info,
                                   _vanished(self.job_id, last_status, came_back=was_lost))
                raise
            except ClusterUnreachable as exc:
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    was_lost = True
                    reasons_seen = {str(exc)}
                    # A network fault and a dead head look the same from here, so claim neither.
                    self.note(f"lost contact with the cluster ({exc}): the cluster stopped answering, so the "
                              f"job's state is unknown until it answers again; retrying for up to "
                              f"{self.give_up_after_s:g}s")
                elif str(exc) not in reasons_seen:
                    # A proxy's 502 after a timeout says more than the timeout did: name each new cause once.
                    reasons_seen.add(str(exc))
                    self.note(f"still no answer from the cluster: {exc}")
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
            if not self._driver_known.is_set() and (info.get("driver_node_id") or "driver_node_id" not in info):
                self._driver_node = info.get("driver_node_id")
                self._driver_known.set()
            status = info.get("status")
            if status != last_status:
                if not is_terminal(status):
                    self.note(f"job {self.job_id} is {status}")
                last_status = status
            if is_terminal(status):
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

    async def _stream_logs(self, session: Any) -> None:
        waiter = asyncio.ensure_future(self._driver_known.wait())
        try:
            await waiter
        finally:
            waiter.cancel()
        # Known but None: a Ray too old to name the driver's node, so no state API log either.
        if self._driver_node is None or not await self._stream_driver_log(session):
            self._legacy_logs = True
            await self._stream_websocket(session)

    async def _stream_driver_log(self, session: Any) -> bool:
        """Follow the driver log's raw bytes through the state API; False if the cluster has no such API."""
        while not self._over:
            plan = self._resume_plan()
            try:
                self.requests += 1
                async with session.get(self._driver_log_url("stream", plan.lines), ssl=self._ssl_option,
                                       timeout=_stream_timeout()) as response:
                    if response.status == 404:
                        return False
                    if response.status == 200:
                        await self._consume(response.content, plan)
            except Misaligned:
                self._escalation += 1
                continue
            except (_aiohttp_errors(), asyncio.TimeoutError, OSError):
                pass
            await self._before_reconnect()
        return True

    async def _before_reconnect(self) -> None:
        # The stream ended: either the job is over or the connection broke.
        # Let the status poll decide; reconnect if the job goes on.
        self._wake.set()
        await asyncio.sleep(self._log_backoff)
        self._log_backoff = min(self._log_backoff * 2, 5.0)

    async def _consume(self, body: Any, plan: ResumePlan) -> None:
        """Feed a response body that starts at the log's byte 0 (a replay) or at a tail that holds ``plan``'s anchor."""
        offset = 0
        if not plan.replay:
            aligner = TailAligner(plan)
            while True:
                chunk = await _read_within(body, _ALIGN_IDLE_S)
                if chunk is None and not aligner.buffer and not aligner.dropped:
                    raise asyncio.TimeoutError  # nothing came at all: a network fault, not a short tail
                if not chunk:  # the tail is over (a stream sends it at once, then waits for new bytes)
                    raise Misaligned("the tail ended before the resume point")
                resume_index = aligner.add(chunk)
                if resume_index is not None:
                    self._escalation = 0
                    self.cursor.feed(bytes(aligner.buffer[resume_index:]), plan.resume_at)
                    offset = plan.resume_at + len(aligner.buffer) - resume_index
                    break
        while chunk := await body.readany():
            self.cursor.feed(chunk, offset)
            offset += len(chunk)
            self._log_backoff = _FIRST_LOG_BACKOFF_S
            if offset > plan.resume_at:
                self._escalation = 0  # past the resume point: the next reconnect may try a tail again

    def _resume_plan(self) -> ResumePlan:
        silent_s = time.monotonic() - (self.cursor.last_byte_at or time.monotonic())
        expected = self.cursor.lines_per_s() * silent_s
        return plan_resume(self.cursor.kept(), self.cursor.written, expected, self._escalation)

    def _driver_log_url(self, media: str, lines: int) -> str:
        query = {"submission_id": self.job_id, "node_id": self._driver_node, "lines": lines}
        if media == "stream":
            query["interval"] = _LOG_POLL_S
        else:
            query["timeout"] = _FILE_FETCH_TIMEOUT_S  # Ray's default of 30 s cuts a large log short
        return f"{self.api.address}/api/v0/logs/{media}?{urllib.parse.urlencode(query)}"

    async def _stream_websocket(self, session: Any) -> None:
        # Clusters without the state API: the job API's websocket replays the log from its
        # start as text on every connection, so what was printed is skipped by its encoded length.
        import aiohttp

        url = self.api.address.replace("http", "ws", 1) + f"/api/jobs/{self.job_id}/logs/tail"
        while not self._over:
            received = 0
            try:
                self.requests += 1
                async with session.ws_connect(url, ssl=self._ssl_option, heartbeat=30, max_msg_size=0) as ws:
                    async for message in ws:
                        if message.type != aiohttp.WSMsgType.TEXT:
                            break
                        data = message.data.encode()
                        self.cursor.feed(data, received)
                        received += len(data)
                        self._log_backoff = _FIRST_LOG_BACKOFF_S
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status in (400, 404):
                    return  # not a submission job: it has no log stream to follow
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            await self._before_reconnect()

    async def _flush_logs(self, session: Any, info: dict[str, Any] | None) -> None:
        # This one fetch is all that stands between the stream's last chunk and the log's
        # end (for a job that had already ended, it is the whole log), so a transient
        # fault is retried like the status poll rather than losing the end of the log.
        self._driver_node = self._driver_node or (info or {}).get("driver_node_id")
        if self._driver_node is None and "driver_node_id" in (info or {}):
            return  # the job ended before its driver started: it has no log
        deadline = time.monotonic() + self.give_up_after_s
        delay = FIRST_POLL_S
        server_errors = 0
        while True:
            try:
                if self._legacy_logs or self._driver_node is None:
                    logs = await self._call(self.api.get_logs, self.job_id)
                    self.cursor.feed(logs.encode(), 0)
                    return
                plan = self._resume_plan()
                self.requests += 1
                async with session.get(self._driver_log_url("file", plan.lines), ssl=self._ssl_option,
                                       timeout=_stream_timeout()) as response:
                    if response.status == 404:
                        self._legacy_logs = True
                        continue
                    if response.status != 200:
                        raise ClusterRequestFailed(f"the cluster answered {response.status} "
                                                   f"{last_line(await response.text(errors='replace'))}")
                    await self._consume(response.content, plan)
                    return
            except Misaligned:
                self._escalation += 1
                continue
            except RayJobsError as exc:
                # A server error may pass (Ray answers 500 while the log's node is briefly out
                # of reach), but a few in a row are not going to.
                server_errors += not isinstance(exc, ClusterUnreachable)
                if server_errors >= (_FLUSH_SERVER_ERRORS if not self._legacy_logs else 1):
                    self.note(f"could not fetch the end of the log: {exc}")
                    return
                failure: Exception = exc
            except (_aiohttp_errors(), asyncio.TimeoutError, OSError) as exc:
                failure = ClusterUnreachable(f"the log download broke off ({type(exc).__name__})")
            if time.monotonic() + delay > deadline:
                self.note(f"could not fetch the end of the log: {failure}")
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _read_within(body: Any, seconds: float) -> bytes | None:
    """The next chunk of ``body`` (b"" at its end), or None if none came within ``seconds``."""
    reader = asyncio.ensure_future(body.readany())
    try:
        await asyncio.wait({reader}, timeout=seconds)
    finally:
        if not reader.done():
            reader.cancel()
    return reader.result() if reader.done() and not reader.cancelled() else None


def _aiohttp_errors() -> type[Exception]:
    import aiohttp

    return aiohttp.ClientError


def _stream_timeout() -> Any:
    import aiohttp

    return aiohttp.ClientTimeout(**_STREAM_TIMEOUT_S)


def _vanished(job_id: str, last_status: str | None, came_back: bool) -> str:
    if came_back:
        return (f"the cluster answers again but no longer knows job {job_id}: its head was most likely restarted "
                f"without GCS persistence, which forgets every job (or the job was deleted meanwhile); the last "
                f"state seen was {last_status}, and a job does not outlive its head, so it most likely ended with it")
    return (f"job {job_id} disappeared from the cluster while it was {last_status} (deleted, or its head was "
            "restarted without GCS persistence)")
