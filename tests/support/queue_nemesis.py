"""Clients and a nemesis for a cluster queue's history (tests/support/queue_history.py), on a real local cluster.

:func:`run_history` starts a Redis and a 2-CPU local cluster whose head keeps its GCS there (so that the head can
be killed and started again), a :class:`~tests.support.fault_proxy.FaultProxy` in front of its dashboard, and then,
for ``plan.client_s`` seconds:

- **clients**, each a thread with its own seeded choices: ``submit`` of a fresh spec or again of a spec with a fixed
  ``submission_id`` (which attaches), to one of two queues, priorities 0/5/9, ``needs`` of 0.5 or 1 CPU, ``--no-wait``
  or followed, through the real ``rayjobs`` command (a subprocess) or the Python API; ``stop`` of a job accepted
  earlier (waiting or running); ``queue set`` of a queue's limit. Most go through the proxy, so that a cut reaches
  them.
- **the nemesis**, at seeded moments: the keeper SIGKILLed (found through Ray's state API), once the moment it
  claims a slot (a process watching the store's slot keys kills it then, between its claim and its job's submission
  or during the submission), a job's wrapper SIGKILLed (``python -m rayjobs_agent.supervisor`` of a running job), the
  clients' connections cut, a ``rayjobs submit`` SIGKILLed mid-submission, and the head killed whole (every process
  of its session) and started again on its ports with its Redis.

Then it waits until the queue is empty and every job has ended (a job that never does is a liveness violation),
reads the final state and checks it. Timing is not reproducible (threads, a loaded machine); the seed fixes every
choice and the nemesis' schedule, so a failing seed replays the same run as closely as a cluster allows.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cli import REPO_ROOT, cli_env, rayjobs_command
from tests.support.fault_proxy import FaultProxy
from tests.support.queue_history import (
    KEPT_RUN,
    FinalState,
    History,
    Limits,
    Report,
    TableWatcher,
    Violation,
    check,
    keep_run,
    read_final_state,
)
from tests.support.ray_instances import environ_set, kill_processes
from tests.support.redis_server import redis_server

QUEUES = {"qh-a": 2, "qh-b": 2}
PRIORITIES = (0, 5, 9)
CPU_NEEDS = (0.5, 1.0)
CLUSTER_NAME = "queue-history"
KEEPER_NAME = "rayjobs-queue-keeper"

# A job: its start, its end and a stop (SIGTERM from Ray) said with the time, as the checker reads them.
ENTRYPOINT = ("python -c \"import signal, sys, time; "
              "signal.signal(signal.SIGTERM, lambda *a: (print('qh-job stopped %.3f' % time.time(), flush=True), "
              "sys.exit(143))); "
              "print('qh-job started %.3f' % time.time(), flush=True); time.sleep({seconds}); "
              "print('qh-job ended %.3f' % time.time(), flush=True)\"")

_SUBMITTED = re.compile(r"submitted (\S+) as (\S+) to")
_ATTACHED = re.compile(r"job (\S+) was already submitted from this spec")
_STATUS_OF_EXIT = {0: "SUCCEEDED", 1: "FAILED", 3: "STOPPED"}
# A client call that has not returned after this long hangs: it is killed and recorded as indeterminate.
_CALL_GUARD_S = 300
# How long the nemesis looks for what it is to strike (a live keeper, a running job) before it gives up.
_TARGET_WAIT_S = 15.0


@dataclass
class Plan:
    """How long the clients run, how many there are, and how many faults of each kind the nemesis injects."""

    seed: int
    client_s: float = 75.0
    clients: int = 3
    head_restarts: int = 1
    keeper_kills: int = 1
    keeper_kills_at_claim: int = 1
    wrapper_kills: int = 2
    proxy_cuts: int = 3
    client_kills: int = 2
    cpus: int = 2
    # The most a job that fits waits after a slot frees, outside a head restart (an orphaned claim of a killed
    # keeper holds its slot for 30 s, the store's grace for a holder Ray does not know).
    admission_bound_s: float = 60.0
    quiet_guard_s: float = 300.0


@dataclass
class Run:
    """What a run leaves: the history, the final state, the checker's report, and where the cluster's files were."""

    plan: Plan
    history: History
    state: FinalState | None
    report: Report
    session_logs: Path


@dataclass
class _Shared:
    """What the clients and the nemesis share: the cluster, where to reach it, and the jobs accepted so far."""

    plan: Plan
    cluster: Any
    home: Path
    specs: Path
    proxy: FaultProxy
    history: History
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    names: int = 0
    accepted: list[str] = field(default_factory=list)
    needs: dict[str, dict[str, float]] = field(default_factory=dict)
    fixed: dict[str, Path] = field(default_factory=dict)
    head_down: threading.Event = field(default_factory=threading.Event)

    def next_name(self, prefix: str = "qh") -> str:
        with self.lock:
            self.names += 1
            return f"{prefix}-{self.names}"

    def cli_env(self) -> dict[str, str]:
        from runner.local import loopback_env

        return cli_env(self.home, **loopback_env(self.cluster))

    def api(self, through_proxy: bool = True) -> Any:
        from runner.client.connection import Connection
        from runner.client.jobs_api import JobsApi

        address = self.proxy.address if through_proxy else self.cluster.dashboard_url
        return JobsApi(Connection(address=address, source="test", headers=self.cluster.auth_headers()))


def write_spec(shared: _Shared, rng: random.Random, *, fixed: bool) -> tuple[Path, str]:
    """A new spec (or, for ``fixed``, sometimes one written before: submitting it again attaches); its path and name."""
    if fixed and shared.fixed and rng.random() < 0.5:
        name = rng.choice(sorted(shared.fixed))
        return shared.fixed[name], name
    name = shared.next_name("qh-fixed" if fixed else "qh")
    queue = rng.choice(sorted(QUEUES))
    cpus = rng.choice(CPU_NEEDS)
    seconds = round(rng.uniform(0.5, 3.0), 1)
    lines = [f"name: {name}", f"entrypoint: {json.dumps(ENTRYPOINT.replace('{seconds}', str(seconds)))}",
             f"queue: {queue}", f"priority: {rng.choice(PRIORITIES)}", f"needs: {{CPU: {cpus}}}", "record: false",
             "max_retries: 1", "retry_backoff: {initial_s: 0, max_s: 0}"]
    if fixed:
        lines.append(f"submission_id: {name}-id")
    path = shared.specs / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    with shared.lock:
        shared.needs[name] = {"CPU": cpus}
        if fixed:
            shared.fixed[name] = path
    return path, name


# --------------------------------------------------------------------------------------------------- clients


def submit_by_cli(shared: _Shared, client: str, spec: Path, name: str, follow: bool,
                  kill_after_s: float | None = None) -> None:
    """``rayjobs submit SPEC`` through the proxy, recorded; with ``kill_after_s``, SIGKILLed that long after it began."""
    history = shared.history
    op = history.invoke(client, "submit", name=name, via="cli", follow=follow, kill_after_s=kill_after_s)
    args = [*rayjobs_command(), "submit", str(spec), "--address", shared.proxy.address, "--give-up-after", "90"]
    args += ["--quiet"] if follow else ["--no-wait"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                               env=shared.cli_env(), stdin=subprocess.DEVNULL)
    if kill_after_s is not None:
        try:
            process.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            process.kill()
            started = op.invoked
            history.fault("client-kill", started + kill_after_s, name=name)
    try:
        _, stderr = process.communicate(timeout=_CALL_GUARD_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    _complete_submit(shared, op, process.returncode, stderr, follow, killed=process.returncode == -signal.SIGKILL)


def submit_by_api(shared: _Shared, client: str, spec: Path, name: str, follow: bool) -> None:
    """``runner.submit`` (the Python API) through the proxy, recorded."""
    from jobs.loader import load_spec
    from runner import RunOptions, submit
    from runner.errors import BadInput, JobNotFound, RayJobsError

    history = shared.history
    op = history.invoke(client, "submit", name=name, via="api", follow=follow)
    notes = io.StringIO()
    try:
        result = submit(shared.api(), load_spec(spec), options=RunOptions(wait=follow, stream_logs=False),
                        notes=notes, logs_out=io.StringIO())
    except BadInput as exc:
        history.complete(op, "fail", error=str(exc), notes=notes.getvalue()[-500:])
        return
    except JobNotFound as exc:
        # The follower lost sight of a job it had submitted: the checker compares that with Ray's table.
        history.complete(op, "info", error=f"{type(exc).__name__}: {exc}", said_gone=True, **_ids_said(notes.getvalue()))
        return
    except RayJobsError as exc:
        history.complete(op, "info", error=f"{type(exc).__name__}: {exc}", **_ids_said(notes.getvalue()))
        return
    _complete_submit(shared, op, int(result.exit_code), notes.getvalue(), follow, killed=False)


def _ids_said(text: str) -> dict[str, Any]:
    submitted, attached = _SUBMITTED.search(text), _ATTACHED.search(text)
    if submitted:
        return {"job_id": submitted.group(2), "created": True}
    if attached:
        return {"job_id": attached.group(1), "created": False}
    return {}


def _complete_submit(shared: _Shared, op: Any, code: int, notes: str, follow: bool, killed: bool) -> None:
    said = _ids_said(notes)
    if code == 6 and "job_id" in said:
        said["said_gone"] = True  # exit 6: the follower said the job it submitted is on the cluster no more
    if killed or "job_id" not in said or said.get("said_gone"):
        outcome = "fail" if code == 2 and not killed else "info"
        shared.history.complete(op, outcome, error=notes.strip()[-600:], exit_code=code, **said)
        return
    if follow:
        final = _STATUS_OF_EXIT.get(code)
        shared.history.complete(op, "ok", exit_code=code, final=final, **said)
    else:
        shared.history.complete(op, "ok" if code == 0 else "info", exit_code=code, **said)
    with shared.lock:
        if said["job_id"] not in shared.accepted:
            shared.accepted.append(said["job_id"])


def stop_by_cli(shared: _Shared, client: str, job_id: str) -> None:
    """``rayjobs stop ID`` through the proxy, recorded."""
    op = shared.history.invoke(client, "stop", job_id=job_id, via="cli")
    done = subprocess.run([*rayjobs_command(), "stop", job_id, "--address", shared.proxy.address],
                          check=False, capture_output=True, text=True, cwd=REPO_ROOT, env=shared.cli_env(),
                          timeout=_CALL_GUARD_S,
                          stdin=subprocess.DEVNULL)
    text = done.stderr + done.stdout
    if done.returncode == 0:
        said = ("ended" if "had already ended" in text else "queued" if "waiting in its queue" in text
                else "withdrawn" if "none is submitted" in text else "requested" if "carries it out" in text
                else "stopped")
        # A job lost whole whose next attempt was submitted or entered: the words name the attempt the stop acted on.
        attempt = re.search(r"was lost whole; (?:stop requested for )?job (\S+)", text)
        shared.history.complete(op, "ok", said=said, attempt=attempt.group(1) if attempt else None, exit_code=0)
    elif done.returncode == 6:
        shared.history.complete(op, "fail", said="not found", exit_code=6, error=text.strip()[-300:])
    else:
        shared.history.complete(op, "info", exit_code=done.returncode, error=text.strip()[-300:])


def stop_by_api(shared: _Shared, client: str, job_id: str) -> None:
    """``runner.client.queue.stop_job`` through the proxy, recorded."""
    from runner.client.queue import stop_job
    from runner.errors import JobNotFound, RayJobsError

    op = shared.history.invoke(client, "stop", job_id=job_id, via="api")
    try:
        said = stop_job(shared.api(), job_id)
    except JobNotFound as exc:
        shared.history.complete(op, "fail", said="not found", error=str(exc))
    except RayJobsError as exc:
        shared.history.complete(op, "info", error=f"{type(exc).__name__}: {exc}")
    else:
        shared.history.complete(op, "ok", said=said.found, attempt=said.attempt)


def set_limit_by_cli(shared: _Shared, client: str, queue: str, limit: int) -> None:
    """``rayjobs queue set QUEUE --max-running N`` through the proxy, recorded."""
    op = shared.history.invoke(client, "set", queue=queue, max_running=limit, via="cli")
    done = subprocess.run([*rayjobs_command(), "queue", "set", queue, "--max-running", str(limit), "--address",
                           shared.proxy.address], check=False, capture_output=True, text=True, cwd=REPO_ROOT,
                          env=shared.cli_env(), timeout=_CALL_GUARD_S, stdin=subprocess.DEVNULL)
    outcome = "ok" if done.returncode == 0 else "fail" if done.returncode == 2 else "info"
    shared.history.complete(op, outcome, exit_code=done.returncode, error=(done.stderr.strip()[-300:]
                                                                            if done.returncode else ""))


def client_loop(shared: _Shared, index: int) -> None:
    """One client: ops chosen by its own seeded generator until the deadline (a failed op is recorded, never raised)."""
    rng = random.Random(f"{shared.plan.seed}-client-{index}")
    client = f"client-{index}"
    while time.time() < shared.deadline:
        choice = rng.random()
        try:
            if choice < 0.72 or not shared.accepted:
                fixed = rng.random() < 0.3
                spec, name = write_spec(shared, rng, fixed=fixed)
                follow = rng.random() < 0.25
                if rng.random() < 0.35:
                    submit_by_cli(shared, client, spec, name, follow)
                else:
                    submit_by_api(shared, client, spec, name, follow)
            elif choice < 0.93:
                with shared.lock:
                    recent = shared.accepted[-6:]
                job_id = rng.choice(recent)
                (stop_by_cli if rng.random() < 0.4 else stop_by_api)(shared, client, job_id)
            else:
                set_limit_by_cli(shared, client, "qh-a", rng.choice((1, 2, 3)))
        except Exception as exc:  # noqa: BLE001 - the op is already recorded as invoked; the run goes on
            shared.history.fault("client-error", time.time(), client=client, error=f"{type(exc).__name__}: {exc}")
        time.sleep(rng.uniform(0.1, 1.0))


# --------------------------------------------------------------------------------------------------- the nemesis


def keeper_pid(shared: _Shared) -> int | None:
    """The keeper actor's process, from Ray's state API (None: no keeper alive now)."""
    query = urllib.parse.urlencode({"filter_keys": "name", "filter_predicates": "=", "filter_values": KEEPER_NAME,
                                    "detail": "true"})
    try:
        found = shared.api(through_proxy=False).get_json(f"/api/v0/actors?{query}")
    except Exception:  # noqa: BLE001 - the head may be restarting
        return None
    actors = ((found.get("data") or {}).get("result") or {}).get("result") or []
    alive = [int(actor["pid"]) for actor in actors if actor.get("state") == "ALIVE" and actor.get("pid")]
    # Right after a head restart Ray's table may still name the keeper that died with the old head, whose pid may
    # now be anybody's: only a process of this cluster that runs the keeper is ever killed.
    ours = {process.pid for process in _cluster_and_job_processes(shared.cluster)
            if "KeeperActor" in " ".join(_command_line(process))}
    return next((pid for pid in alive if pid in ours), None)


def _command_line(process: Any) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _cluster_and_job_processes(cluster: Any) -> list[Any]:
    from runner.local import cluster_processes

    return list({process.pid: process for process in cluster_processes(cluster) + job_processes(cluster)}.values())


def _within(seconds: float, find: Callable[[], Any]) -> Any:
    """What ``find`` finds within ``seconds`` (looking every half second), or None."""
    deadline = time.monotonic() + seconds
    while True:
        found = find()
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def kill_keeper(shared: _Shared) -> None:
    """SIGKILL the keeper, as a crash would (Ray restarts it)."""
    pid = _within(_TARGET_WAIT_S, lambda: keeper_pid(shared))
    if pid is None:
        shared.history.fault("keeper-kill", time.time(), struck=False)
        return
    at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    shared.history.fault("keeper-kill", at, pid=pid, struck=True)


def _kill_keeper_at_claim(address: str, environ: dict[str, str], pid: int, within_s: float, answer: Any) -> None:
    """In a process of its own: SIGKILL ``pid`` the moment a new slot key appears in the queue's store."""
    os.environ.update(environ)  # the cluster's token, before Ray is imported
    from rayjobs_agent.queue.store import GcsKeyValue

    store = GcsKeyValue(address)
    before = set(store.keys("slot/"))
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        now = set(store.keys("slot/"))
        new = sorted(now - before)
        if new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            answer.put({"at": time.time(), "claim": new[0], "pid": pid})
            return
        before = now
        time.sleep(0.002)
    answer.put({"at": time.time(), "claim": None, "pid": pid})


