"""Following a job to its end: status polling plus a live log stream.

The log is read as raw bytes from Ray's state API (``/api/v0/logs/stream`` for the
driver log), so bytes that are not valid UTF-8 reach the user as U+FFFD instead of
breaking the whole log, as they break the job API's text endpoints. The follower counts
the bytes it has printed; when the connection drops while the job still runs, it asks
for a tail of the log that reaches back a little before that point and skips what it
already printed (``runner.client.log_resume``), so no line is lost or repeated and a long log is
not downloaded again on every reconnect. Status is polled separately over REST; the job
is over only when the status says so, never because a stream ended. Once it is over, one
last fetch of the log's tail delivers whatever the stream had not. Clusters without the
state API are followed through the job API's websocket. Every request goes through the
cluster client (``runner.client.jobs_api.JobsApi``); the follower builds no URL and opens no connection.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from runner.reporter import Reporter
from jobs.secrets import job_mask
from jobs.infra.status import JobStatus, is_terminal
from runner.client.jobs_api import JobsApi
from runner.backoff import Backoff, Deadline
from runner.errors import AuthFailed, ClusterUnreachable, JobNotFound, NoLogApi, RayJobsError
from runner.errors import ExitCode, exit_code_for_status
from runner.follow.log_cursor import LogCursor
from runner.client.log_resume import LogChunk, Misaligned, ResumePlan, plan_resume

FIRST_POLL_S = 0.2
MAX_POLL_S = 1.0
# Between the two, status is polled at this fraction of the time followed so far, so a job's end is
# seen within about a tenth of its run time: a job of a second or two is not kept waiting most of a
# second for the poll that sees it end, and from ten seconds on it is one request a second.
POLL_FRACTION = 0.1
MAX_RETRY_S = 2.0
DEFAULT_GIVE_UP_S = 60.0
STOP_GRACE_S = 60.0
FIRST_LOG_RECONNECT_S = 0.5
MAX_LOG_RECONNECT_S = 5.0
_FLUSH_SERVER_ERRORS = 3


@dataclass
class Outcome:
    """How following a job ended."""

    exit_code: ExitCode
    status: str | None
    info: dict[str, Any] | None
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)


class PollCadence:
    """Delays between status polls: FIRST_POLL_S, then POLL_FRACTION of the time since it was made, at most
    MAX_POLL_S."""

    def __init__(self) -> None:
        self._since = time.monotonic()

    def next_delay(self) -> float:
        """The delay to wait now."""
        return min(MAX_POLL_S, max(FIRST_POLL_S, POLL_FRACTION * (time.monotonic() - self._since)))

    peek = next_delay


class Follower:
    """Follows one job until it is SUCCEEDED, FAILED or STOPPED, or contact is lost for too long.

    Every request goes through ``api`` (the cluster client): status polls, stops, and log tails.
    """

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
        new_stall: Callable[[], float | None] | None = None,
        on_stall: Callable[[float, dict[str, Any]], None] | None = None,
        on_info: Callable[[dict[str, Any]], None] | None = None,
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
        # While the job runs, new_stall() is asked for a stall judged since (by the agent beside the job, or by the
        # same judge run on this side for a job without it); on_stall answers each (the stacks, which only the
        # client can take). on_info is told the job's status at each read.
        self.new_stall, self.on_stall, self.on_info = new_stall, on_stall, on_info
        # Made in _run, inside the event loop that waits on them (each run() has a loop of its own).
        self._wake: asyncio.Event
        self._driver_known: asyncio.Event
        self._driver_node: str | None = None
        self._legacy_logs = False
        self._log_reconnect = Backoff(FIRST_LOG_RECONNECT_S, MAX_LOG_RECONNECT_S)
        self._escalation = 0  # tails in a row that missed the resume point
        self._over = False
        self.last_info: dict[str, Any] | None = None

    def note(self, text: str) -> None:
        """Print one of rayjobs' own lines (``rayjobs: …``) to ``notes``."""
        Reporter(self.notes).say(text)

    def run(self) -> Outcome:
        """Follow the job (blocking).

        Returns:
            How it ended: its status and exit code, or CLUSTER_UNREACHABLE / TIMEOUT with a reason.

        Raises:
            KeyboardInterrupt: Ctrl-C; the job is left alone.
            AuthFailed, JobNotFound: on the first status call (an unknown id, refused credentials).
        """
        return asyncio.run(self._run())

    async def _run(self) -> Outcome:
        self._wake = asyncio.Event()
        self._driver_known = asyncio.Event()
        if not self.stream_logs:
            return await self._watch_status()
        log_task = asyncio.create_task(self._stream_logs())
        try:
            outcome = await self._watch_status()
        finally:
            self._over = True
            log_task.cancel()
            await asyncio.gather(log_task, return_exceptions=True)
        if is_terminal(outcome.status):
            await self._flush_logs(outcome.info)
        self.cursor.finish()
        outcome.log_tail = self.cursor.tail_lines()
        return outcome

    async def _call(self, method: Any, *args: Any) -> Any:
        return await asyncio.to_thread(method, *args)

    async def _watch_status(self) -> Outcome:
        poll = PollCadence()
        retry = Backoff(MAX_RETRY_S, MAX_RETRY_S)
        contact = Deadline(self.give_up_after_s)
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
                if lost_since is None:
                    lost_since = time.monotonic()
                    was_lost = True
                    reasons_seen = {str(exc)}
                    retry = Backoff(min(MAX_RETRY_S, poll.peek() * 2), MAX_RETRY_S)
                    # A network fault and a dead head look the same from here, so claim neither.
                    self.note(f"lost contact with the cluster ({exc}): the cluster stopped answering, so the "
                              f"job's state is unknown until it answers again; retrying for up to "
                              f"{self.give_up_after_s:g}s")
                elif str(exc) not in reasons_seen:
                    # A proxy's 502 after a timeout says more than the timeout did: name each new cause once.
                    reasons_seen.add(str(exc))
                    self.note(f"still no answer from the cluster: {exc}")
                if contact.left() < 0:
                    return Outcome(ExitCode.CLUSTER_UNREACHABLE, last_status, self.last_info,
                                   f"no answer from the cluster for {time.monotonic() - last_contact:.0f}s; the "
                                   f"job's state is unknown and it may still be running (check with "
                                   f"`rayjobs status {self.job_id}`)")
                await self._sleep(retry.next_delay())
                continue
            if lost_since is not None:
                self.note(f"contact with the cluster is back after {time.monotonic() - lost_since:.1f}s")
                lost_since = None
            last_contact = time.monotonic()
            contact = Deadline(self.give_up_after_s)
            self.last_info = info
            if self.on_info is not None:
                self.on_info(info)
            if not self._driver_known.is_set() and (info.get("driver_node_id") or "driver_node_id" not in info):
                self._driver_node = info.get("driver_node_id")
                self.cursor.mask_with(job_mask(info))  # before the log's first byte, which waits for the driver
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
            if status == JobStatus.RUNNING:
                await self._watch_for_a_stall(info)
            if stop_reason is None:
                stop_reason = self._deadline_passed(info)
                if stop_reason is not None:
                    self.note(f"{stop_reason}; stopping the job")
                    try:
                        await self._call(self.api.stop_job, self.job_id)
                    except RayJobsError as exc:
                        self.note(f"could not stop the job: {exc}")
                    stop_sent_at = time.monotonic()
                    if status == JobStatus.PENDING:
                        # Ray delivers a stop to the job's supervisor actor, which has not been
                        # scheduled yet: the stop takes effect once it gets its resources.
                        return Outcome(ExitCode.TIMEOUT, status, info,
                                       f"{stop_reason}. The stop is queued: Ray applies it as soon as the job "
                                       "gets its resources")
            elif stop_sent_at is not None and time.monotonic() - stop_sent_at > STOP_GRACE_S:
                return Outcome(ExitCode.TIMEOUT, status, info,
                               f"{stop_reason}; a stop was requested but the job is still {status}")
            await self._sleep(poll.next_delay())

    async def _watch_for_a_stall(self, info: dict[str, Any]) -> None:
        if self.new_stall is None or self.on_stall is None:
            return
        # A thread: for a job without the agent, judging may ask the cluster what it has pending.
        silent_s = await asyncio.to_thread(self.new_stall)
        if silent_s is not None:
            await asyncio.to_thread(self.on_stall, silent_s, info)

    def _deadline_passed(self, info: dict[str, Any]) -> str | None:
        started_ms = info.get("start_time")
        if not started_ms:
            return None
        age_s = time.time() - started_ms / 1000
        status = info.get("status")
        if self.start_timeout_s is not None and status == JobStatus.PENDING and age_s > self.start_timeout_s:
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
        # The log client (aiohttp, about 0.1 s to import) is loaded while the job starts, so that
        # neither the first log request nor the one fetch after a short job ends waits for it.
        await asyncio.to_thread(importlib.import_module, "aiohttp")
        waiter = asyncio.ensure_future(self._driver_known.wait())
        try:
            await waiter
        finally:
            waiter.cancel()
        # Known but None: a Ray too old to name the driver's node, so no state API log either.
        if self._driver_node is None or not await self._stream_driver_log():
            self._legacy_logs = True
            await self._stream_websocket()

    async def _stream_driver_log(self) -> bool:
        """Follow the driver log's raw bytes through the state API; False if the cluster has no such API."""
        while not self._over:
            plan = self._resume_plan()
            try:
                await self._print_tail(plan, follow=True)
            except NoLogApi:
                return False
            except Misaligned:
                self._escalation += 1
                continue
            except RayJobsError:
                pass
            await self._before_reconnect()
        return True

    async def _print_tail(self, plan: ResumePlan, follow: bool) -> None:
        assert self._driver_node is not None
        tail = self.api.tail_job_logs(self.job_id, node_id=self._driver_node, resume=plan, follow=follow)
        async with aclosing(tail) as chunks:
            async for chunk in chunks:
                self._print(chunk)
                if not plan.replay or chunk.end > plan.resume_at:
                    self._escalation = 0  # at or past the resume point: the next reconnect may try a tail again

    def _print(self, chunk: LogChunk) -> None:
        self.cursor.feed(chunk.data, chunk.offset)
        if chunk.data:
            self._log_reconnect.reset()

    async def _before_reconnect(self) -> None:
        # The stream ended: either the job is over or the connection broke.
        # Let the status poll decide; reconnect if the job goes on.
        self._wake.set()
        await asyncio.sleep(self._log_reconnect.next_delay())

    def _resume_plan(self) -> ResumePlan:
        silent_s = time.monotonic() - (self.cursor.last_byte_at or time.monotonic())
        expected = self.cursor.lines_per_s() * silent_s
        return plan_resume(self.cursor.kept(), self.cursor.written, expected, self._escalation)

    async def _stream_websocket(self) -> None:
        # Clusters without the state API: the job API's websocket replays the log from its
        # start as text on every connection; what was printed is skipped by its offset.
        while not self._over:
            try:
                async with aclosing(self.api.tail_job_logs_websocket(self.job_id)) as chunks:
                    async for chunk in chunks:
                        self._print(chunk)
            except NoLogApi:
                return  # not a submission job: it has no log stream to follow
            except RayJobsError:
                pass
            await self._before_reconnect()

    async def _flush_logs(self, info: dict[str, Any] | None) -> None:
        # This one fetch is all that stands between the stream's last chunk and the log's
        # end (for a job that had already ended, it is the whole log), so a transient
        # fault is retried like the status poll rather than losing the end of the log.
        self._driver_node = self._driver_node or (info or {}).get("driver_node_id")
        if self._driver_node is None and "driver_node_id" in (info or {}):
            return  # the job ended before its driver started: it has no log
        deadline = Deadline(self.give_up_after_s)
        backoff = Backoff(FIRST_POLL_S, MAX_RETRY_S)
        server_errors = 0
        while True:
            try:
                if self._legacy_logs or self._driver_node is None:
                    logs = await self._call(self.api.get_logs, self.job_id)
                    self.cursor.feed(logs.encode(), 0)
                    return
                await self._print_tail(self._resume_plan(), follow=False)
                return
            except NoLogApi:
                self._legacy_logs = True
                continue
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
                failure = exc
            delay = backoff.next_delay()
            if not deadline.allows(delay):
                self.note(f"could not fetch the end of the log: {failure}")
                return
            await asyncio.sleep(delay)


def _vanished(job_id: str, last_status: str | None, came_back: bool) -> str:
    if came_back:
        return (f"the cluster answers again but no longer knows job {job_id}: its head was most likely restarted "
                f"without GCS persistence, which forgets every job (or the job was deleted meanwhile); the last "
                f"state seen was {last_status}, and a job does not outlive its head, so it most likely ended with it")
    return (f"job {job_id} disappeared from the cluster while it was {last_status} (deleted, or its head was "
            "restarted without GCS persistence)")
