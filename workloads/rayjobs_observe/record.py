"""The run record, kept by the job itself: ``python -m rayjobs_observe.record -- ENTRYPOINT``.

``rayjobs submit`` wraps the entrypoint of every job that uploads code in this module. It runs the
entrypoint as Ray would (a shell command, in this process group, writing to the same log file), and
while it runs keeps the run's record up to date in the run's own storage, a local folder or ``s3://``:

    RUN/run.json                          what ran (spec, code, versions, cluster) and how each attempt went
    RUN/run-record/logs/ID/NNNNN.log      the driver log of submission ID, in parts of at most PART_BYTES
    RUN/run-record/events/ID.jsonl        the progress events in that log

every ``every_s`` seconds and once more at the end. The job writes its own record so that it is there
with nobody following (``--no-wait``, a KubeRay RayJob) and survives the cluster: a head node that dies
mid-run leaves the log complete up to the last upload. Nothing here can fail the job: a record that
cannot be written is said once in the log, and the entrypoint runs on regardless.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import stat
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from .events import EVENT_MARKER

RECORD_ENV_VAR = "RAYJOBS_RECORD"
RUN_FILE = "run.json"
RECORD_DIR = "run-record"
# A part of the log is rewritten at each upload while it grows; finished parts are written once.
PART_BYTES = 8 * 1024 * 1024
FORMAT_VERSION = 1
# Ray hands every job's driver its runtime_env (with the uploaded packages' URIs) and metadata here.
JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
_SUBMISSION_ID_KEY = "job_submission_id"
# What rayjobs adds to a retried attempt's metadata (jobs/keys.py on the client; a test holds them equal).
ATTEMPT_KEY = "rayjobs.attempt"
PARENT_KEY = "rayjobs.parent"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_S = 0.25
# How long the entrypoint's orphaned processes may go on writing to the log after its shell has ended.
_ORPHANS_GRACE_S = 5.0
_PR_SET_CHILD_SUBREAPER = 36
_ORPHAN_UPLOAD_S = 0.5


def main(argv: list[str]) -> int:
    """Run ``argv`` (``-- ENTRYPOINT``) and keep its record; returns (or dies of) what the entrypoint did."""
    args = argv[1:] if argv and argv[0] == "--" else argv
    if len(args) != 1:
        print("usage: python -m rayjobs_observe.record -- 'ENTRYPOINT'", file=sys.stderr)
        return 2
    stop_signal: list[int] = []
    for signum in _STOP_SIGNALS:
        # Ray's stop signals the whole process tree; the entrypoint gets it from Ray, this process only notes it.
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))
    recorder = Recorder.from_environment(os.environ)
    adopts_orphans = _become_subreaper()
    child = subprocess.Popen(args[0], shell=True)
    if recorder is not None:
        recorder.start()
    next_upload = time.monotonic()
    while child.poll() is None:
        if recorder is not None and time.monotonic() >= next_upload:
            recorder.upload("RUNNING")
            next_upload = time.monotonic() + recorder.every_s
        try:
            child.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    code = child.returncode
    outcome = "STOPPED" if stop_signal else ("SUCCEEDED" if code == 0 else "FAILED")
    if recorder is not None:
        recorder.upload(outcome, exit_code=code)
    if adopts_orphans:
        # Uploaded first and then as the log grows: Ray kills what is left of a stopped job a few
        # seconds after its stop signal, and a driver shutting down takes about that long.
        upload = (lambda: recorder.upload(outcome, exit_code=code)) if recorder is not None else None
        _wait_for_orphans(time.monotonic() + _ORPHANS_GRACE_S, upload)
    if code < 0:
        # Die of the entrypoint's signal, so that Ray sees what it would have seen without this wrapper.
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


class Recorder:
    """Keeps one attempt's part of a run's record in its storage."""

    def __init__(self, store: Store, config: dict[str, Any], job_config: dict[str, Any]) -> None:
        self.store = store
        self.config = config
        self.every_s = float(config.get("every_s") or 30)
        self.part_bytes = int(config.get("part_bytes") or PART_BYTES)
        job_metadata = job_config.get("metadata") or {}
        self.submission_id = str(job_metadata.get(_SUBMISSION_ID_KEY) or f"local-{os.getpid()}")
        self.attempt_number = int(job_metadata.get(ATTEMPT_KEY) or 1)
        # What does not change while the job runs is read once, not at every upload.
        self.code = {**(config.get("code") or {}), **packages(job_config.get("runtime_env") or {})}
        self.versions = versions()
        self.host = socket.gethostname()
        self.log = _open_own_log()
        self.tail_written: tuple[int, int] | None = None  # (part, length) of the last part as last written
        self.log_bytes = 0
        self.parts_written = 0
        self.part = bytearray()
        self.partial_line = b""
        self.events: list[dict[str, Any]] = []
        self.events_written = 0
        self.previous: list[dict[str, Any]] = []
        self.started = time.time()
        self.failed_once = False

    @classmethod
    def from_environment(cls, environ: Any) -> Recorder | None:
        """The recorder the job's environment asks for; None (said in the log) when there is none to keep."""
        text = environ.get(RECORD_ENV_VAR)
        if not text:
            return None
        try:
            config = json.loads(text)
            job_config = json.loads(environ.get(JOB_CONFIG_ENV_VAR) or "{}")
            run_dir = config.get("run_dir") or _default_run_dir(config, job_config.get("metadata") or {})
            return cls(Store.at(run_dir), config, job_config)
        except Exception as exc:  # the record is a courtesy; the job must run whatever went wrong here
            _say(f"no run record is kept: {_reason(exc)}")
            return None

    def start(self) -> None:
        """Take in the attempts an earlier submission of the same run recorded."""
        try:
            earlier = self.store.read(RUN_FILE)
            if earlier:
                self.previous = [attempt for attempt in json.loads(earlier).get("attempts", [])
                                 if attempt.get("submission_id") != self.submission_id]
        except Exception as exc:
            self._failed(exc)

    def upload(self, status: str, exit_code: int | None = None) -> None:
        """Write what is new in the log, the events and ``run.json`` (``status`` is this attempt's)."""
        try:
            self._read_new_log()
            prefix = f"{RECORD_DIR}/logs/{self.submission_id}"
            tail = (self.parts_written, len(self.part))
            if self.log is not None and tail != self.tail_written:
                self.store.write(f"{prefix}/{self.parts_written:05d}.log", bytes(self.part))
                self.tail_written = tail
            if len(self.events) > self.events_written:
                lines = "".join(json.dumps(event, separators=(",", ":")) + "\n" for event in self.events)
                self.store.write(f"{RECORD_DIR}/events/{self.submission_id}.jsonl", lines.encode())
                self.events_written = len(self.events)
            self.store.write(RUN_FILE, json.dumps(self.run_document(status, exit_code), indent=1).encode())
        except Exception as exc:
            self._failed(exc)

    def run_document(self, status: str, exit_code: int | None) -> dict[str, Any]:
        """``run.json``: the run as of now, this attempt last."""
        now = round(time.time(), 3)
        attempt = {
            "submission_id": self.submission_id, "attempt": self.attempt_number, "host": self.host,
            "spec_hash": self.config.get("spec_hash"), "started": round(self.started, 3), "updated": now,
            "ended": now if status != "RUNNING" else None, "status": status, "exit_code": exit_code,
            "log_bytes": self.log_bytes, "log_parts": self.parts_written + 1 if self.log is not None else 0,
            "events": len(self.events),
        }
        attempts = self.previous + [attempt]
        reports = [event for event in self.events if event.get("event") == "report"]
        shape = next((event.get("cluster") for event in reversed(self.events) if event.get("cluster")), None)
        return {
            "format": FORMAT_VERSION,
            "name": self.config.get("name"),
            "run_dir": self.store.location,
            "status": status,
            "started": attempts[0].get("started"),
            "ended": attempt["ended"],
            "spec": self.config.get("spec"),
            "spec_hash": self.config.get("spec_hash"),
            "code": self.code,
            "versions": self.versions,
            "cluster": shape,
            "metrics": reports[-1].get("metrics") if reports else None,
            "iterations": reports[-1].get("iteration") if reports else None,
            "epochs": reports[-1].get("epochs") if reports else None,
            "restarts": sum(event.get("event") == "restart" for event in self.events),
            "upload_every_s": self.every_s,
            "attempts": attempts,
        }

    def _read_new_log(self) -> None:
        if self.log is None:
            return
        while chunk := self.log.read(1 << 20):
            self.log_bytes += len(chunk)
            self._take_events(chunk)
            self.part += chunk
            while len(self.part) >= self.part_bytes:
                # A full part is final: written once, then the next one starts.
                self.store.write(f"{RECORD_DIR}/logs/{self.submission_id}/{self.parts_written:05d}.log",
                                 bytes(self.part[:self.part_bytes]))
                del self.part[:self.part_bytes]
                self.parts_written += 1

    def _take_events(self, chunk: bytes) -> None:
        lines = (self.partial_line + chunk).split(b"\n")
        self.partial_line = lines.pop()
        marker = EVENT_MARKER.encode() + b" "
        for line in lines:
            at = line.find(marker)
            if at < 0:
                continue
            try:
                event = json.loads(line[at + len(marker):])
            except ValueError:
                continue
            if isinstance(event, dict):
                self.events.append(event)

    def _failed(self, exc: BaseException) -> None:
        if not self.failed_once:
            self.failed_once = True
            _say(f"the run record at {self.store.location} could not be written ({_reason(exc)}); the job goes on, "
                 "and later uploads are tried as usual")


