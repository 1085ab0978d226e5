"""A history of a cluster queue's clients, and a checker of the queue's promises against it, in the manner of Jepsen.

Clients record each call before it is sent (``invoke``) and its answer after it returns (``complete``): ``ok``
(the call said what it did), ``fail`` (it said it did nothing) or ``info`` (nobody knows: the client was killed,
its connection cut, the cluster gone), in a :class:`History` that threads share. A nemesis records each fault it
injects beside them. Once the run is over and the queue is empty, the cluster's final state is read
(:func:`read_final_state`): Ray's job table through the dashboard, what a :class:`TableWatcher` saw of it while the
run went on (order jobs are deleted 30 s after they end; the watcher keeps when Ray took each), and every job's own
log, read from the cluster's session folder (after a head restart the log API cannot reach a job whose node is
gone). :func:`check` then tests the history and the state against the queue's invariants, and each violation
quotes the part of the history it concerns.

The jobs print their own start and end (``qh-job started|ended|stopped <time.time()>``); the moment the queue let a
job in is the keeper's (``admitted_at``, the head's clock), from the ``queue`` event its wrapper writes. Everything
runs on one machine, so the head's clock, the jobs' and the clients' are one clock.

A checker can show a bug, never the absence of one: the bounded run in tests/test_queue_history_cluster.py is
short, and benchmarks/queue_history.py runs the same for as long as it is given.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayjobs_agent import queueing as q
from rayjobs_agent.vocabulary import decode
from rayjobs_agent.wire import (
    METADATA_ATTEMPT,
    METADATA_NAME,
    METADATA_PARENT,
    METADATA_PRIORITY,
    METADATA_QUEUE,
)

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
JOB_LINE = re.compile(r"qh-job (started|ended|stopped) ([\d.]+)")
# A job whose entrypoint failed is retried in place by its wrapper, never as a next attempt: only a job lost whole
# (Ray's other error types: its supervisor died, never started, …) is submitted again.
ENTRYPOINT_FAILED = "JOB_ENTRYPOINT_COMMAND_ERROR"
# Float sums of needs (0.5 + 0.5 + 1.0) against a cluster's total.
_EPS = 1e-6
# The keeper's step starts at ``submitted + waited_s`` (``waited_s`` rounded to the millisecond) and then reads the
# order jobs in Ray's table; Ray's job manager stamps an order's ``start_time`` before it writes the order there, so
# an order stamped just before a step began may be read only by the next step. A job that entered less than this
# before the step that let another in is not counted as waiting for that step.
_STEP_EPS_S = 1.0


# --------------------------------------------------------------------------------------------------- history


@dataclass
class Op:
    """One call of a client: what it asked, when, and what came of it."""

    index: int
    client: str
    kind: str  # submit | stop | set
    args: dict[str, Any]
    invoked: float
    completed: float | None = None
    outcome: str = ""  # ok | fail | info (indeterminate)
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def line(self) -> str:
        """The op as one line of the history."""
        end = f"{self.completed:.3f}" if self.completed is not None else "…"
        what = " ".join(f"{key}={value}" for key, value in self.args.items() if value not in (None, ""))
        result = json.dumps(self.result, sort_keys=True, default=str) if self.result else ""
        error = f" error={self.error[:200]!r}" if self.error else ""
        return (f"#{self.index:<4} {self.invoked:.3f}–{end} {self.client:<10} {self.kind:<6} {what} -> "
                f"{self.outcome or 'pending'} {result}{error}")


@dataclass
class Fault:
    """One fault the nemesis injected: its kind, when it began and ended, and what it struck."""

    kind: str  # keeper-kill | keeper-kill-at-claim | wrapper-kill | proxy-cut | client-kill | head-restart
    started: float
    ended: float
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The fault as one line of the history."""
        return f"FAULT {self.started:.3f}–{self.ended:.3f} {self.kind} {json.dumps(self.detail, default=str)}"


