"""The run record, kept by the job itself: ``python -m rayjobs_agent.supervisor -- ENTRYPOINT``.

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
callback (train_hooks/install.py): only on the Ray versions the callback is tested on, after any callbacks
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
import threading
import time
from collections.abc import Mapping
from typing import Any

from .judge import Judge
from .events import emit
from .notify import JobNotifier
from .pinning import ADDRESS_VARIABLE, pinned_to_this_cluster
from .queue.store import GcsKeyValue, note_attempt, release
from .queueing import Admission, submission_id_from
from .record_layout import RECORD_DIR, RECORD_ENV_VAR, RUN_FILE
from .record_store import reason
from .resources import ResourceSampler, local_addresses
from .recorder import ATTEMPT_KEY, Recorder, open_own_log, say
from .retries import ENTRYPOINT_FAILED, Failure, RetryPolicy, decide_retry, retries_whole_jobs
from .train_hooks.install import TRAIN_CALLBACKS_ENV_VAR, ray_version, train_callbacks
from .vocabulary import RETRY_STARTED, RETRY_WAITING, EventKind
from .wire import METADATA_PARENT as PARENT_KEY
from .wire import RECORD_COMMAND, job_metadata

__all__ = ["ATTEMPT_KEY", "PARENT_KEY", "RECORD_COMMAND", "RECORD_DIR", "RECORD_ENV_VAR",
           "RUN_FILE", "main"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_S = 0.25
# How long the entrypoint's orphaned processes may go on writing to the log after its shell has ended.
_ORPHANS_GRACE_S = 5.0
# How long the end of a job waits for storage that refused its last writes (never when it took none).
FINAL_RETRY_S = 5.0
# The most the end of a job may spend on its record, whatever storage does: a store that takes a write
# and never answers must not hold back the job's end (Ray reports it only once this process exits).
END_DEADLINE_S = 15.0
# How long a job stopped while it waited in its queue waits for the stop it asked Ray for.
_STAND_IN_WAIT_S = 60.0
# The longest the end of a job waits for the store's client it began making at the start.
_RELEASE_WAIT_S = 10.0
_PR_SET_CHILD_SUBREAPER = 36

_ORPHAN_UPLOAD_S = 0.5


def main(argv: list[str]) -> int:
    """Run ``argv`` (``-- ENTRYPOINT``) beside the agent; returns (or dies of) what the entrypoint did last."""
    args = argv[1:] if argv and argv[0] == "--" else argv
    if len(args) != 1:
        print("usage: python -m rayjobs_agent.supervisor -- 'ENTRYPOINT'", file=sys.stderr)
        return 2
    stop_signal: list[int] = []
    for signum in _STOP_SIGNALS:
        # Ray's stop signals the whole process tree; the entrypoint gets it from Ray, this process only notes it.
        signal.signal(signum, lambda received, _frame: stop_signal.append(received))
    config = record_config(os.environ)
    recorder = Recorder.from_environment(os.environ, config, open_own_log(os.environ)) if config else None
    child_env, note = entrypoint_environment(os.environ, config)
    if note is not None:
        say(f"progress unavailable: {note}; the run goes on")
        if recorder is not None:
            recorder.note(f"progress unavailable: {note}")
    admission = queue_admission(os.environ)
    if admission is not None and admission.outcome:
        return end_without_running(admission, recorder, stop_signal)
    slot = SlotRelease(admission)
    if admission is not None:
        emit(EventKind.QUEUE, state="admitted", queue=admission.queue, slot=admission.slot,
             waited_s=admission.waited_s, admitted_at=admission.admitted_at or None)
        say(f"starting: its turn in queue {admission.queue} came after {admission.waited_s:.1f}s")
    if stop_signal:
        # Stopped before its entrypoint started (while its queue let it in, or Ray set it up): it never starts.
        slot.release()
        if recorder is not None:
            recorder.start()  # the earlier attempts first, so that this one is added to them
            recorder.finish("STOPPED", None, FINAL_RETRY_S)
        return 128 + stop_signal[0]
    adopts_orphans = _become_subreaper()
    if recorder is not None:
        recorder.start()
    notifier = JobNotifier.from_environment(os.environ, recorder)  # the spec's notify: None without one
    judge = Judge(os.environ, notifier)
    judge.start()
    keeping = RecordKeeping(recorder)
    keeping.start()
    sampler = resource_sampler(os.environ, judge, keeping)
    policy = retry_policy(os.environ)
    attempt = first_attempt(os.environ)
    while True:
        code = run_entrypoint(args[0], child_env, stop_signal)
        if sampler is not None:
            sampler.sample_now()  # what the attempt used up to its end, before its record is kept
        if code == 0 or stop_signal:
            break
        diagnosis = judge.decide(attempt, code)
        if recorder is not None:
            recorder.failed_because(diagnosis)
        decision = decide_retry(policy, Failure(ENTRYPOINT_FAILED, code, diagnosis["cause"]), attempt)
        if decision.note:
            say(decision.note)
        if not decision.retry:
            break
        # The decision is said at once; the next attempt exists only once it starts: a stop during the wait
        # ends the run with the failed attempt last, and no attempt that never ran.
        attempts = policy.max_retries + 1
        emit(EventKind.RETRY, attempt=attempt + 1, attempts=attempts, delay_s=decision.delay_s,
             cause=decision.matched, state=RETRY_WAITING)
        if recorder is not None:
            with keeping.lock:
                recorder.attempt_failed(code)
        judge.between_attempts()
        if not _wait_unless_stopped(decision.delay_s, stop_signal):
            stopped = f"stopped during the wait before attempt {attempt + 1}, which never started"
            say(stopped)
            if recorder is not None:
                with keeping.lock:
                    recorder.note(stopped)
            break
        attempt += 1
        if retries_whole_jobs(policy):
            note_attempt_started(attempt)
        if recorder is not None:
            with keeping.lock:
                recorder.next_attempt()
        judge.next_attempt()
        emit(EventKind.RETRY, attempt=attempt, attempts=attempts, state=RETRY_STARTED)
        if decision.delay_s > 0:
            say(f"attempt {attempt} of {attempts} starts")
        if notifier is not None:
            notifier.started()  # "retry": this attempt follows a failed one
    judge.stop()
    if sampler is not None:
        sampler.stop()
    keeping.stop()
    slot.release()
    outcome = "STOPPED" if stop_signal else ("SUCCEEDED" if code == 0 else "FAILED")
    if notifier is not None:
        # Before the record's last uploads: Ray kills what is left of a stopped job a few seconds after
        # its stop signal, and storage may be slow; word of the end is what nobody else can send.
        notifier.ended(outcome, code, judge.said)
    if not keeping.finish(outcome, code, adopts_orphans):
        # A write still hangs in its thread, and pyarrow's S3 client waits for it at interpreter exit: the
        # record has had its time, and the job's end must not wait on storage any longer.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_like(code))
    return exit_like(code)


def run_entrypoint(command: str, env: dict[str, str], stop_signal: list[int]) -> int:
    """Run the entrypoint once, as Ray would (a shell command in this process group, writing to this log); its code."""
    child = subprocess.Popen(command, shell=True, env=env)
    if stop_signal:
        # The stop came while the entrypoint was being started: Ray signalled the process group before the
        # entrypoint was in it, so it is passed on as Ray would have sent it.
        _signal_group(stop_signal[0])
    while child.poll() is None:
        try:
            child.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    return child.returncode


def note_attempt_started(attempt: int) -> None:
    """Tell the cluster's queue keeper which attempt runs now: if the job is lost whole, it counts its attempts from
    here. A store that cannot be reached is said once; the keeper then counts this submission's attempts only."""
    if not os.environ.get(ADDRESS_VARIABLE):
        return  # run outside a Ray job: no cluster, no keeper
    try:
        note_attempt(GcsKeyValue(os.environ[ADDRESS_VARIABLE]), submission_id_from(os.environ), attempt)
    except Exception as exc:  # noqa: BLE001 - the attempt runs either way
        say(f"could not tell the cluster's queue keeper that attempt {attempt} started ({reason(exc)})")


