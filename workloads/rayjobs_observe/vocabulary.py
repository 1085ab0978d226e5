"""The progress events' vocabulary: their marker, their kinds and the fields each kind carries.

This is the one place an event kind is spelled. The job writes events with these names
(``events.emit``) and the client reads them back by the same names (``jobs/run_vocabulary.py``
re-exports this module, which is standard library only so that it ships to the cluster alone).
A field a reader does not know is ignored, so a kind may gain fields without a new marker.
"""

from __future__ import annotations

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
    QUEUE = "queue"  # the job waits in, or was admitted by, its queue
    PROGRESS_UNAVAILABLE = "progress_unavailable"  # a hook of rayjobs failed and turned itself off


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
    """``queue``: ``state`` is ``waiting`` (``position``, ``reason``) or ``admitted`` (``slot``, ``waited_s``)."""

    state: str
    queue: str
    position: int
    reason: str
    slot: int
    waited_s: float


class ProgressUnavailableEvent(TypedDict, total=False):
    """``progress_unavailable``: why a hook turned itself off (the run goes on)."""

    reason: str


# Each kind's fields, besides ``event`` and ``time`` which every event has.
EVENT_FIELDS: dict[str, type] = {
    EventKind.STAGE: StageEvent, EventKind.COUNT: CountEvent, EventKind.STEP: StepEvent,
    EventKind.TRAIN_START: TrainStartEvent, EventKind.ATTEMPT: AttemptEvent, EventKind.REPORT: ReportEvent,
    EventKind.RESTART: RestartEvent, EventKind.TRAIN_END: TrainEndEvent, EventKind.TRIAL: TrialEvent,
    EventKind.QUEUE: QueueEvent, EventKind.PROGRESS_UNAVAILABLE: ProgressUnavailableEvent,
}


def kind_of(event: dict[str, Any]) -> str | None:
    """The kind an event names, or None when it names none."""
    kind = event.get(KIND_FIELD)
    return kind if isinstance(kind, str) else None


__all__ = ["EVENT_FIELDS", "EVENT_KINDS", "EVENT_MARKER", "KIND_FIELD", "TIME_FIELD", "EventKind", "kind_of"]
