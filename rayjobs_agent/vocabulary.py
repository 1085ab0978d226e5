"""The progress events' vocabulary: their marker, their kinds and the fields each kind carries.

This is the one place an event kind is spelled. The job writes events with these names
(``events.emit``) and the client reads them back by the same names, importing this module, which is
standard library only so that it ships to the cluster alone.
A field a reader does not know is ignored, so a kind may gain fields without a new marker.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypedDict

# What starts a progress event in a job's log: ``rayjobs-event {json}``.
EVENT_MARKER = "rayjobs-event"
# The field of every event that names its kind, and the one that says when it was written (Unix seconds).
KIND_FIELD = "event"
TIME_FIELD = "time"


class EventKind:
    """The kinds of progress event, as they appear in an event's ``event`` field."""

    STAGE = "stage"  # a workload's stage started or ended
    COUNT = "count"  # how many items a stage handled
    STEP = "step"  # a step within an epoch, before that epoch reports
    TRAIN_START = "train_start"  # a Ray Train run starts
    ATTEMPT = "attempt"  # a training attempt has its workers
    REPORT = "report"  # all ranks reported: metrics, iteration, checkpoint
    RESTART = "restart"  # an attempt failed and Ray Train starts another
    TRAIN_END = "train_end"  # a Ray Train run ended
    TRIAL = "trial"  # a sweep's trial changed state
    QUEUE = "queue"  # the job's queue let it in, or it ended there without running
    PROGRESS_UNAVAILABLE = "progress_unavailable"  # a hook of rayjobs failed and turned itself off
    CAUSE = "cause"  # the agent's word on why the entrypoint failed
    RETRY = "retry"  # the agent runs the entrypoint again, in the same job
    STALL = "stall"  # the job has been silent past its limit (it is left running)
    WAIT = "wait"  # the job waits for resources the cluster does not have free
    RESOURCES = "resources"  # what the job's processes use now (the agent's sample)


EVENT_KINDS = frozenset(value for name, value in vars(EventKind).items() if name.isupper())


class StageEvent(TypedDict, total=False):
    """``stage``: ``state`` is ``start`` or ``end``; ``seconds`` comes with the end."""

    name: str
    state: str
    index: int
    count: int
    seconds: float


class CountEvent(TypedDict, total=False):
    """``count``: ``done`` of ``total`` items; ``final`` once the count is complete."""

    name: str
    done: int
    total: int
    final: bool


class StepEvent(TypedDict, total=False):
    """``step``: step ``step`` of ``steps`` within epoch ``epoch`` (counted from 1)."""

    epoch: int
    step: int
    steps: int


class TrainStartEvent(TypedDict, total=False):
    """``train_start``: the run's name, planned epochs, workers and failure budget."""

    run: str
    epochs: int
    workers: int
    use_gpu: bool
    resources_per_worker: dict[str, float]
    max_failures: int


class AttemptEvent(TypedDict, total=False):
    """``attempt``: where each rank runs (``rank``, ``node_id``, ``node_ip``, ``pid``, ``gpu_ids``)."""

    run: str
    attempt: int
    workers: list[dict[str, Any]]
    nodes: int
    cluster: dict[str, Any]


class ReportEvent(TypedDict, total=False):
    """``report``: rank 0's metrics (numbers or short text), the iteration, whether a checkpoint came with it."""

    run: str
    attempt: int
    iteration: int
    epochs: int
    metrics: dict[str, Any]
    checkpoint: bool


class RestartEvent(TypedDict, total=False):
    """``restart``: the attempt that failed and why."""

    run: str
    attempt: int
    reason: str


class TrainEndEvent(TypedDict, total=False):
    """``train_end``: ``state`` is ``FINISHED``, ``ERRORED`` or ``ABORTED``."""

    run: str
    state: str
    attempts: int
    iterations: int
    reason: str


class TrialEvent(TypedDict, total=False):
    """``trial``: ``state`` is ``started`` (with ``values``), ``running`` (``epoch``, ``metric``), ``ended`` or ``failed``."""

    trial: str
    state: str
    values: dict[str, Any]
    epoch: int
    metric: float


class QueueEvent(TypedDict, total=False):
    """``queue``: ``state`` is ``admitted`` (``slot``, ``waited_s``, ``admitted_at`` on the head's clock), or
    ``stopped`` / ``failed`` for a job that ended in its queue without running (``position``, ``waited_s``,
    ``reason``)."""

    state: str
    queue: str
    position: int
    reason: str
    slot: int
    waited_s: float
    admitted_at: float


class ProgressUnavailableEvent(TypedDict, total=False):
    """``progress_unavailable``: why a hook turned itself off (the run goes on)."""

    reason: str