class History:
    """Every client call and every fault of a run, in the order they were recorded; safe to share between threads."""

    def __init__(self, journal: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        self.journal = journal  # each op and fault as a line, as it completes: a run that hangs can be read

    def _write(self, line: str) -> None:
        if self.journal is not None:
            with open(self.journal, "a") as journal:
                journal.write(line + "\n")

    def invoke(self, client: str, kind: str, **args: Any) -> Op:
        """Record a call about to be sent."""
        with self._lock:
            op = Op(len(self.ops), client, kind, dict(args), time.time())
            self.ops.append(op)
            return op

    def complete(self, op: Op, outcome: str, error: str = "", **result: Any) -> Op:
        """Record the answer to ``op``: ``ok``, ``fail`` or ``info``, with what it said."""
        assert outcome in ("ok", "fail", "info"), outcome
        with self._lock:
            op.completed, op.outcome, op.error = time.time(), outcome, error
            op.result.update(result)
            self._write(op.line())
        return op

    def fault(self, kind: str, started: float, ended: float | None = None, **detail: Any) -> Fault:
        """Record a fault the nemesis injected."""
        with self._lock:
            found = Fault(kind, started, ended if ended is not None else time.time(), dict(detail))
            self.faults.append(found)
            self._write(found.line())
            return found

    def snapshot(self) -> tuple[list[Op], list[Fault]]:
        """The ops and faults as they are now."""
        with self._lock:
            return list(self.ops), list(self.faults)

    def text(self, ops: Iterable[Op] | None = None, faults: Iterable[Fault] | None = None) -> str:
        """Ops and faults as lines, in time order."""
        rows = [(op.invoked, op.line()) for op in (self.ops if ops is None else ops)]
        rows += [(fault.started, fault.line()) for fault in (self.faults if faults is None else faults)]
        return "\n".join(line for _, line in sorted(rows))


# --------------------------------------------------------------------------------------------------- the table


class TableWatcher:
    """Lists Ray's job table every ``every_s`` while the run goes on: each job's statuses in the order they were seen,
    and the last record of every job (order jobs included, which the keeper deletes 30 s after they end)."""

    def __init__(self, api: Any, every_s: float = 1.0) -> None:
        self.api = api
        self.every_s = every_s
        self.sightings: dict[str, list[tuple[float, str]]] = {}
        self.not_ended: dict[str, float] = {}  # the last look that saw each job not ended
        self.records: dict[str, dict[str, Any]] = {}
        self.failed_looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-history-watcher", daemon=True)

    def __enter__(self) -> TableWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def look(self) -> None:
        """One look at the table (the watcher's thread calls it; a test may call it once more at the end)."""
        jobs = self.api.list_jobs()
        at = time.time()
        for info in jobs:
            job_id = str(info.get("submission_id") or "")
            if not job_id:
                continue
            self.records[job_id] = info
            seen = self.sightings.setdefault(job_id, [])
            status = str(info.get("status") or "")
            if not seen or seen[-1][1] != status:
                seen.append((at, status))
            if status not in TERMINAL:
                self.not_ended[job_id] = at

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except Exception:  # noqa: BLE001 - the head may be down, or the dashboard restarting: look again
                self.failed_looks += 1
            self._stop.wait(self.every_s)


@dataclass
class JobRun:
    """One job of Ray's table as the checker reads it: Ray's record, and what its log says it did."""

    job_id: str
    info: dict[str, Any]
    log: str
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)
    admission: dict[str, Any] | None = None
    without_running: dict[str, Any] | None = None  # the stand-in's event: stopped while it waited, or refused
    entered_hint: float | None = None  # the entry's ``submitted``: when Ray took its enqueue order, once known
    last_seen_not_ended: float | None = None  # the watcher's last look that saw it not ended

    @property
    def status(self) -> str:
        """Ray's status of it now."""
        return str(self.info.get("status") or "")

    @property
    def metadata(self) -> dict[str, Any]:
        """Its metadata in Ray's table."""
        return self.info.get("metadata") or {}

    @property
    def name(self) -> str:
        """Its spec's name."""
        return str(self.metadata.get(METADATA_NAME) or "")

    @property
    def queue(self) -> str:
        """The queue it was entered into."""
        return str(self.metadata.get(METADATA_QUEUE) or "")

    @property
    def priority(self) -> int:
        """Its priority in its queue."""
        return int(self.metadata.get(METADATA_PRIORITY) or 0)

    @property
    def parent(self) -> str:
        """Its first attempt's id ("" for a first attempt)."""
        return str(self.metadata.get(METADATA_PARENT) or "")

    @property
    def attempt(self) -> int:
        """Which attempt it is (1 for the first)."""
        return int(self.metadata.get(METADATA_ATTEMPT) or 1)

    @property
    def ray_start(self) -> float | None:
        """When Ray took it (seconds)."""
        return (self.info.get("start_time") or 0) / 1000 or None

    @property
    def ray_end(self) -> float | None:
        """When Ray says it ended (seconds)."""
        return (self.info.get("end_time") or 0) / 1000 or None

    @property
    def admitted_at(self) -> float | None:
        """When the queue let it in: the keeper's moment (its wrapper's event), else when Ray took it."""
        if self.admission is not None and self.admission.get("admitted_at"):
            return float(self.admission["admitted_at"])
        return None if self.without_running is not None else self.ray_start

    @property
    def step_started(self) -> float | None:
        """When the keeper's step that let it in began (its ``now``): the entry's submission time plus its wait."""
        if self.admission is None or self.admission.get("waited_s") is None:
            return None
        return self.entered_hint + float(self.admission["waited_s"]) if self.entered_hint is not None else None

    @property
    def released_by(self) -> float | None:
        """The earliest moment its slot may have been given back (it held it until then at least): its entrypoint's
        last word, or Ray's end; for one whose entrypoint never started, its wrapper's start (a stop that came
        first has the wrapper give the slot back before it starts the entrypoint, saying nothing)."""
        if self.lost_whole and not self.ends and not self.stops:
            # Its slot frees when Ray's table first says it ended, which only the watcher's looks bound: Ray's job
            # manager may end it again later (FAILED as START_FAILURE after the keeper ended it FAILED, lost),
            # which rewrites its end time.
            moments = [moment for moment in (self.last_seen_not_ended, self.admitted_at) if moment]
            return max(moments) if moments else self.ray_end
        if not self.starts and self.admission is not None and self.admission.get("time"):
            return float(self.admission["time"])
        candidates = [moment for moment in [*self.ends, *self.stops, self.ray_end] if moment]
        return min(candidates) if candidates else None

    @property
    def lost_whole(self) -> bool:
        """Ended FAILED by Ray's (or the keeper's) word, not by its entrypoint: lost with its node or supervisor."""
        return self.status == "FAILED" and self.info.get("error_type") not in (None, ENTRYPOINT_FAILED)