def kill_keeper_at_claim(shared: _Shared, within_s: float = 20.0) -> None:
    """SIGKILL the keeper right after it claims a slot: between the claim and its job's submission, or during it."""
    from runner.local import loopback_env

    pid = _within(_TARGET_WAIT_S, lambda: keeper_pid(shared))
    if pid is None:
        shared.history.fault("keeper-kill-at-claim", time.time(), struck=False)
        return
    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    started = time.time()
    process = context.Process(target=_kill_keeper_at_claim,
                              args=(shared.cluster.gcs_address, loopback_env(shared.cluster), pid, within_s, answer))
    process.start()
    process.join(within_s + 60)
    if process.is_alive():
        process.kill()
    try:
        found = answer.get(timeout=1)
    except Exception:  # noqa: BLE001 - the watcher died: nothing was struck
        found = {"claim": None}
    shared.history.fault("keeper-kill-at-claim", found.get("at", started), struck=found.get("claim") is not None,
                         **found)


def kill_wrapper(shared: _Shared, rng: random.Random) -> None:
    """SIGKILL the wrapper (``python -m rayjobs_agent.supervisor``) of a running job of ours."""
    import psutil

    from rayjobs_agent.queueing import submission_id_from
    from runner.local import cluster_processes

    def running_wrappers() -> list[tuple[Any, str]]:
        found = []
        for process in cluster_processes(shared.cluster) + job_processes(shared.cluster):
            with contextlib.suppress(psutil.Error):
                command = " ".join(process.cmdline())
                if "rayjobs_agent.supervisor" in command and "qh-job started" in command and process.children():
                    found.append((process, submission_id_from(process.environ())))
        return found

    candidates = _within(_TARGET_WAIT_S, running_wrappers)
    if not candidates:
        shared.history.fault("wrapper-kill", time.time(), struck=False)
        return
    process, job_id = rng.choice(sorted(candidates, key=lambda found: found[1]))
    at = time.time()
    with contextlib.suppress(psutil.Error):
        process.kill()
    shared.history.fault("wrapper-kill", at, job_id=job_id, pid=process.pid, struck=True)


