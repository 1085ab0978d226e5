"""The agent's watch over a running job: when it waits for resources, and when it has stalled.

The wrapper (``supervisor.py``) feeds every line of the job's driver log here as it is written, and asks
:meth:`JobWatch.decide` every second or so. Each decision is said once, as an event in the log (and so
in the record): ``wait`` when Ray says the job cannot get resources (in rayjobs' words, with the
numbers), ``stall`` when nothing of the job's own has been written for the stall limit. The follower,
``rayjobs status`` and notifications show these events; none of them decides again.

What counts as a sign of the job's own life: a progress event, or a line of its own. Ray's lines are
not (``ray_lines.py``), nor are the agent's own ``rayjobs:`` lines, nor is a progress bar redrawn in
place: a job whose Ray Data bar repaints every second while no row moves is still stalled, and one
whose tasks Ray cannot place is waiting.

Standard library only: it runs in the job's wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .ray_lines import ANSI_ESCAPE, FORWARD_PREFIX, is_rays_own
from .vocabulary import AGENT_KINDS, EventKind, decode, kind_of
from .waits import ResourceWait, data_starved_in, resource_wait_in
from .wire import OWN_LINE_PREFIX

# A silence shorter than this is never called a stall: start-up, a first epoch and an evaluation can each be
# that quiet. Past the pace of the run's own reports: this many times its slowest gap between two.
STALL_FLOOR_S = 300.0
STALL_PACE_FACTOR = 3.0
# Quiet this long before its workers started, a job may be waiting for resources Ray says nothing of (Ray Train's
# worker group): the agent asks the cluster what it has pending.
QUIET_S = 45.0
# Events that show the job got what it waited for.
WAIT_OVER = frozenset({EventKind.ATTEMPT, EventKind.REPORT, EventKind.STEP})
_EVIDENCE_CHARS = 300
_WAIT_ADVICE = "Ask for less, or add nodes: Ray keeps it waiting until they are free or the cluster grows"


def stall_limit_s(stall_after_s: float | None, slowest_report_s: float | None) -> float:
    """Seconds of silence that make a running job stalled: the spec's ``stall_after_s``, else from its pace."""
    if stall_after_s is not None:
        return stall_after_s
    return max(STALL_FLOOR_S, STALL_PACE_FACTOR * (slowest_report_s or 0.0))


@dataclass(frozen=True)
class WaitDecision:
    """A wait for resources, in words: what is asked and held, and what would end it."""

    text: str
    advice: str
    asked: dict[str, float]
    evidence: str

    def fields(self) -> dict[str, Any]:
        """The ``wait`` event's fields."""
        return {"text": self.text, "advice": self.advice, "asked": self.asked, "evidence": self.evidence}


@dataclass(frozen=True)
class StallDecision:
    """Nothing of the job's own for ``silent_s`` seconds, past its limit ``limit_s``."""

    silent_s: float
    limit_s: float

    def fields(self) -> dict[str, Any]:
        """The ``stall`` event's fields."""
        return {"silent_s": round(self.silent_s, 1), "limit_s": round(self.limit_s, 1)}