@dataclass
class FinalState:
    """The cluster once the run is over: every job of Ray's table with its log, and what the watcher saw."""

    jobs: dict[str, JobRun]
    orders: dict[str, dict[str, Any]]  # order jobs, from the table and the watcher (when Ray took each)
    sightings: dict[str, list[tuple[float, str]]]
    cpus: float
    keeper_lines: list[str] = field(default_factory=list)  # what the keeper said in its log (jobs lost, retried)
    not_ended: dict[str, float] = field(default_factory=dict)  # the watcher's last look that saw each job not ended


def parse_log(job_id: str, info: dict[str, Any], log: str) -> JobRun:
    """A job's run from Ray's record and its driver log (its wrapper's events and its entrypoint's lines).

    The admission the keeper started it with is in its variables too (Ray's record keeps them): it tells a
    stand-in, and when the job was let in, even when the job's wrapper never ran (lost with its node first).
    """
    run = JobRun(job_id, info, log)
    try:
        admission = q.Admission.from_environment((info.get("runtime_env") or {}).get("env_vars") or {})
    except (ValueError, TypeError, KeyError):
        admission = None
    if admission is not None and admission.outcome:
        run.without_running = {"state": admission.outcome.lower(), "reason": admission.reason}
    elif admission is not None:
        run.admission = {"admitted_at": admission.admitted_at or None, "waited_s": admission.waited_s,
                         "slot": admission.slot, "queue": admission.queue}
    for line in log.splitlines():
        match = JOB_LINE.search(line)
        if match is not None:
            moment = float(match.group(2))
            {"started": run.starts, "ended": run.ends, "stopped": run.stops}[match.group(1)].append(moment)
            continue
        event = decode(line) if q.ANSWER_MARKER not in line else None
        if event is None or event.get("event") != "queue":
            continue
        if event.get("state") == "admitted":
            run.admission = event
        elif event.get("state") in ("stopped", "failed"):
            run.without_running = event
    return run