def cut_clients(shared: _Shared, rng: random.Random) -> None:
    """Cut every client connection through the proxy; sometimes refuse new ones for a moment too."""
    at = time.time()
    if rng.random() < 0.5:
        cut = shared.proxy.cut_all()
        shared.history.fault("proxy-cut", at, cut=cut)
    else:
        seconds = round(rng.uniform(1.0, 3.0), 1)
        shared.proxy.outage(seconds)
        shared.history.fault("proxy-cut", at, at + seconds, outage_s=seconds)


def kill_a_client(shared: _Shared, rng: random.Random) -> None:
    """A ``rayjobs submit`` SIGKILLed mid-submission."""
    spec, name = write_spec(shared, rng, fixed=rng.random() < 0.5)
    submit_by_cli(shared, "nemesis", spec, name, follow=rng.random() < 0.5, kill_after_s=round(rng.uniform(0.3, 2.5), 2))


def job_processes(cluster: Any) -> list[Any]:
    """The processes of the cluster's jobs (their wrappers, entrypoints and Ray's watchers of them): Ray starts each in
    a session of its own, and each carries the cluster's address in its environment."""
    import psutil

    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != os.getpid() and process.environ().get("RAY_ADDRESS") == cluster.gcs_address:
                found.append(process)
    return found