class Store:
    """A run's folder: local (files replaced whole, never half-written) or ``s3://`` (through pyarrow)."""

    def __init__(self, location: str, filesystem: Any = None, root: str = "") -> None:
        self.location = location
        self.filesystem = filesystem
        self.root = root

    @classmethod
    def at(cls, location: str) -> Store:
        """The store of ``location``: a path (``~`` expanded on this node) or ``s3://bucket/prefix``."""
        if location.startswith("s3://"):
            filesystem, root = s3_filesystem(location)
            return cls(location.rstrip("/"), filesystem, root.rstrip("/"))
        path = os.path.abspath(os.path.expanduser(location))
        return cls(path)

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` at ``name`` (relative to the run's folder), replacing what was there."""
        if self.filesystem is None:
            target = os.path.join(self.location, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            scratch = f"{target}.{os.getpid()}.tmp"
            with open(scratch, "wb") as handle:
                handle.write(data)
            os.replace(scratch, target)
            return
        with self.filesystem.open_output_stream(f"{self.root}/{name}") as stream:
            stream.write(data)

    def read(self, name: str) -> bytes | None:
        """What is at ``name``, or None when nothing is."""
        if self.filesystem is None:
            try:
                with open(os.path.join(self.location, name), "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None
        from pyarrow.fs import FileType

        path = f"{self.root}/{name}"
        if self.filesystem.get_file_info(path).type == FileType.NotFound:
            return None
        with self.filesystem.open_input_stream(path) as stream:
            return stream.read()


def s3_filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's S3 filesystem for ``uri`` and the path in it, configured by the standard AWS variables."""
    from urllib.parse import urlparse

    from pyarrow import fs

    options: dict[str, Any] = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                               or "us-east-1", "connect_timeout": 3, "request_timeout": 30}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options.update(endpoint_override=parsed.netloc + parsed.path.rstrip("/"), scheme=parsed.scheme)
    return fs.S3FileSystem(**options), uri.removeprefix("s3://")


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


def _become_subreaper() -> bool:
    """Adopt the entrypoint's orphans (Linux), so that the record can wait for the last of them.

    The shell that runs the entrypoint ends first when the job is stopped: Ray signals the whole process
    group, the shell dies at once and the script it started is still writing its last words (Ray's own
    stack dump on SIGTERM among them) to the log.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _wait_for_orphans(deadline: float, upload: Any = None) -> None:
    """Reap the adopted processes until none is left or ``deadline`` passes (a daemon may outlive the job),
    calling ``upload`` every half second meanwhile and once when the last one has ended."""
    next_upload = time.monotonic() + _ORPHAN_UPLOAD_S
    adopted = False
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        adopted = True
        if pid == 0:
            time.sleep(0.05)
        if upload is not None and time.monotonic() >= next_upload:
            upload()
            next_upload = time.monotonic() + _ORPHAN_UPLOAD_S
    if adopted and upload is not None:
        upload()


def _default_run_dir(config: dict[str, Any], job_metadata: dict[str, Any]) -> str:
    """``<base>/<name>-<first submission id>``: a retried attempt (``rayjobs.parent``) joins the first one's folder."""
    first = job_metadata.get(PARENT_KEY) or job_metadata.get(_SUBMISSION_ID_KEY) or f"local-{os.getpid()}"
    return f"{str(config['base']).rstrip('/')}/{config.get('name') or 'job'}-{first}"


def _open_own_log() -> Any:
    """This process's stdout as a file to read from the start: Ray points it at the job's driver log."""
    try:
        if stat.S_ISREG(os.fstat(1).st_mode):
            return open(f"/proc/{os.getpid()}/fd/1", "rb")
    except OSError:
        pass
    _say("the driver log is not a file here, so the run record keeps no copy of it")
    return None


def _reason(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _say(text: str) -> None:
    sys.stderr.write(f"rayjobs: {text}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
