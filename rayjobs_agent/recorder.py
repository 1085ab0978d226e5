"""One attempt's part of a run record: the log and events as they grow, and ``run.json`` merged with earlier attempts.

``run.json`` holds every attempt of a run (a retry, a later submission of the same run). An attempt
adds itself to the attempts it finds there and never writes a ``run.json`` that would drop one: when
the earlier one cannot be read, reading is tried again before each upload, and until it succeeds
only the log and the events are written (said once in the log, and at the end if it never does).
The events are not kept in memory: each is written out as it arrives, and only what ``run.json``
says of them (their count, the last report, restarts, the cluster's shape, notes) stays.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import stat
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from .record_layout import (ATTEMPTS_FIELD, EVENT_PART_SUFFIX, FORMAT_FIELD, FORMAT_VERSION, LOG_PART_SUFFIX,
                            RECORD_DIR, RECORD_ENV_VAR, RUN_FILE, SCHEMA_VERSION, SCHEMA_VERSION_FIELD, event_folder,
                            default_run_dir, log_folder, run_of_this_submission)
from .record_parts import DriverLog, LineBuffer, PartedFile
from .record_store import Store, Uploader, reason
from .usage import ResourceUsage
from .vocabulary import EVENT_MARKER, EventKind, decode, kind_of
from .wire import METADATA_ATTEMPT as ATTEMPT_KEY
from .wire import job_config
from .wire import SUBMISSION_ID_KEY, say

__all__ = ["RECORD_DIR", "RECORD_ENV_VAR", "RUN_FILE", "Recorder"]
# A part of the log is rewritten at each upload while it grows; finished parts are written once.
PART_BYTES = 8 * 1024 * 1024
# Events are small (a few hundred bytes): a part holds about a thousand, so the part rewritten at each
# upload stays small and a long run's events still come in a few dozen parts.
EVENT_PART_BYTES = 256 * 1024
_NOTES_KEPT = 20


class Recorder:
    """Keeps one attempt's part of a run's record in its storage."""

    def __init__(self, store: Any, config: dict[str, Any], job_config: dict[str, Any], log: Any,
                 environ: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.every_s = float(config.get("every_s") or 30)
        job_metadata = job_config.get("metadata") or {}
        self.submission_id = str(job_metadata.get(SUBMISSION_ID_KEY) or f"local-{os.getpid()}")
        self.attempt_number = int(job_metadata.get(ATTEMPT_KEY) or 1)
        # What does not change while the job runs is read once, not at every upload.
        self.code = {**(config.get("code") or {}), **packages(job_config.get("runtime_env") or {})}
        self.versions = versions()
        self.host = socket.gethostname()
        self.uploader = Uploader(store, clock)
        self.log_file = PartedFile(self.uploader, log_folder(self.submission_id), LOG_PART_SUFFIX,
                                   int(config.get("part_bytes") or PART_BYTES), cut_at_lines=False)
        self.event_file = PartedFile(self.uploader, event_folder(self.submission_id), EVENT_PART_SUFFIX,
                                     int(config.get("event_part_bytes") or EVENT_PART_BYTES), cut_at_lines=True)
        self.notes: list[str] = []
        if log is not None and not isinstance(log, DriverLog):
            mask, problem = secret_mask(os.environ if environ is None else environ, job_config)
            if problem is not None:
                self.note(problem)
            log = DriverLog(log, mask) if problem is None else None
        self.log: DriverLog | None = log
        self.event_lines = LineBuffer()  # the log's lines, read for the events among them
        self.event_summary = EventSummary()
        self.previous: list[dict[str, Any]] = []
        # Fields of the earlier run.json that this version does not write (a newer minor's, `reruns`): kept.
        self.previous_extra: dict[str, Any] = {}
        self.previous_known = False
        self.previous_error: str | None = None
        self._read_failures = 0
        self._next_read_at = 0.0
        self.started = time.time()
        # The attempts this submission ran before the current one (the agent ran the entrypoint again in place),
        # and why the current one failed, once the agent has decided.
        self.done_here: list[dict[str, Any]] = []
        self.between_attempts = False  # the last attempt failed, and the retry's wait runs
        self.cause: dict[str, Any] | None = None
        self._said_failure = False
        self._said_unread = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], config: dict[str, Any],
                         log: DriverLog | None = None) -> Recorder | None:
        """The recorder ``config`` (the record's variable, parsed) asks for, keeping ``log`` (the driver log, as the
        agent reads it); None (said in the log) when none can be kept."""
        try:
            config_of_job = job_config(environ)
            run_dir = (run_of_this_submission(config["run_dir"], environ) if config.get("run_dir")
                       else default_run_dir(config, config_of_job.get("metadata") or {}))
            return cls(Store.at(run_dir), config, config_of_job, log, environ)
        except Exception as exc:  # the record is a courtesy; the job must run whatever went wrong here
            say(f"no run record is kept: {reason(exc)}")
            return None

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events still in memory: the last report only (every event is in the record's event parts)."""
        return [self.event_summary.last_report] if self.event_summary.last_report else []

    @property
    def part(self) -> bytes:
        """The growing part of the saved log (masked), the latest of it."""
        return bytes(self.log_file.tail)

    def note(self, text: str) -> None:
        """Keep ``text`` in ``run.json``'s ``notes`` (something the record or the progress channel lacks, and why)."""
        if text not in self.notes and len(self.notes) < _NOTES_KEPT:
            self.notes.append(text)

    def start(self) -> None:
        """Take in the attempts an earlier submission of the same run recorded."""
        self._read_earlier()

    def failed_because(self, cause: dict[str, Any] | None) -> None:
        """Keep why the current attempt failed (the agent's decision)."""
        self.cause = cause

    def attempt_failed(self, exit_code: int) -> None:
        """The current attempt failed and the entrypoint runs again in this job after the retry's wait: the attempt
        is kept as it ended, and none is current until :meth:`next_attempt` (a stop during the wait starts none)."""
        self.read_log()  # the attempt's last lines and events (its last resource sample) are its own
        self.done_here.append(self.run_document("FAILED", exit_code)[ATTEMPTS_FIELD][-1])
        self.between_attempts = True

    def next_attempt(self) -> None:
        """The next attempt starts, now that the retry's wait is over."""
        self.between_attempts = False
        self.attempt_number += 1
        self.started = time.time()
        self.cause = None
        self.event_summary.usage = ResourceUsage()  # each attempt's use is its own: a run's total sums them

    def upload(self, status: str, exit_code: int | None = None) -> None:
        """Write what is new in the log, the events and ``run.json`` (``status`` is this attempt's)."""
        try:
            self.read_log(ended=status != "RUNNING")
            self.log_file.sync()
            self.event_file.sync()
            if not self.previous_known and self.clock() >= self._next_read_at:
                self._read_earlier()
            if self.previous_known:
                document = self.run_document(status, exit_code)
                self.uploader.put(RUN_FILE, json.dumps(document, indent=1, default=str).encode())
            elif not self._said_unread:
                self._said_unread = True
                say(f"{RUN_FILE} at {self.store.location} is not written until the earlier one can be read "
                    f"({self.previous_error}): writing it now would lose the attempts it holds")
            self.uploader.flush()
        except Exception as exc:  # a record keeper's bug must not reach the job either
            self.uploader.failed_uploads += 1
            self.uploader.last_error = reason(exc)
        if self.uploader.troubled() and not self._said_failure:
            self._said_failure = True
            say(f"the run record at {self.store.location} could not be written ({self.uploader.last_error}); "
                "the job goes on, and what was not written is tried again")

    def finish(self, status: str, exit_code: int | None, within_s: float) -> None:
        """The last uploads: what still waits is tried again for at most ``within_s``, then counted as lost.

        Storage that never took a write during the whole run is not waited for at all.
        """
        deadline = self.clock() + within_s
        self.upload(status, exit_code)
        while (self.uploader.pending or not self.previous_known) and self.uploader.written_ok:
            wake = min(([self.uploader.next_try_at] if self.uploader.pending else [])
                       + ([self._next_read_at] if not self.previous_known else []))
            if wake >= deadline:
                break
            self.sleep(max(0.0, wake - self.clock()))
            self.upload(status, exit_code)
        if not self.uploader.pending and self.previous_known and self.uploader.retried:
            # The last run.json counted the retries made until it was written; one more write says them all.
            self.upload(status, exit_code)
        self.uploader.give_up()
        if not self.previous_known:
            say(f"{RUN_FILE} was not written: the one at {self.store.location} could not be read "
                f"({self.previous_error}), and writing it would have lost the attempts it holds; this attempt's "
                f"log and events are in {RECORD_DIR}/")
        if self.uploader.troubled():
            say(f"run record: {summary(self.uploader.health())}")

    def run_document(self, status: str, exit_code: int | None) -> dict[str, Any]:
        """``run.json``: the run as of now, this attempt last."""
        now = round(time.time(), 3)
        attempt = {
            "submission_id": self.submission_id, "attempt": self.attempt_number, "host": self.host,
            "spec_hash": self.config.get("spec_hash"), "started": round(self.started, 3), "updated": now,
            "ended": now if status != "RUNNING" else None, "status": status, "exit_code": exit_code,
            "log_bytes": self.log_file.size, "log_parts": self.log_file.parts, "events": self.event_summary.count,
            "event_parts": self.event_file.parts, "cause": self.cause,
            "resources": self.event_summary.usage.as_dict(),
        }
        if self.between_attempts:
            # The failed attempt is the last until the next starts; its "updated" says the job is still alive
            # through a long wait (a record not updated for a while reads as LOST).
            attempts = self.previous + self.done_here[:-1] + [{**self.done_here[-1], "updated": now}]
        else:
            attempts = self.previous + self.done_here + [attempt]
        report = self.event_summary.last_report or {}
        document = {
            SCHEMA_VERSION_FIELD: SCHEMA_VERSION,
            FORMAT_FIELD: FORMAT_VERSION,
            "name": self.config.get("name"),
            "run_dir": self.store.location,
            "status": status,
            "started": attempts[0].get("started"),
            "ended": attempt["ended"],
            "spec": self.config.get("spec"),
            "spec_hash": self.config.get("spec_hash"),
            "code": self.code,
            "versions": self.versions,
            "cluster": self.event_summary.cluster,
            "metrics": report.get("metrics"),
            "iterations": report.get("iteration"),
            "epochs": report.get("epochs"),
            "restarts": self.event_summary.restarts,
            "cause": self.cause,
            "upload_every_s": self.every_s,
            "notes": self.notes + [note for note in self.event_summary.notes if note not in self.notes],
            "record_health": self.uploader.health(),
            **(self.config.get("links") or {}),  # rerun_of: the run this one reruns (`rayjobs rerun`)
            ATTEMPTS_FIELD: attempts,
        }
        return {**{key: value for key, value in self.previous_extra.items() if key not in document}, **document}

    def _read_earlier(self) -> None:
        try:
            earlier = self.store.read(RUN_FILE)
        except Exception as exc:  # tried again before the next upload, after a backoff
            self.previous_error = reason(exc)
            self._next_read_at = self.clock() + min(30.0, 0.5 * 2 ** self._read_failures)
            self._read_failures += 1
            return
        attempts: list[Any] = []
        if earlier:
            try:
                document = json.loads(earlier)
                attempts = document.get(ATTEMPTS_FIELD) or []
                self.previous_extra = {key: value for key, value in document.items()
                                       if key not in (ATTEMPTS_FIELD, SCHEMA_VERSION_FIELD, FORMAT_FIELD)}
            except (ValueError, AttributeError) as exc:
                # Not a run record (a hand edit, another program): kept aside whole, so that nothing is lost.
                aside = f"{RECORD_DIR}/{RUN_FILE}.unreadable-{self.submission_id}"
                self.uploader.put(aside, earlier)
                self.note(f"the earlier {RUN_FILE} was not a run record ({reason(exc)}); it is kept as {aside}")
        self.previous = [attempt for attempt in attempts
                         if isinstance(attempt, dict) and attempt.get("submission_id") != self.submission_id]
        self.previous_known = True

    def read_log(self, ended: bool = False) -> None:
        """Take in what the driver log holds that is new (an upload does, and the agent between uploads)."""
        if self.log is not None:
            for masked in self.log.read(ended):
                self._keep(masked)

    def add_event(self, event: dict[str, Any]) -> None:
        """Keep an event of the agent's own that is not in the log (a resource sample the log could not take)."""
        self.event_summary.take(event)
        self.event_file.append(json.dumps(event, separators=(",", ":"), default=str).encode() + b"\n")

    def _keep(self, masked: bytes) -> None:
        self.log_file.append(masked)
        marker = EVENT_MARKER.encode()
        for line in self.event_lines.feed(masked):
            # Events are read by the one rule every reader of the log follows (``vocabulary.decode``).
            if marker in line and (event := decode(line.decode("utf-8", "replace"))) is not None:
                self.add_event(event)