def restart_head(shared: _Shared) -> None:
    """Kill every process of the cluster, its jobs' too (SIGKILL, as a machine that loses power), then start it again
    on its ports with its Redis."""
    from runner.local import start

    shared.head_down.set()
    at = time.time()
    try:
        import psutil

        doomed = _cluster_and_job_processes(shared.cluster)
        kill_processes(doomed)
        psutil.wait_procs(doomed, timeout=30)  # SIGKILL lands a moment later: the start must find the leader gone
        with environ_set(RAYJOBS_HOME=str(shared.home)):
            shared.cluster = start(name=CLUSTER_NAME, timeout_s=180)
    finally:
        shared.head_down.clear()
    shared.history.fault("head-restart", at, time.time())


def nemesis_schedule(plan: Plan) -> list[tuple[float, str]]:
    """The faults of a run, each at a seeded moment (seconds after the clients start)."""
    rng = random.Random(f"{plan.seed}-nemesis")
    kinds = (["head-restart"] * plan.head_restarts + ["keeper-kill"] * plan.keeper_kills
             + ["keeper-kill-at-claim"] * plan.keeper_kills_at_claim + ["wrapper-kill"] * plan.wrapper_kills
             + ["proxy-cut"] * plan.proxy_cuts + ["client-kill"] * plan.client_kills)
    schedule = []
    for kind in kinds:
        # The head restart comes in the middle, so that jobs run and wait on both sides of it.
        low, high = (0.35, 0.6) if kind == "head-restart" else (0.1, 0.9)
        schedule.append((round(rng.uniform(low, high) * plan.client_s, 1), kind))
    return sorted(schedule)