def driver_log(session_logs: Path, job_id: str) -> str:
    """A job's driver log as its node wrote it ("" when it has none: it never started)."""
    try:
        return (session_logs / f"job-driver-{job_id}.log").read_text(errors="replace")
    except OSError:
        return ""


def _place_entries(jobs: dict[str, JobRun], orders: dict[str, dict[str, Any]], not_ended: dict[str, float]) -> None:
    for job_id, run in jobs.items():
        run.last_seen_not_ended = not_ended.get(job_id)
        # A next attempt goes back into its queue at its first place: where its first attempt entered it.
        order = orders.get(q.enqueue_order_id(run.parent or job_id))
        if order is not None and order.get("start_time"):
            run.entered_hint = order["start_time"] / 1000


def read_final_state(api: Any, watcher: TableWatcher, session_logs: Path, cpus: float,
                     ours: str = "qh-") -> FinalState:
    """Ray's job table now, each job of ours (named ``ours…``) with its log, and the order jobs as last seen."""
    watcher.look()
    table = {str(info.get("submission_id")): info for info in api.list_jobs()}
    records = {**watcher.records, **table}
    orders = {job_id: info for job_id, info in records.items() if q.is_order(job_id, info)}
    jobs = {}
    for job_id, info in table.items():
        if q.is_order(job_id, info) or not str((info.get("metadata") or {}).get(METADATA_NAME) or "").startswith(ours):
            continue
        jobs[job_id] = parse_log(job_id, info, driver_log(session_logs, job_id))
    _place_entries(jobs, orders, watcher.not_ended)
    keeper_lines = [line for path in sorted(session_logs.glob("worker-*.out"))
                    for line in path.read_text(errors="replace").splitlines()
                    if "rayjobs: " in line and ("queue" in line or "lost" in line)]
    return FinalState(jobs, orders, dict(watcher.sightings), cpus, keeper_lines, dict(watcher.not_ended))


# What a run leaves beside its journal: the history and the final state, to be checked again (``load_run``) once the
# cluster and its files are gone.
KEPT_RUN = "run.json"


def keep_run(path: Path, history: History, state: FinalState, limits: Limits, needs_of: dict[str, Any]) -> None:
    """Write the history, the final state and what the checker needs besides, as JSON."""
    ops, faults = history.snapshot()
    path.write_text(json.dumps({
        "ops": [dataclasses.asdict(op) for op in ops], "faults": [dataclasses.asdict(fault) for fault in faults],
        "jobs": {job_id: {"info": run.info, "log": run.log} for job_id, run in state.jobs.items()},
        "orders": state.orders, "sightings": state.sightings, "cpus": state.cpus, "keeper_lines": state.keeper_lines,
        "not_ended": state.not_ended,
        "limits": {"initial": limits.initial, "changes": limits.changes}, "needs": needs_of}, default=str))


def load_run(path: Path) -> tuple[History, FinalState, Limits, dict[str, dict[str, float]]]:
    """A run :func:`keep_run` wrote, ready for :func:`check`."""
    kept = json.loads(path.read_text())
    history = History()
    history.ops = [Op(**op) for op in kept["ops"]]
    history.faults = [Fault(**fault) for fault in kept["faults"]]
    jobs = {job_id: parse_log(job_id, job["info"], job["log"]) for job_id, job in kept["jobs"].items()}
    _place_entries(jobs, kept["orders"], kept.get("not_ended") or {})
    state = FinalState(jobs, kept["orders"], {job_id: [tuple(seen) for seen in sightings]
                                              for job_id, sightings in kept["sightings"].items()},
                       kept["cpus"], kept["keeper_lines"], kept.get("not_ended") or {})
    limits = Limits(kept["limits"]["initial"], [tuple(change) for change in kept["limits"]["changes"]])
    return history, state, limits, kept["needs"]