class EventSummary:
    """What ``run.json`` says of an attempt's events, taken in one at a time (the events themselves are not kept)."""

    def __init__(self) -> None:
        self.count = 0
        self.restarts = 0
        self.last_report: dict[str, Any] | None = None
        self.cluster: Any = None
        self.notes: list[str] = []
        self.usage = ResourceUsage()

    def take(self, event: dict[str, Any]) -> None:
        """Count ``event`` and keep what it says that ``run.json`` shows."""
        self.count += 1
        kind = kind_of(event)
        if kind == EventKind.REPORT:
            self.last_report = event
        elif kind == EventKind.RESTART:
            self.restarts += 1
        elif kind == EventKind.PROGRESS_UNAVAILABLE and len(self.notes) < _NOTES_KEPT:
            self.notes.append(f"progress unavailable: {event.get('reason')}")
        if kind in (EventKind.RESOURCES, EventKind.REPORT):
            self.usage.take(event)
        if event.get("cluster"):
            self.cluster = event["cluster"]


def summary(health: dict[str, Any]) -> str:
    """``record_health`` in one line for the end of the log."""
    lost = health["lost"]
    text = (f"{health['failed_uploads']} writes failed, {health['retried']} went through when tried again, "
            f"{lost['writes']} lost ({lost['bytes']} bytes)")
    return f"{text}; last error: {health['last_error']}" if health.get("last_error") else text