def nemesis_loop(shared: _Shared, started: float) -> None:
    """Inject each fault of the schedule at its moment (a fault runs to its end before the next one)."""
    rng = random.Random(f"{shared.plan.seed}-nemesis-acts")
    for offset, kind in nemesis_schedule(shared.plan):
        wait = started + offset - time.time()
        if wait > 0:
            time.sleep(wait)
        try:
            if kind == "head-restart":
                restart_head(shared)
            elif kind == "keeper-kill":
                kill_keeper(shared)
            elif kind == "keeper-kill-at-claim":
                kill_keeper_at_claim(shared)
            elif kind == "wrapper-kill":
                kill_wrapper(shared, rng)
            elif kind == "proxy-cut":
                cut_clients(shared, rng)
            elif kind == "client-kill":
                kill_a_client(shared, rng)
        except Exception as exc:
            shared.history.fault(f"{kind}-error", time.time(), error=f"{type(exc).__name__}: {exc}")
            if kind == "head-restart":
                raise


# --------------------------------------------------------------------------------------------------- the run


def _quiet(shared: _Shared) -> str:
    """Why the queue is not quiet yet ("" once every job of ours has ended and nothing waits or runs in its queues)."""
    from rayjobs_agent.queueing import is_order
    from runner.client.queue import ClusterQueue

    api = shared.api(through_proxy=False)
    jobs = api.list_jobs()
    busy = [str(info.get("submission_id")) for info in jobs
            if info.get("status") not in ("SUCCEEDED", "FAILED", "STOPPED")
            and (str((info.get("metadata") or {}).get("rayjobs.name") or "").startswith("qh")
                 or (is_order(str(info.get("submission_id")), info)
                     and str(info.get("submission_id")).startswith("rayjobs-order-enqueue-")))]
    queues = ClusterQueue(api).describe()
    held = [job["id"] for queue in queues if queue.get("queue") in QUEUES for job in
            (queue.get("running") or []) + (queue.get("waiting") or [])]
    if busy or held:
        return f"not ended: {busy}; in the queues: {held}"
    return ""