# --------------------------------------------------------------------------------------------------- the checker


@dataclass
class Violation:
    """An invariant that did not hold: which, what was seen, and the part of the history it concerns."""

    invariant: str
    what: str
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def text(self, history: History) -> str:
        """The violation with the ops and faults it concerns."""
        quoted = history.text(self.ops, self.faults)
        return f"[{self.invariant}] {self.what}" + ("\n    " + quoted.replace("\n", "\n    ") if quoted else "")


@dataclass
class Report:
    """What the checker found: violations, and the run's figures."""

    violations: list[Violation]
    figures: dict[str, Any]
    history: History
    delays: list[float] = field(default_factory=list)  # each slot freeing to the next admission, outside restarts

    def text(self) -> str:
        """The figures, then each violation with its part of the history."""
        lines = ["queue history: " + json.dumps(self.figures, sort_keys=True, default=str)]
        lines += [violation.text(self.history) for violation in self.violations]
        return "\n".join(lines)


@dataclass
class Limits:
    """Each queue's ``max_running`` through the run: its first value and each ``set`` that answered ok, which took
    effect somewhere between its call and its answer (within that window either value may hold)."""

    initial: dict[str, int | None]
    changes: list[tuple[float, float, str, int | None]]  # (invoked, completed, queue, new limit)

    def at(self, queue: str, moment: float) -> int | None:
        """The most the limit can have been at ``moment`` (None: no limit)."""
        value = self.initial.get(queue)
        on_their_way = []
        for invoked, completed, changed, new in sorted(self.changes):
            if changed != queue or invoked > moment:
                continue
            if completed <= moment:
                value = new
            else:
                on_their_way.append(new)  # answered later, or never (indeterminate): it may have been carried out
        possible = [value, *on_their_way]
        return None if any(limit is None for limit in possible) else max(possible)  # type: ignore[type-var]

    def known_at(self, queue: str, moment: float) -> bool:
        """Whether the limit is known at ``moment`` (no ``set`` of that queue was on its way)."""
        return not any(changed == queue and invoked <= moment <= completed
                       for invoked, completed, changed, _ in self.changes)


def _accepted_submits(ops: list[Op]) -> list[Op]:
    """Submissions the cluster took: the client said the job's id (submitted, or attached), whatever came after."""
    return [op for op in ops if op.kind == "submit" and op.result.get("job_id")]


def _ops_about(ops: list[Op], job_id: str) -> list[Op]:
    return [op for op in ops if job_id in (op.result.get("job_id"), op.args.get("job_id"))]


