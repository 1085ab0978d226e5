"""The run record, kept by the job itself: ``python -m rayjobs_observe.record -- ENTRYPOINT``.

``rayjobs submit`` wraps the entrypoint of every job that uploads code in this module. It runs the
entrypoint as Ray would (a shell command, in this process group, writing to the same log file), and
while it runs keeps the run's record up to date in the run's own storage, a local folder or ``s3://``:

    RUN/run.json                               what ran (spec, code, versions, cluster), how each attempt went,
                                               and the record's own health (writes failed, retried, lost)
    RUN/run-record/logs/ID/NNNNN.log           the driver log of submission ID, in parts of at most PART_BYTES
    RUN/run-record/events/ID/NNNNN.jsonl       the progress events in that log, in parts of about EVENT_PART_BYTES

every ``every_s`` seconds and once more at the end (the names and ``run.json``'s schema in record_layout.py;
why parts suit object storage in record_parts.py; retries in record_store.py; ``run.json`` in recorder.py).
Both are masked: the values of the job's secret variables never reach the record. The job writes its own record so that it is
there with nobody following (``--no-wait``, a KubeRay RayJob) and survives the cluster: a head node
that dies mid-run leaves the log complete up to the last upload.

Before the entrypoint starts, it also decides whether the job's Ray Train runs get the progress
callback (train_setup.py): only on the Ray versions the callback is tested on, after any callbacks
the job names itself.

Nothing here can fail the job: a record that cannot be written is said once in the log, writes that
failed are tried again with a growing delay, and the entrypoint runs on regardless.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from .events import emit
from .notify import JobNotifier
from .pinning import pinned_to_this_cluster
from .queueing import release, submission_id_from, wait_in_queue
from .record_layout import RECORD_DIR, RECORD_ENV_VAR, RUN_FILE
from .record_store import reason
from .recorder import ATTEMPT_KEY, JOB_CONFIG_ENV_VAR, PARENT_KEY, Recorder, say
from .train_setup import TRAIN_CALLBACKS_ENV_VAR, ray_version, train_callbacks

__all__ = ["ATTEMPT_KEY", "JOB_CONFIG_ENV_VAR", "PARENT_KEY", "RECORD_DIR", "RECORD_ENV_VAR", "RUN_FILE", "main"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_S = 0.25
# How long the entrypoint's orphaned processes may go on writing to the log after its shell has ended.
_ORPHANS_GRACE_S = 5.0
# How long the end of a job waits for storage that refused its last writes (never when it took none).
FINAL_RETRY_S = 5.0
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
    config = record_config(os.environ)
    recorder = Recorder.from_environment(os.environ, config) if config else None
    child_env, note = entrypoint_environment(os.environ, config)
    if note is not None:
        say(f"progress unavailable: {note}; the run goes on")
        if recorder is not None:
            recorder.note(f"progress unavailable: {note}")
    # A queued job waits for its turn here, before its entrypoint asks Ray for anything.
    admission, starts = wait_in_queue(config or {}, submission_id_from(os.environ), lambda: bool(stop_signal),
                                      emit, say)
    if not starts:
        if recorder is not None:
            recorder.start()  # the earlier attempts first, so that this one is added to them
            recorder.finish("STOPPED", None, FINAL_RETRY_S)
        return 128 + signal.SIGTERM
    adopts_orphans = _become_subreaper()
    child = subprocess.Popen(args[0], shell=True, env=child_env)
    if recorder is not None:
        recorder.start()
    notifier = JobNotifier.from_environment(os.environ, recorder)  # the spec's notify: None without one
    next_upload = time.monotonic()
    while child.poll() is None:
        now = time.monotonic()
        if recorder is not None and (now >= next_upload or (recorder.uploader.pending
                                                            and now >= recorder.uploader.next_try_at)):
            recorder.upload("RUNNING")
            if now >= next_upload:
                next_upload = time.monotonic() + recorder.every_s
                if notifier is not None:
                    notifier.running()
        try:
            child.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    code = child.returncode
    release(admission, say)
    outcome = "STOPPED" if stop_signal else ("SUCCEEDED" if code == 0 else "FAILED")
    if recorder is not None:
        recorder.upload(outcome, exit_code=code)
    if notifier is not None:
        notifier.ended(outcome, code)
    if adopts_orphans:
        # Uploaded first and then as the log grows: Ray kills what is left of a stopped job a few
        # seconds after its stop signal, and a driver shutting down takes about that long.
        upload = (lambda: recorder.upload(outcome, exit_code=code)) if recorder is not None else None
        _wait_for_orphans(time.monotonic() + _ORPHANS_GRACE_S, upload)
    if recorder is not None:
        recorder.finish(outcome, code, FINAL_RETRY_S)
    if code < 0:
        # Die of the entrypoint's signal, so that Ray sees what it would have seen without this wrapper.
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def record_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The record's variable, parsed (empty when it is not set, or said in the log when it cannot be read)."""
    text = environ.get(RECORD_ENV_VAR)
    if not text:
        return {}
    try:
        config = json.loads(text)
        if not isinstance(config, dict):
            raise ValueError(f"{RECORD_ENV_VAR} is not a JSON object")
        return config
    except Exception as exc:  # the record is a courtesy; the job must run whatever went wrong here
        say(f"no run record is kept: {reason(exc)}")
        return {}


def entrypoint_environment(environ: Mapping[str, str], config: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The entrypoint's environment: with the progress callback when ``config`` asks for it and this Ray is tested.

    Returns the environment and, when the callback is asked for but not installed, why.
    """
    env = dict(environ)
    # Ray-internal actors of the job (Ray Train's PlacementGroupCleaner) then ask the job's own cluster,
    # never another Ray instance on the same host.
    env.update(pinned_to_this_cluster(environ))
    if not config.get("progress"):
        return env, None
    try:
        callbacks, note = train_callbacks(environ, ray_version())
    except Exception as exc:  # whatever went wrong, the entrypoint runs as the user wrote it
        return env, f"the progress callback could not be set up ({reason(exc)})"
    if callbacks is not None:
        env[TRAIN_CALLBACKS_ENV_VAR] = callbacks
    return env, note


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