def run_history(plan: Plan, workdir: Path, say: Callable[[str], None] = print) -> Run:
    """Run the clients and the nemesis on a fresh Redis-backed cluster for ``plan.client_s``, then check the history.

    The cluster and the Redis are stopped at the end, whatever happened.
    """
    from runner.local import start, stop

    say(f"queue history: seed {plan.seed} (replay with the same seed), {plan.client_s:g}s of clients, "
        f"schedule {nemesis_schedule(plan)}")
    home, specs = workdir / "home", workdir / "specs"
    specs.mkdir(parents=True, exist_ok=True)
    history = History(journal=workdir / "history.log")
    with redis_server(workdir / "redis") as store, environ_set(RAYJOBS_HOME=str(home)):
        cluster = start(name=CLUSTER_NAME, num_cpus=plan.cpus, gcs_store=store, timeout_s=180)
        session_logs = Path(cluster.temp_dir) / "session_latest" / "logs"
        try:
            port = urllib.parse.urlsplit(cluster.dashboard_url).port
            with FaultProxy(port, max_lifetime_s=plan.client_s + plan.quiet_guard_s + 900) as proxy:
                shared = _Shared(plan, cluster, home, specs, proxy, history, deadline=0.0)
                for queue, limit in QUEUES.items():
                    set_limit_by_cli(shared, "setup", queue, limit)
                assert all(op.outcome == "ok" for op in history.ops), history.text()
                with TableWatcher(shared.api(through_proxy=False)) as watcher:
                    started = time.time()
                    shared.deadline = started + plan.client_s
                    threads = [threading.Thread(target=client_loop, args=(shared, index), name=f"client-{index}")
                               for index in range(plan.clients)]
                    nemesis_error: list[BaseException] = []

                    def nemesis() -> None:
                        try:
                            nemesis_loop(shared, started)
                        except BaseException as exc:  # noqa: BLE001 - raised by the run below
                            nemesis_error.append(exc)

                    threads.append(threading.Thread(target=nemesis, name="nemesis"))
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    if nemesis_error:
                        raise nemesis_error[0]
                    proxy.end_outage()
                    say(f"queue history: clients done after {time.time() - started:.0f}s; waiting for the queue "
                        "to empty")
                    liveness = _wait_until_quiet(shared, plan.quiet_guard_s)
                    limits = Limits({queue: limit for queue, limit in QUEUES.items()},
                                    [(op.invoked, op.completed if op.outcome == "ok" else float("inf"),
                                      op.args["queue"], op.args["max_running"])
                                     for op in history.ops if op.kind == "set" and op.client != "setup"
                                     and op.outcome in ("ok", "info")])
                    state = read_final_state(shared.api(through_proxy=False), watcher, session_logs, plan.cpus)
                    keep_run(workdir / KEPT_RUN, history, state, limits, dict(shared.needs))
                report = check(history, state, limits, dict(shared.needs), plan.admission_bound_s)
                if liveness:
                    report.violations.append(Violation("every-waiting-job-runs", liveness))
                    report.figures["violations"] = len(report.violations)
                report.figures["seed"] = plan.seed
                report.figures["watcher_failed_looks"] = watcher.failed_looks
                return Run(plan, history, state, report, session_logs)
        finally:
            stop(CLUSTER_NAME, timeout_s=30)