class CauseEvent(TypedDict, total=False):
    """``cause``: why attempt ``attempt`` failed (``cause`` "unknown" when no cause is recognised), in words, with
    what to do, the log line that shows it, and whether another attempt could get past it."""

    attempt: int
    exit_code: int
    cause: str
    text: str
    advice: str
    evidence: str
    retryable: bool


# A retry in place is said twice: when it is decided, and when its attempt starts after the wait (a stop during
# the wait starts none). An event without a ``state`` (an earlier version's) says both at once.
RETRY_WAITING = "waiting"
RETRY_STARTED = "started"


class RetryEvent(TypedDict, total=False):
    """``retry``: attempt ``attempt`` (of at most ``attempts``) starts in ``delay_s``, after ``cause`` (``state``
    ``waiting``); then it has started (``state`` ``started``)."""

    attempt: int
    attempts: int
    delay_s: float
    cause: str
    state: str


class StallEvent(TypedDict, total=False):
    """``stall``: nothing of the job's own for ``silent_s`` (its limit ``limit_s``): it is left running."""

    silent_s: float
    limit_s: float


class WaitEvent(TypedDict, total=False):
    """``wait``: the job waits for ``text`` (asked and had, in words); ``advice`` says what would end it."""

    text: str
    advice: str
    asked: dict[str, float]


class ResourcesEvent(TypedDict, total=False):
    """``resources``: the CPU·s the job's processes used (``cpu_s``) in the seconds since the sample before
    (``interval_s``), as cores (``cpu``) of the machine's ``cpus``, their resident memory (``rss_bytes``: a page
    they share counted once, as Linux's PSS does), how many there are, the seconds between samples; with GPUs, how
    many the job holds memory on, their mean utilisation (%), the job's memory on them and their total memory."""

    cpu: float
    cpu_s: float
    interval_s: float
    cpus: float
    rss_bytes: int
    processes: int
    every_s: float
    gpus: int
    gpu_util: float
    gpu_mem_bytes: int
    gpu_mem_total_bytes: int


# Each kind's fields, besides ``event`` and ``time`` which every event has.
EVENT_FIELDS: dict[str, type] = {
    EventKind.STAGE: StageEvent, EventKind.COUNT: CountEvent, EventKind.STEP: StepEvent,
    EventKind.TRAIN_START: TrainStartEvent, EventKind.ATTEMPT: AttemptEvent, EventKind.REPORT: ReportEvent,
    EventKind.RESTART: RestartEvent, EventKind.TRAIN_END: TrainEndEvent, EventKind.TRIAL: TrialEvent,
    EventKind.QUEUE: QueueEvent, EventKind.PROGRESS_UNAVAILABLE: ProgressUnavailableEvent,
    EventKind.CAUSE: CauseEvent, EventKind.RETRY: RetryEvent, EventKind.STALL: StallEvent, EventKind.WAIT: WaitEvent,
    EventKind.RESOURCES: ResourcesEvent,
}
# What the agent says of the job, as against what the job itself does: no sign of the job's own life.
AGENT_KINDS = frozenset({EventKind.CAUSE, EventKind.RETRY, EventKind.STALL, EventKind.WAIT, EventKind.QUEUE,
                         EventKind.RESOURCES})

_EVENT_LINE = re.compile(rf"{EVENT_MARKER} (\{{.*\}})\s*$")


def kind_of(event: dict[str, Any]) -> str | None:
    """The kind an event names, or None when it names none."""
    kind = event.get(KIND_FIELD)
    return kind if isinstance(kind, str) else None


def encode(kind: str, fields: dict[str, Any], time_s: float) -> str:
    """One event as its log line: ``rayjobs-event {json}`` (``events.emit`` prints it)."""
    record = {KIND_FIELD: kind, TIME_FIELD: round(time_s, 3), **fields}
    return f"{EVENT_MARKER} {json.dumps(record, default=str, separators=(',', ':'), allow_nan=False)}"


def decode(line: str) -> dict[str, Any] | None:
    """The event a log line holds, anywhere in it (a process's ``(Name pid=…)`` prefix, colour), or None for any other
    line and a malformed event. An event of a kind this version does not know is read too: readers skip it."""
    if EVENT_MARKER not in line:
        return None
    match = _EVENT_LINE.search(line)
    if match is None:
        return None
    try:
        event = json.loads(match[1])
    except ValueError:
        return None
    return event if isinstance(event, dict) and kind_of(event) is not None else None


__all__ = ["AGENT_KINDS", "EVENT_FIELDS", "EVENT_KINDS", "EVENT_MARKER", "KIND_FIELD", "RETRY_STARTED",
           "RETRY_WAITING", "TIME_FIELD", "EventKind", "decode", "encode", "kind_of"]