def resource_sampler(environ: Mapping[str, str], judge: Judge, keeping: RecordKeeping) -> ResourceSampler | None:
    """The job's resource sampler, started (None when sampling is off, or said once when it cannot start)."""
    here: set[str] = set()

    def other_hosts() -> int:
        # Where Ray Train placed the workers, as the judge read it from the job's own attempt events. This machine's
        # addresses are looked up (a name lookup) only once a job has placed workers, in the sampler's thread.
        placed = set(judge.watch.worker_addresses)
        if placed and not here:
            here.update(local_addresses())
        return len(placed - here)

    try:
        recorder = keeping.recorder
        sampler = ResourceSampler.for_job(environ, other_hosts, keeping.add_event if recorder is not None else None,
                                          recorder.note if recorder is not None else None)
        if sampler is not None:
            sampler.start()
        return sampler
    except Exception as exc:  # noqa: BLE001 - the job runs unsampled
        say(f"resource use is not sampled ({reason(exc)}); the job goes on")
        return None


def retry_policy(environ: Mapping[str, str]) -> RetryPolicy:
    """The spec's retry policy for this job (none, said once, when it cannot be read: the job runs once)."""
    try:
        return RetryPolicy.from_environment(environ)
    except Exception as exc:  # noqa: BLE001 - the job runs, without retries in place
        say(f"the retry policy could not be read ({reason(exc)}); a failed attempt is not run again")
        return RetryPolicy()