def check(history: History, state: FinalState, limits: Limits, needs_of: dict[str, dict[str, float]],
          admission_bound_s: float = 60.0) -> Report:
    """Test the history and the final state against the queue's invariants.

    ``needs_of`` gives each job's declared needs by its spec's name (the clients chose them).
    ``admission_bound_s``: the most a waiting job that fits may wait after a slot frees (outside a head restart).
    """
    ops, faults = history.snapshot()
    violations: list[Violation] = []
    jobs = state.jobs
    by_name: dict[str, list[JobRun]] = {}
    for run in jobs.values():
        by_name.setdefault(run.name, []).append(run)

    # 1. Every accepted submission ends in one terminal state, and Ray's table has it.
    for op in _accepted_submits(ops):
        job_id = op.result["job_id"]
        run = jobs.get(job_id)
        if run is None:
            violations.append(Violation("accepted-is-in-table", f"job {job_id} was accepted, and Ray's table does "
                                        "not have it", [op]))
        elif run.status not in TERMINAL:
            violations.append(Violation("accepted-ends", f"job {job_id} is {run.status} after the run", [op]))
    for job_id, seen in state.sightings.items():
        statuses = [status for _, status in seen]
        terminal = [index for index, status in enumerate(statuses) if status in TERMINAL]
        if terminal and len(set(statuses[terminal[0]:])) > 1:
            violations.append(Violation("one-terminal-state", f"job {job_id} went {' -> '.join(statuses)}",
                                        _ops_about(ops, job_id)))
    for run in jobs.values():
        if run.status not in TERMINAL:
            violations.append(Violation("every-job-ends", f"job {run.job_id} is {run.status} after the run",
                                        _ops_about(ops, run.job_id)))
        first = run.parent or run.job_id
        owners = [op for op in ops if op.kind == "submit" and op.args.get("name") == run.name]
        if not owners:
            violations.append(Violation("no-phantom-job", f"job {run.job_id} ({run.name}) was submitted by no client"))
        elif run.parent and run.parent not in jobs:
            violations.append(Violation("no-phantom-job", f"attempt {run.job_id} names first attempt {first}, which "
                                        "Ray's table does not have", owners))
    for job_id in {op.result["job_id"] for op in _accepted_submits(ops)}:
        claims = [op for op in _accepted_submits(ops) if op.result["job_id"] == job_id and op.result.get("created")]
        if len(claims) > 1:
            violations.append(Violation("fixed-id-taken-once", f"{len(claims)} clients were told they submitted "
                                        f"job {job_id}", claims))
    for op in ops:
        if op.kind == "submit" and op.outcome == "ok" and op.args.get("follow") and op.result.get("final"):
            run = _last_attempt(jobs, op.result["job_id"])
            if run is not None and run.status in TERMINAL and op.result["final"] != run.status:
                violations.append(Violation("follower-tells-the-truth", f"the follower of {op.result['job_id']} "
                                            f"said {op.result['final']}; Ray's table says {run.job_id} "
                                            f"{run.status}", [op]))

    for op in ops:
        if op.kind == "submit" and op.result.get("said_gone") and op.result.get("job_id") in jobs:
            run = jobs[op.result["job_id"]]
            violations.append(Violation("follower-tells-the-truth", f"the follower of {run.job_id} said no such job "
                                        f"was on the cluster, waiting or running; it ran (from "
                                        f"{run.admitted_at or 0:.3f}) and ended {run.status}", [op]))

    # 2. No job runs twice: one start per attempt, and a next attempt only after a first one lost whole.
    for run in jobs.values():
        if len(run.starts) > 1:
            violations.append(Violation("runs-once", f"job {run.job_id} started {len(run.starts)} times "
                                        f"({run.starts})", _ops_about(ops, run.job_id)))
        if run.parent:
            parent = jobs.get(run.parent)
            previous = _attempt(jobs, run.parent, run.attempt - 1)
            if parent is None or previous is None:
                continue
            if not (previous.status == "FAILED" and previous.info.get("error_type") not in (None, ENTRYPOINT_FAILED)):
                violations.append(Violation("retry-only-when-lost", f"attempt {run.job_id} follows {previous.job_id}, "
                                            f"which ended {previous.status} ({previous.info.get('error_type')})",
                                            _ops_about(ops, run.parent)))
            elif run.starts and previous.ray_end and run.starts[0] < previous.ray_end:
                violations.append(Violation("runs-once", f"attempt {run.job_id} started at {run.starts[0]:.3f}, "
                                            f"before {previous.job_id} ended ({previous.ray_end:.3f})",
                                            _ops_about(ops, run.parent)))

    # 3. Never more holders than max_running, never more admitted needs than the cluster has.
    holders = [run for run in jobs.values() if run.admitted_at is not None and run.without_running is None]
    for run in holders:
        moment = run.admitted_at
        assert moment is not None
        others = [other for other in holders if other is not run and other.admitted_at is not None
                  and other.admitted_at <= moment and (other.released_by is None or other.released_by > moment)]
        limit = limits.at(run.queue, moment)
        same_queue = [other for other in others if other.queue == run.queue]
        if limit is not None and len(same_queue) >= limit:
            violations.append(Violation("max-running", f"job {run.job_id} was let into queue {run.queue} at "
                                        f"{moment:.3f} while {len(same_queue)} held its slots (limit {limit}): "
                                        f"{_intervals(same_queue)}", _ops_about(ops, run.job_id)))
        used: dict[str, float] = {}
        for held in [*others, run]:
            for resource, amount in needs_of.get(held.name, {}).items():
                used[resource] = used.get(resource, 0.0) + amount
        if used.get("CPU", 0.0) > state.cpus + _EPS:
            violations.append(Violation("within-resources", f"job {run.job_id} was let in at {moment:.3f} with "
                                        f"{used['CPU']:g} CPUs admitted in all, on a cluster of {state.cpus:g}: "
                                        f"{_intervals(others)}", _ops_about(ops, run.job_id)))

    # 4. Among jobs waiting together, the first in order (priority, then submission) starts first.
    stops = [op for op in ops if op.kind == "stop"]
    for late in holders:
        step = late.step_started
        if step is None or late.admitted_at is None:
            continue
        for early in jobs.values():
            if early is late or early.queue != late.queue or early.entered_hint is None:
                continue
            if _order_key(early) >= _order_key(late) or early.entered_hint >= step - _STEP_EPS_S:
                continue
            if early.admitted_at is not None and early.admitted_at <= late.admitted_at:
                continue
            if early.parent:
                continue  # a next attempt enters its queue in the step that found its first lost: never earlier
            if any(stop.args.get("job_id") == early.job_id and stop.invoked <= late.admitted_at for stop in stops):
                continue  # asked to leave the queue before
            if early.status != "STOPPED" and early.without_running is None and early.admitted_at is None:
                continue  # never let in and not stopped: reported as not ending above
            violations.append(Violation("queue-order", f"job {late.job_id} (priority {late.priority}) was let in at "
                                        f"{late.admitted_at:.3f} by a step that began at {step:.3f}, while job "
                                        f"{early.job_id} (priority {early.priority}), entered at "
                                        f"{early.entered_hint:.3f}, waited ahead of it (let in at "
                                        f"{early.admitted_at})", _ops_about(ops, late.job_id)
                                        + _ops_about(ops, early.job_id)))

    # 5. A stop is final: a job taken out of its queue never starts, a stopped job ends STOPPED, no attempt follows.
    stopped_lost_with_head = 0
    for op in stops:
        if op.outcome != "ok":
            continue
        # A stop of a job lost whole may act on its next attempt instead: its promises are about that attempt.
        job_id = op.result.get("attempt") or op.args["job_id"]
        run = jobs.get(job_id)
        said = op.result.get("said")
        if run is None:
            continue
        if said == "queued" and run.starts:
            when = "after" if run.starts[0] > op.invoked else "before"
            violations.append(Violation("stop-is-final", f"job {job_id} was said to be taken out of its queue "
                                        f"(it never starts), and its entrypoint started at {run.starts[0]:.3f}, "
                                        f"{when} the stop was asked", [op]))
        if said in ("stopped", "queued") and run.status != "STOPPED":
            ended_before = run.ray_end is not None and run.ray_end <= (op.completed or math.inf) + 1.0
            # A job stopped while it waited ends through a stand-in; one lost with the head before it ended reads as
            # Ray's job manager ended it (FAILED), and never runs.
            lost_with_head = (run.status == "FAILED" and run.info.get("error_type") not in (None, ENTRYPOINT_FAILED)
                              and not run.starts and any(fault.kind == "head-restart" and fault.started >= op.invoked
                                                         and fault.started <= (run.ray_end or math.inf)
                                                         for fault in faults))
            wrapper_killed = any(fault.kind == "wrapper-kill" and fault.detail.get("job_id") == job_id
                                 for fault in faults)
            stopped_lost_with_head += lost_with_head
            if not (ended_before or lost_with_head or wrapper_killed):
                violations.append(Violation("stop-is-final", f"job {job_id} was asked to stop ({said}) and ended "
                                            f"{run.status} ({run.info.get('error_type')})", [op]))
        for attempt in jobs.values():
            if attempt.parent == (run.parent or job_id) and attempt.attempt > run.attempt and attempt.starts \
                    and attempt.starts[0] > (op.completed or math.inf) and said in ("stopped", "queued", "withdrawn"):
                violations.append(Violation("stop-is-final", f"attempt {attempt.job_id} of {job_id} started after "
                                            "the stop was answered", [op]))

    # 6. From a slot freeing to the next admission, when a waiting job fits.
    restarts = [(fault.started, fault.ended) for fault in faults if fault.kind == "head-restart"]
    samples, across_restart = _admission_delays(state, holders, limits, needs_of, restarts)
    slow = [(delay, where) for delay, where in samples if delay > admission_bound_s]
    for delay, where in slow:
        violations.append(Violation("admission-bound", f"{where}: {delay:.1f}s from a slot freeing to the next "
                                    f"admission (bound {admission_bound_s:g}s)"))

    figures = {
        "ops": len(ops),
        "ops_by_kind": _count(f"{op.kind}:{op.outcome}" for op in ops),
        "faults": _count(fault.kind for fault in faults),
        "jobs": len(jobs),
        "jobs_by_status": _count(run.status for run in jobs.values()),
        "attempts_after_loss": sum(1 for run in jobs.values() if run.parent),
        "lost_found_by_keeper": sum(" is lost: " in line for line in state.keeper_lines),
        "retries_decided_by_keeper": sum(" was lost whole " in line for line in state.keeper_lines),
        "stopped_while_waiting_then_lost_with_the_head": stopped_lost_with_head,
        "violations": len(violations),
        "admission_after_slot_frees_s": _spread([delay for delay, _ in samples]),
        "admission_across_head_restart_s": _spread(across_restart),
    }
    return Report(violations, figures, history, [delay for delay, _ in samples])


