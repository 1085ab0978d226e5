"""A job's progress, read from the events in its log (``rayjobs_agent``): what it is doing,
how far it got, how long the rest should take, and what went wrong on the way.

The job writes events as ``rayjobs-event {json}`` lines; lines forwarded from other processes of the
job carry a ``(Name pid=…)`` prefix, possibly in colour, so an event is found anywhere in a line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rayjobs_agent.causes import Diagnosis, short_reason
from rayjobs_agent.vocabulary import AGENT_KINDS, RETRY_WAITING, EventKind, kind_of
from rayjobs_agent.wording import format_duration, format_value, usage_line

# How many of the last epochs the pace (and so the ETA) is taken over: recent enough to follow a
# change of speed, long enough that one slow evaluation does not swing it.
_PACE_EPOCHS = 5
_METRICS_SHOWN = 4


@dataclass
class Restart:
    """A training attempt that failed and was followed by another."""

    attempt: int
    reason: str
    time: float
    run: str | None = None  # the training run that restarted: a sweep has one per trial

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "reason": self.reason, "time": self.time, "run": self.run}


@dataclass
class RunProgress:
    """Everything the events of one job said so far; fed one event at a time by :meth:`update`."""

    stage: str | None = None
    stage_index: int | None = None
    stage_count: int | None = None
    epochs: int | None = None
    epoch: int | None = None
    iterations: int = 0
    attempts: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)
    nodes: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    restarts: list[Restart] = field(default_factory=list)
    training_state: str | None = None
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: int = 0
    step: int | None = None  # within the epoch after ``epoch``, while the job says (None once that epoch reports)
    steps: int | None = None
    step_epoch: int | None = None  # the epoch those steps are in
    slowest_report_s: float | None = None  # the longest wait between two reports of one attempt
    # A sweep's trials by name: state (started, running, ended, failed), values, epoch, metric.
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The agent's word on the job's attempts: why each failed (its ``cause`` events) and each retry in place.
    causes: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)  # the attempts in place that started
    retry_waiting: dict[str, Any] | None = None  # a retry decided, its attempt not started yet (the backoff)
    # The agent's wait (its words) while the job waits, and the silence of the stall it last said.
    waiting: str | None = None
    stalled_s: float | None = None
    # The agent's last sample of what the job's processes use (a ``resources`` event).
    resources: dict[str, Any] | None = None
    _epoch_times: list[tuple[int, float]] = field(default_factory=list)

    def update(self, event: dict[str, Any]) -> None:
        """Take in one event."""
        self.events += 1
        at = float(event.get("time") or time.time())
        kind = kind_of(event)
        if kind in (EventKind.ATTEMPT, EventKind.REPORT, EventKind.STEP):
            self.waiting = None  # it got what it waited for
        if kind not in AGENT_KINDS:
            self.stalled_s = None  # a sign of its own life
        if kind == EventKind.STAGE:
            if event.get("state") == "start":
                self.stage = event.get("name")
                self.stage_index, self.stage_count = event.get("index"), event.get("count")
        elif kind == EventKind.COUNT:
            self.counts[str(event.get("name"))] = {"done": event.get("done"), "total": event.get("total")}
        elif kind == EventKind.TRAIN_START:
            self.epochs = event.get("epochs") if isinstance(event.get("epochs"), int) else self.epochs
            self.training_state = "RUNNING"
        elif kind == EventKind.ATTEMPT:
            self.attempts = int(event.get("attempt") or self.attempts + 1)
            self.workers = list(event.get("workers") or [])
            self.nodes = event.get("nodes")
            self._epoch_times.clear()  # a new attempt starts (after a restart, from its checkpoint): a new pace
        elif kind == EventKind.STEP:
            self.step = event.get("step") if isinstance(event.get("step"), int) else None
            self.steps = event.get("steps") if isinstance(event.get("steps"), int) else None
            self.step_epoch = event.get("epoch") if isinstance(event.get("epoch"), int) else None
        elif kind == EventKind.REPORT:
            self.step = self.steps = self.step_epoch = None
            self.iterations = int(event.get("iteration") or self.iterations + 1)
            self.attempts = max(self.attempts, int(event.get("attempt") or 0))
            if isinstance(event.get("epochs"), int):
                self.epochs = event["epochs"]
            self.metrics = dict(event.get("metrics") or {})
            epoch = self.metrics.get("epoch")
            self.epoch = int(epoch) if isinstance(epoch, (int, float)) else self.iterations
            if self._epoch_times:
                waited = at - self._epoch_times[-1][1]
                self.slowest_report_s = max(self.slowest_report_s or 0.0, waited)
            self._epoch_times.append((self.epoch, at))
            del self._epoch_times[:-(_PACE_EPOCHS + 1)]
        elif kind == EventKind.RESTART:
            self.restarts.append(Restart(int(event.get("attempt") or self.attempts), str(event.get("reason") or ""),
                                         at, event.get("run")))
        elif kind == EventKind.TRAIN_END:
            self.training_state = event.get("state")
        elif kind == EventKind.CAUSE:
            self.causes.append(event)
        elif kind == EventKind.RETRY:
            # Decided (``waiting``), then started; an earlier version's single event says both. A stop during
            # the wait leaves the decision only: that attempt never ran.
            if event.get("state") == RETRY_WAITING:
                self.retry_waiting = event
            else:
                self.retries.append({**(self.retry_waiting or {}), **event})
                self.retry_waiting = None
        elif kind == EventKind.WAIT:
            self.waiting = str(event.get("text") or "") or None
        elif kind == EventKind.STALL:
            self.stalled_s = float(event.get("silent_s") or 0.0)
        elif kind == EventKind.RESOURCES:
            self.resources = event
        elif kind == EventKind.TRIAL:
            trial = self.trials.setdefault(str(event.get("trial")), {"state": None, "values": {}, "epoch": None,
                                                                     "metric": None})
            trial["state"] = event.get("state")
            for key in ("values", "epoch", "metric"):
                if event.get(key) is not None:
                    trial[key] = event[key]

    @property
    def decided(self) -> bool:
        """Whether the agent beside the job has said why an attempt failed (then nothing else is read into the log)."""
        return bool(self.causes)

    def diagnosis(self) -> Diagnosis | None:
        """Why the last attempt failed, as the agent decided (None: it recognised no cause, or said nothing yet)."""
        return Diagnosis.from_event(self.causes[-1]) if self.causes else None

    def trials_text(self) -> str | None:
        """``trials: 1 running, 2 ended, 1 failed``; None outside a sweep."""
        if not self.trials:
            return None
        states: dict[str, int] = {}
        for trial in self.trials.values():
            shown = "running" if trial["state"] == "started" else str(trial["state"])
            states[shown] = states.get(shown, 0) + 1
        return "trials: " + ", ".join(f"{count} {state}" for state, count in states.items())

    def seconds_per_epoch(self) -> float | None:
        """The recent pace, from the reports of the current attempt; None before two of them."""
        if len(self._epoch_times) < 2:
            return None
        (first_epoch, first_at), (last_epoch, last_at) = self._epoch_times[0], self._epoch_times[-1]
        if last_epoch <= first_epoch:
            return None
        return (last_at - first_at) / (last_epoch - first_epoch)

    def eta_s(self) -> float | None:
        """Seconds until the last epoch is reported, at the recent pace; None while unknown."""
        pace = self.seconds_per_epoch()
        if pace is None or self.epochs is None or self.epoch is None:
            return None
        return max(0.0, (self.epochs - epochs_done(self)) * pace)

    def as_dict(self) -> dict[str, Any]:
        """The stable JSON form (``--output json``'s ``progress``, ``RunResult.progress``)."""
        return {
            "stage": self.stage, "epoch": self.epoch, "epochs": self.epochs, "iterations": self.iterations,
            "metrics": self.metrics, "attempts": self.attempts, "nodes": self.nodes,
            "restarts": [restart.as_dict() for restart in self.restarts], "training_state": self.training_state,
            "seconds_per_epoch": self.seconds_per_epoch(), "counts": self.counts, "events": self.events,
            "step": self.step, "steps": self.steps, "trials": self.trials,
            "job_attempts": len(self.retries) + 1, "causes": self.causes, "waiting": self.waiting,
            "stalled_s": self.stalled_s, "resources": self.resources,
        }


def shown_metrics(metrics: dict[str, Any], limit: int = _METRICS_SHOWN) -> list[tuple[str, Any]]:
    """The few metrics worth a glance: losses and accuracies first, then throughput, in the job's order."""
    def rank(name: str) -> int:
        lowered = name.lower()
        if "loss" in lowered:
            return 0
        if "acc" in lowered or lowered in ("f1", "auc", "top1", "top5"):
            return 1
        if lowered.endswith(("_per_s", "per_sec", "_per_second", "throughput")):
            return 2
        return 3

    candidates = [(name, value) for name, value in metrics.items()
                  if name not in ("epoch", "step", "iteration") and isinstance(value, (int, float))]
    wanted = [item for item in candidates if rank(item[0]) < 3] or candidates
    return sorted(wanted, key=lambda item: rank(item[0]))[:limit]


def pace_parts(progress: RunProgress, with_eta: bool = True) -> list[str]:
    """``["2.0s/epoch", "ETA 1m10s"]``, as far as they are known."""
    parts = []
    pace = progress.seconds_per_epoch()
    if pace is not None:
        parts.append(f"{pace:.1f}s/epoch")
    eta = progress.eta_s()
    if eta is not None and with_eta:
        parts.append(f"ETA {format_duration(eta)}")
    return parts


def epochs_done(progress: RunProgress) -> float:
    """Epochs reported, plus the share of the next one its steps so far make (where the job says)."""
    done = float(progress.epoch or 0)
    if progress.step is not None and progress.steps:
        done += min(1.0, progress.step / progress.steps)
    return done


def position_text(progress: RunProgress) -> str:
    """``epoch 3/10`` (``iteration 7`` when the loop reports no epoch and names no length)."""
    if progress.epoch is None:
        return "waiting for the first report"
    unit = "epoch" if "epoch" in progress.metrics or progress.epochs is not None else "iteration"
    return f"{unit} {progress.epoch}" + (f"/{progress.epochs}" if progress.epochs is not None else "")


def event_line(event: dict[str, Any], progress: RunProgress) -> str | None:
    """The one plain line an event becomes where no live view is drawn (a pipe, a CI log); None: no line."""
    kind = kind_of(event)
    if kind == EventKind.STAGE:
        where = f" ({event['index']}/{event['count']})" if event.get("index") and event.get("count") else ""
        if event.get("state") == "start":
            return f"stage {event.get('name')}{where} started"
        took = f" in {format_duration(float(event['seconds']))}" if event.get("seconds") is not None else ""
        return f"stage {event.get('name')}{where} finished{took}"
    if kind == EventKind.COUNT and event.get("final"):
        return f"{event.get('name')}: {event.get('done')}" + (f"/{event['total']}" if event.get("total") else "")
    if kind == EventKind.TRAIN_START:
        parts = [f"{event.get('workers')} workers" if event.get("workers") else None,
                 f"{event['epochs']} epochs" if event.get("epochs") else None,
                 f"max_failures {event['max_failures']}" if event.get("max_failures") is not None else None]
        return "training started: " + ", ".join(part for part in parts if part)
    if kind == EventKind.ATTEMPT:
        nodes = event.get("nodes")
        workers = event.get("workers") or []
        return (f"training attempt {event.get('attempt')}: {len(workers)} workers on {nodes} "
                f"node{'s' if nodes != 1 else ''}")
    if kind == EventKind.REPORT:
        parts = [position_text(progress)]
        parts += [f"{name} {format_value(value)}" for name, value in shown_metrics(progress.metrics)]
        parts += pace_parts(progress)
        if event.get("checkpoint"):
            parts.append("checkpoint saved")
        if progress.resources is not None:
            parts.append(usage_line(progress.resources))
        return " · ".join(parts)
    if kind == EventKind.RESTART:
        return (f"training attempt {event.get('attempt')} failed; Ray Train restarts it from the last checkpoint: "
                f"{short_reason(event.get('reason'))}")
    if kind == EventKind.TRAIN_END:
        state = event.get("state")
        attempts = event.get("attempts") or progress.attempts
        line = f"training {str(state).lower()} after {progress.iterations} reports"
        line += f" in {attempts} attempts" if attempts and attempts > 1 else ""
        if state == "ERRORED" and event.get("reason"):
            line += f": {short_reason(event.get('reason'))}"
        return line
    if kind == EventKind.TRIAL:
        return trial_line(event, progress)
    # The agent's decisions (cause, retry, wait, stall) come with a line of its own in the log: that line is shown.
    return None


def trial_line(event: dict[str, Any], progress: RunProgress) -> str | None:
    """One line per change of a sweep's trial, with where the sweep stands."""
    name, state = event.get("trial"), event.get("state")
    if state == "started":
        values = ", ".join(f"{path.removeprefix('workload.')}={format_value(value)}"
                           for path, value in sorted((event.get("values") or {}).items()))
        line = f"trial {name} started: {values}"
    elif state == "running":
        metric = event.get("metric")
        line = f"trial {name}: epoch {event.get('epoch')}" + (f" · {format_value(metric)}" if metric is not None else "")
    else:
        line = f"trial {name} {state}"
    standing = progress.trials_text()
    return f"{line} ({standing})" if standing else line