def first_attempt(environ: Mapping[str, str]) -> int:
    """The number of this job's first attempt: 1, or what the client gave a job it submitted again."""
    try:
        return int(job_metadata(environ).get(ATTEMPT_KEY) or 1)
    except (ValueError, TypeError):
        return 1


def _wait_unless_stopped(delay_s: float, stop_signal: list[int]) -> bool:
    """Wait ``delay_s`` before the next attempt; False when the job was stopped meanwhile."""
    deadline = time.monotonic() + delay_s
    while not stop_signal and time.monotonic() < deadline:
        time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
    return not stop_signal


def exit_like(code: int) -> int:
    """Die of the entrypoint's signal where the OS allows it (Ray then sees what it would have seen without this
    wrapper); otherwise return ``128 + N`` as a shell would. A plain exit code is returned as it is."""
    if code >= 0:
        return code
    signum = -code
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL and SIGSTOP cannot be caught, so they need no default handler either
    os.kill(os.getpid(), signum)
    return 128 + signum


class RecordKeeping:
    """The record's uploads, beside the entrypoint in a thread of their own.

    The thread, not the loop that waits for the entrypoint, talks to storage: a store that hangs
    delays the record, never the moment the job ends. The end gets :data:`END_DEADLINE_S` in all.
    """

    def __init__(self, recorder: Recorder | None) -> None:
        self.recorder = recorder
        self.lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayjobs-record", daemon=True)

    def start(self) -> None:
        """Begin uploading every ``every_s`` (and sooner when a failed write is due again)."""
        if self.recorder is not None:
            self._thread.start()

    def stop(self) -> None:
        """No more uploads while running: the entrypoint has ended (an upload under way may finish)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(_POLL_S * 4)

    def _run(self) -> None:
        recorder = self.recorder
        assert recorder is not None
        next_upload = time.monotonic()
        while True:  # the first upload at once: a record that cannot be written is said before the job's output
            now = time.monotonic()
            due = now >= next_upload
            if due or (recorder.uploader.pending and now >= recorder.uploader.next_try_at):
                with self.lock:
                    recorder.upload("RUNNING")
            if due:
                next_upload = time.monotonic() + recorder.every_s
            if self._stopped.wait(_POLL_S):
                return

    def finish(self, outcome: str, code: int, adopts_orphans: bool) -> bool:
        """The record's last uploads (and the orphans' last words), within :data:`END_DEADLINE_S`; whether they
        finished in that time (and no write of the running job's still hangs)."""
        recorder = self.recorder

        def last_uploads() -> None:
            if recorder is not None:
                with self.lock:
                    recorder.upload(outcome, exit_code=code)
            if adopts_orphans:
                # Uploaded first and then as the log grows: Ray kills what is left of a stopped job a few
                # seconds after its stop signal, and a driver shutting down takes about that long.
                upload = (lambda: self._locked_upload(outcome, code)) if recorder is not None else None
                _wait_for_orphans(time.monotonic() + _ORPHANS_GRACE_S, upload)
            if recorder is not None:
                with self.lock:
                    recorder.finish(outcome, code, FINAL_RETRY_S)

        ending = threading.Thread(target=last_uploads, name="rayjobs-record-end", daemon=True)
        ending.start()
        ending.join(END_DEADLINE_S)
        if ending.is_alive() and recorder is not None:
            say(f"the run record's last upload to {recorder.store.location} did not finish within "
                f"{END_DEADLINE_S:g}s (storage did not answer); what was written before stays")
        return not ending.is_alive() and not self._thread.is_alive()

    def add_event(self, event: dict[str, Any]) -> None:
        """Keep one of the agent's events that the log did not take, with the next upload."""
        if self.recorder is not None:
            with self.lock:
                self.recorder.add_event(event)

    def _locked_upload(self, outcome: str, code: int) -> None:
        assert self.recorder is not None
        with self.lock:
            self.recorder.upload(outcome, exit_code=code)


def queue_admission(environ: Mapping[str, str]) -> Admission | None:
    """The admission the queue's keeper started this job with (None: a job not started by a queue)."""
    try:
        return Admission.from_environment(environ)
    except Exception as exc:  # noqa: BLE001 - the job runs; its slot frees when Ray says it ended
        say(f"the queue's admission could not be read ({reason(exc)}); the job runs, and its slot frees when it ends")
        return None


class SlotRelease:
    """Gives the job's queue slot back the moment its entrypoint ends: the next job's start waits on it.

    The store's client is made while the job runs (importing Ray's client takes most of a second), so
    the release at the end is one write. A failure is said, never raised: Ray's job table frees the
    slot once the job has ended anyway.
    """

    def __init__(self, admission: Admission | None) -> None:
        self.admission = admission if admission is not None and admission.slot >= 0 else None
        self._store: Any = None
        self._problem: BaseException | None = None
        self._connecting = threading.Thread(target=self._connect, name="rayjobs-queue-slot", daemon=True)
        if self.admission is not None:
            self._connecting.start()

    def _connect(self) -> None:
        try:
            self._store = GcsKeyValue(os.environ[ADDRESS_VARIABLE])
        except Exception as exc:  # noqa: BLE001 - said at release
            self._problem = exc

    def release(self) -> None:
        """Give the slot back (once)."""
        admission, self.admission = self.admission, None
        if admission is None:
            return
        try:
            self._connecting.join(_RELEASE_WAIT_S)
            if self._store is None:
                raise self._problem or TimeoutError("the cluster's store did not answer")
            release(self._store, admission.queue, admission.slot, admission.generation)
        except Exception as exc:  # noqa: BLE001 - Ray's job table frees the slot once the job has ended anyway
            say(f"could not give back the queue slot ({reason(exc)}); it frees itself when the job ends")


def end_without_running(admission: Admission, recorder: Recorder | None, stop_signal: list[int]) -> int:
    """The stand-in of a job that never ran: say why, keep its record, send its end, and end as it says."""
    say(f"job {admission.outcome.lower()} without running: {admission.reason}")
    emit(EventKind.QUEUE, state=admission.outcome.lower(), queue=admission.queue, position=admission.position,
         waited_s=admission.waited_s, reason=admission.reason)
    notifier = JobNotifier.from_environment(os.environ, recorder)
    if recorder is not None:
        recorder.start()
        recorder.note(admission.reason)
    if notifier is not None:
        notifier.ended(admission.outcome, None)
    if recorder is not None:
        recorder.finish(admission.outcome, None, FINAL_RETRY_S)
    if admission.outcome != "STOPPED":
        return 1
    # Ray's stop, not an exit of its own, makes the job read STOPPED: asked for now that its record and
    # notification are out (Ray kills a stopped job's processes a few seconds after the stop).
    try:
        from .queue.ray_jobs import DashboardJobs

        DashboardJobs(GcsKeyValue(os.environ[ADDRESS_VARIABLE])).stop(submission_id_from(os.environ))
    except Exception as exc:  # noqa: BLE001 - it then ends as FAILED, its record saying why
        say(f"could not have Ray stop it ({reason(exc)})")
    deadline = time.monotonic() + _STAND_IN_WAIT_S
    while not stop_signal and time.monotonic() < deadline:
        time.sleep(0.05)
    return 128 + (stop_signal[0] if stop_signal else signal.SIGTERM)


def _signal_group(signum: int) -> None:
    try:
        os.killpg(os.getpgrp(), signum)
    except OSError:
        pass


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