class JobWatch:
    """Reads a job's log as it grows and decides, once each, that it waits or that it has stalled.

    Args:
        stall_after_s: the spec's ``stall_after_s``; None: from the pace of the job's own reports.
        now: the clock's reading at the start (``time.monotonic()``).
        nodes: what each live node has in all, asked when a wait for resources names no numbers of the cluster.
    """

    def __init__(self, stall_after_s: float | None, now: float,
                 nodes: Callable[[], list[dict[str, float]]] | None = None) -> None:
        self.stall_after_s = stall_after_s
        # Asked for each live node's resources when a wait names no numbers of the cluster (None: not asked).
        self.nodes = nodes
        self.last_life = now
        self.last_report: float | None = None
        self.slowest_report_s = 0.0
        self.now = now
        # What Ray Train said of the run: its workers and what each holds, and the cluster's size.
        self.workers: int | None = None
        self.per_worker: dict[str, float] = {}
        self.cluster: dict[str, Any] | None = None
        # Where the current attempt's training workers run (their nodes' addresses).
        self.worker_addresses: set[str] = set()
        self.waiting: WaitDecision | None = None
        # Whether that wait is the cluster's first pending demand, asked of a quiet job: perhaps another job's, so
        # it holds back no stall (a wait Ray names in this job's own log does).
        self._waiting_asked_of_cluster = False
        self._pending: list[WaitDecision] = []  # waits seen and not yet said, each said in turn
        self._waits_said: set[str] = set()
        # Ray's wait lines already taken (what they ask, and for what): Ray repeats them, and each new one asks the
        # cluster for its nodes' sizes.
        self._ray_waits_seen: set[tuple[Any, ...]] = set()
        self._stall_said = False
        self._cluster_asked_at = now

    def started(self, now: float) -> None:
        """The job's entrypoint began to run at ``now``: its silence counts from then (a follower that watched it
        wait for its turn first)."""
        self._alive(now)

    def line(self, text: str, now: float) -> None:
        """Take in one complete line of the log (colour and all) written at ``now``."""
        self.now = now
        plain = ANSI_ESCAPE.sub("", text)
        event = decode(plain)
        if event is not None:
            self.event(event, now)
            return
        body = FORWARD_PREFIX.sub("", plain, count=1)
        starved = data_starved_in(body)
        if starved is not None:
            self._wait_seen(self._data_wait(starved, body))
            return
        wait = resource_wait_in(body)
        if wait is not None:
            seen = (tuple(sorted(wait.asked.items())), wait.for_what, wait.cluster is None)
            if seen not in self._ray_waits_seen:
                self._ray_waits_seen.add(seen)
                self._wait_seen(self._ray_wait(wait))
            return
        # The agent's own lines (this watch's stall included) are read back from the same log: taking them for the
        # job's would end the silence they describe and call it a stall again one limit later.
        if "\r" not in plain and plain.strip() and not is_rays_own(plain) and not plain.startswith(OWN_LINE_PREFIX):
            # A line of its own: it is not held up, whatever it waited for (a wait said is not said again, for a
            # driver may talk while its tasks wait, as Tune's does).
            self.waiting, self._waiting_asked_of_cluster = None, False
            self._alive(now)

    def event(self, event: dict[str, Any], now: float) -> None:
        """Take in one progress event."""
        kind = kind_of(event)
        if kind in AGENT_KINDS:
            return  # the agent's own words are no sign of the job's life
        if kind == EventKind.TRAIN_START:
            self.workers = event.get("workers") if isinstance(event.get("workers"), int) else None
            self.per_worker = dict(event.get("resources_per_worker") or {})
        elif kind == EventKind.ATTEMPT:
            self.cluster = event.get("cluster") if isinstance(event.get("cluster"), dict) else None
            self.worker_addresses = {str(worker.get("node_ip")) for worker in event.get("workers") or []
                                     if isinstance(worker, dict) and worker.get("node_ip")}
        if kind == EventKind.REPORT:
            if self.last_report is not None:
                self.slowest_report_s = max(self.slowest_report_s, now - self.last_report)
            self.last_report = now
        if kind in WAIT_OVER:
            self._wait_over()
        self._alive(now)

    def limit_s(self) -> float:
        """Seconds of silence that make a stall."""
        return stall_limit_s(self.stall_after_s, self.slowest_report_s)

    def decide(self, now: float, waits: bool = True) -> WaitDecision | StallDecision | None:
        """What there is to say now that has not been said: a new wait (``waits``: only then), or a stall (never
        while it waits by Ray's word in its own log)."""
        self.now = now
        if waits and self._pending:
            return self._pending.pop(0)
        silent_s = now - self.last_life
        if ((self.waiting is None or self._waiting_asked_of_cluster) and not self._stall_said
                and silent_s >= self.limit_s()):
            self._stall_said = True
            return StallDecision(silent_s, self.limit_s())
        return None

    def time_to_ask_the_cluster(self, now: float) -> bool:
        """Whether the cluster should be asked now what it has pending (:meth:`demand_pending` takes the answer): the
        job has been quiet for :data:`QUIET_S` before its workers started, and was not asked within as long."""
        if (self.waiting is not None or self.cluster is not None or now - self.last_life < QUIET_S
                or now - self._cluster_asked_at < QUIET_S):
            return False
        self._cluster_asked_at = now
        return True

    def demand_pending(self, asked: dict[str, float], for_what: str, total: dict[str, float]) -> None:
        """The cluster says it has a demand pending while the job is quiet: that is the wait, in words."""
        wait = ResourceWait(asked, for_what, total or None, "on the cluster")
        self._wait_seen(WaitDecision(wait.text(), _WAIT_ADVICE, dict(asked), ""))
        self._waiting_asked_of_cluster = self.waiting is not None and self.waiting.text == wait.text()

    def has_waits_to_say(self) -> bool:
        """Whether a wait seen is not yet said (:meth:`decide` gives it)."""
        return bool(self._pending)

    def _alive(self, now: float) -> None:
        self.last_life = now
        self._stall_said = False

    def _wait_over(self) -> None:
        """The job got its workers: a wait not yet said is said no more, and a later one (after a restart) is new."""
        self.waiting = None
        self._waiting_asked_of_cluster = False
        self._pending.clear()
        self._waits_said.clear()
        self._ray_waits_seen.clear()

    def _wait_seen(self, wait: WaitDecision) -> None:
        self._waiting_asked_of_cluster = False
        if wait.text in self._waits_said:
            return
        self._waits_said.add(wait.text)
        self.waiting = wait
        self._pending.append(wait)

    def _data_wait(self, operator: str, line: str) -> WaitDecision:
        """Ray Data's tasks can get nothing: typically the training workers hold what they would need."""
        cpus = (self.cluster or {}).get("cpus")
        held = self.workers * self.per_worker.get("CPU", 0.0) if self.workers else None
        if held and cpus:
            whom = (f"the {self.workers} training workers hold {_count(held)} of the cluster's {_count(cpus)} CPUs"
                    if held < cpus else f"the {self.workers} training workers hold all {_count(cpus)} CPUs")
        else:
            whom = "other work holds the CPUs they need"
        text = (f"waiting for resources: Ray Data's tasks of {operator} cannot start (each needs a CPU by default), "
                f"and {whom}")
        advice = ("Leave a CPU to Ray Data: fewer training workers, or fewer CPUs per worker "
                  "(resources_per_worker: {CPU: …}); or give the dataset's tasks less (num_cpus=0.25 in "
                  "map_batches or read_*); or add a node. Ray keeps the job waiting until then")
        return WaitDecision(text, advice, {"CPU": 1.0}, _clip(line))

    def _ray_wait(self, wait: ResourceWait) -> WaitDecision:
        if wait.cluster is None and self.nodes is not None:
            try:
                wait = wait.with_nodes(self.nodes())
            except Exception:  # noqa: BLE001 - the wait is named without the cluster's numbers
                pass
        cpus = (self.cluster or {}).get("cpus")
        if wait.cluster is None and cpus is not None:
            wait = ResourceWait(wait.asked, wait.for_what, {"CPU": float(cpus), "GPU": float(
                (self.cluster or {}).get("gpus") or 0)}, "on the cluster", wait.source)
        return WaitDecision(wait.text(), _WAIT_ADVICE, dict(wait.asked), _clip(wait.source))


def _count(amount: Any) -> str:
    return f"{float(amount):g}"


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _EVIDENCE_CHARS else line[:_EVIDENCE_CHARS - 1] + "…"