def _order_key(run: JobRun) -> tuple[int, float, str]:
    return -run.priority, run.entered_hint or math.inf, run.job_id


def _attempt(jobs: dict[str, JobRun], first: str, number: int) -> JobRun | None:
    if number <= 1:
        return jobs.get(first)
    return next((run for run in jobs.values() if run.parent == first and run.attempt == number), None)


def _last_attempt(jobs: dict[str, JobRun], first: str) -> JobRun | None:
    attempts = [run for run in jobs.values() if run.parent == first] or [jobs.get(first)]
    return max((run for run in attempts if run is not None), key=lambda run: run.attempt, default=None)


def _intervals(runs: list[JobRun]) -> str:
    return ", ".join(f"{run.job_id}[{run.admitted_at or 0:.3f}–{run.released_by or math.inf:.3f}]" for run in runs)


def _count(items: Iterable[str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    return dict(sorted(counted.items()))


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"n": len(ordered), "median": round(statistics.median(ordered), 2),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2), "max": round(ordered[-1], 2)}


def _admission_delays(state: FinalState, holders: list[JobRun], limits: Limits, needs_of: dict[str, dict[str, float]],
                      restarts: list[tuple[float, float]]) -> tuple[list[tuple[float, str]], list[float]]:
    """For each slot freeing (a holder's end) after which the first waiting job of its queue fits: the time to the
    queue's next admission. Those that span a head restart are returned apart."""
    samples: list[tuple[float, str]] = []
    across: list[float] = []
    jobs = list(state.jobs.values())
    for freed in holders:
        moment = freed.released_by
        if moment is None:
            continue
        queue = freed.queue
        if not limits.known_at(queue, moment):
            continue
        waiting = [run for run in jobs if run.queue == queue and run.entered_hint is not None
                   and run.entered_hint < moment and (run.admitted_at or math.inf) > moment
                   and not (run.without_running is not None and (run.ray_start or math.inf) <= moment)]
        waiting = [run for run in waiting if run.admitted_at is not None]  # one that never ran was stopped meanwhile
        if not waiting:
            continue
        first = min(waiting, key=_order_key)
        running = [run for run in holders if run.admitted_at is not None and run.admitted_at <= moment
                   and (run.released_by is None or run.released_by > moment)]
        limit = limits.at(queue, moment)
        if limit is not None and len([run for run in running if run.queue == queue]) >= limit:
            continue
        used = sum(needs_of.get(run.name, {}).get("CPU", 0.0) for run in running)
        if used + needs_of.get(first.name, {}).get("CPU", 0.0) > state.cpus + _EPS:
            continue
        admitted = min(run.admitted_at for run in holders if run.queue == queue and run.admitted_at is not None
                       and run.admitted_at > moment)
        delay = admitted - moment
        if any(start - 1.0 <= admitted and moment <= end for start, end in restarts):
            across.append(delay)
        else:
            samples.append((delay, f"after {freed.job_id} freed its slot of queue {queue} at {moment:.3f}"))
    return samples, across