def _wait_until_quiet(shared: _Shared, guard_s: float) -> str:
    """Wait until the queue is quiet; what is still busy after ``guard_s`` ("" once it is)."""
    deadline = time.monotonic() + guard_s
    why = "never looked"
    while time.monotonic() < deadline:
        try:
            why = _quiet(shared)
        except Exception as exc:  # noqa: BLE001 - look again
            why = f"{type(exc).__name__}: {exc}"
        if not why:
            return ""
        time.sleep(1.0)
    return f"after {guard_s:g}s: {why}; {_keeper_now(shared)}"


def _keeper_now(shared: _Shared) -> str:
    """The keeper as Ray's actor table and its last snapshot show it, for a run whose queue never emptied."""
    from runner.client.queue import ClusterQueue

    api = shared.api(through_proxy=False)
    query = urllib.parse.urlencode({"filter_keys": "name", "filter_predicates": "=", "filter_values": KEEPER_NAME,
                                    "detail": "true"})
    try:
        actors = ((api.get_json(f"/api/v0/actors?{query}").get("data") or {}).get("result") or {}).get("result") or []
        snapshot = ClusterQueue(api).snapshot() or {}
    except Exception as exc:  # noqa: BLE001 - said as it is
        return f"the keeper could not be looked at ({type(exc).__name__}: {exc})"
    shown = [{key: actor.get(key) for key in ("state", "pid", "node_id", "num_restarts", "death_cause")}
             for actor in actors]
    try:  # what holds the head node's resource, which the keeper and every order ask for
        everyone = ((api.get_json("/api/v0/actors?detail=true&limit=2000").get("data") or {}).get("result")
                    or {}).get("result") or []
        shown += [{key: actor.get(key) for key in ("class_name", "name", "state", "pid", "required_resources")}
                  for actor in everyone if actor.get("state") != "DEAD"
                  and "node:__internal_head__" in (actor.get("required_resources") or {})]
        shown += [{key: info.get(key) for key in ("submission_id", "status", "driver_node_id", "message")}
                  for info in api.list_jobs() if info.get("status") not in ("SUCCEEDED", "FAILED", "STOPPED")]
    except Exception as exc:  # noqa: BLE001 - said as it is
        shown.append({"error": f"{type(exc).__name__}: {exc}"})
    return f"keeper actors {json.dumps(shown, default=str)[:6000]}; its last snapshot is {time.time() - float(snapshot.get('at') or 0):.0f}s old"