def secret_mask(environ: Mapping[str, str], job_config: dict[str, Any]) -> tuple[Any, str | None]:
    """The mask of every secret of the job's environment (``masking.environment_mask``), or why there is none.

    Returns ``(mask, None)``, or ``(None, reason)`` when the mask cannot be built: the log is then not
    copied at all rather than copied unmasked.
    """
    try:
        from .masking import environment_mask

        return environment_mask(environ), None
    except Exception as exc:  # noqa: BLE001 - a broken mask must not let one secret through
        return None, f"secrets could not be masked ({reason(exc)}), so no copy of the log is kept"


def packages(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """The content-addressed packages the job's code came in (Ray names each by a hash of its files)."""
    found: dict[str, Any] = {}
    if isinstance(runtime_env.get("working_dir"), str):
        found["working_dir_package"] = runtime_env["working_dir"].rpartition("/")[2]
    modules = [module.rpartition("/")[2] for module in runtime_env.get("py_modules") or [] if isinstance(module, str)]
    if modules:
        found["py_modules_packages"] = modules
    return found


def versions() -> dict[str, str | None]:
    """Python's version and those of the packages a run's results depend on most."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("ray", "torch", "torchvision", "transformers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def open_own_log(environ: Mapping[str, str]) -> DriverLog | None:
    """This process's stdout, the job's driver log (Ray points it at a file), to read from the start as it grows,
    masked by the job's secrets; None (said once) when it is no file or the secrets cannot be masked."""
    try:
        if not stat.S_ISREG(os.fstat(1).st_mode):
            say("the driver log is not a file here, so no copy of it is kept and no cause is read from it")
            return None
        mask, problem = secret_mask(environ, {})
        if problem is not None:
            say(problem)
            return None
        return DriverLog(open(f"/proc/{os.getpid()}/fd/1", "rb"), mask)
    except OSError as exc:
        say(f"the driver log cannot be read here ({reason(exc)}), so no copy of it is kept")
        return None


