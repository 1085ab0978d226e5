"""A user's own Ray Train script recorded in MLflow with no change to it: a callback in the Train controller.

``rayjobs submit`` names :class:`TrackingCallback` in ``RAY_TRAIN_CALLBACKS`` for a spec with
``tracking: mlflow:`` and no workload (the built-in workloads record their own runs). Ray Train v2
builds it in every ``TorchTrainer`` of the job and runs it in the controller, which sees every report
once all ranks made it. Each training run becomes one MLflow run: its ``train_loop_config`` as
parameters, each report's numbers as metrics at their step (the report's ``epoch`` or ``step`` when it
has one, else its count), and where its checkpoints go as tags. A run folder that an earlier job
trained in (same ``storage_path`` and ``name``) continues its MLflow run, as the built-in workloads do.

It must never fail or stall the training. Every hook catches its own exceptions (Ray fails the run on
one). The requests go out from a thread of its own, so a slow server holds up no report; what is left
to send when the run ends gets a few seconds. When MLflow is not installed on the cluster, or its
server cannot be reached at the start, the log says so once and the run goes on unrecorded.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from ..mlflow_tracking import first_line, job_tags, mlflow_client, mlflow_settings, numeric_metrics, open_run, \
    send_pending

from ..ray_internals import ControllerCallback, ReportCallback, callback_bases
from ..wire import say

_INTERFACES = callback_bases(ControllerCallback, ReportCallback)

CHECKPOINTS_TAG = "rayjobs.checkpoints"
LATEST_CHECKPOINT_TAG = "rayjobs.latest_checkpoint"
# The keys a report names its position by; the first found is its step in MLflow.
STEP_KEYS = ("epoch", "step", "iteration", "training_iteration")
# How long the controller waits at the end of a run for what is left to send (it never waits mid-run).
FINISH_WAIT_S = 20.0
_END_STATES = {"FINISHED": "FINISHED", "ERRORED": "FAILED", "ABORTED": "KILLED"}


class TrackingCallback(*_INTERFACES):  # type: ignore[misc]
    """Records each Ray Train run of the job as one MLflow run. Built in the driver, run in the controller."""

    def __init__(self) -> None:
        # Plain values only: Ray pickles the callback from the driver to the controller.
        self.settings: dict[str, str] | None = None
        self.tags: dict[str, str] = {}
        try:
            self.settings = mlflow_settings()
            self.tags = job_tags()
        except Exception as exc:  # noqa: BLE001 - a callback that cannot be built fails the user's fit()
            _say(f"MLflow tracking is off: its settings could not be read ({first_line(exc)})")
        self.reports = 0
        self.ended = False
        self._sender: _Sender | None = None

    def after_controller_start(self, train_run_context: Any) -> None:
        """Open the run's MLflow run (in the sender's thread) with its loop config as parameters."""
        try:
            if not self.settings:
                return
            run_config = train_run_context.run_config
            name = getattr(run_config, "name", None) or "train"
            storage_path = getattr(run_config, "storage_path", None)
            run_dir = f"{str(storage_path).rstrip('/')}/{name}" if storage_path else name
            params = dict(train_run_context.train_loop_config or {})
            self._sender = _Sender(self.settings)
            self._sender.put(("open", run_dir, name, params, {**self.tags, CHECKPOINTS_TAG: run_dir}))
        except Exception as exc:  # noqa: BLE001
            self._off(exc)

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        """Log the report's numbers at its step, and where its checkpoint went."""
        try:
            self.reports += 1
            if self._sender is None:
                return
            reported = metrics[0] if metrics else {}
            step = next((reported[key] for key in STEP_KEYS if isinstance(reported.get(key), (int, float))
                         and not isinstance(reported.get(key), bool)), self.reports)
            self._sender.put(("metrics", {"metrics": numeric_metrics(reported), "step": int(step)}))
            checkpoint = getattr(training_report, "checkpoint", None)
            if checkpoint is not None and getattr(checkpoint, "path", None):
                self._sender.put(("tag", LATEST_CHECKPOINT_TAG, str(checkpoint.path)))
        except Exception as exc:  # noqa: BLE001
            self._off(exc)

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        """End the MLflow run with the training run: FINISHED, FAILED or KILLED."""
        try:
            state = type(current_state).__name__.removesuffix("State").upper()
            if self._sender is None or self.ended or state not in _END_STATES:
                return
            self.ended = True
            self._sender.put(("end", _END_STATES[state]))
            self._sender.done.wait(FINISH_WAIT_S)
        except Exception as exc:  # noqa: BLE001
            self._off(exc)

    def _off(self, exc: BaseException) -> None:
        self._sender = None
        _say(f"MLflow tracking is off for the rest of this run ({type(exc).__name__}: {first_line(exc)}); "
             "training goes on")

    def __getstate__(self) -> dict[str, Any]:
        # A callback pickled after its run began leaves its thread and queue behind.
        return {**self.__dict__, "_sender": None}


class _Sender:
    """The one thread that talks to MLflow for a run: opens it, then sends what comes, in order."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings
        self.items: queue.Queue = queue.Queue()
        self.done = threading.Event()
        self.run_id: str | None = None
        self.pending: list[dict[str, Any]] = []
        self.warned = False
        self.client: Any = None
        threading.Thread(target=self._run, name="rayjobs-mlflow", daemon=True).start()

    def put(self, item: tuple) -> None:
        """Queue ``item`` for the thread; never blocks."""
        self.items.put(item)

    def _run(self) -> None:
        while True:
            item = self.items.get()
            try:
                if self._handle(item) is False:
                    break
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any one request
                self._warn(f"could not {item[0]} ({first_line(exc)})")
        self.done.set()

    def _handle(self, item: tuple) -> bool | None:
        kind = item[0]
        if kind == "open":
            try:
                self.client = mlflow_client(self.settings)
            except ImportError:
                _say(f"MLflow's client is not installed on the cluster, so this run is not recorded at "
                     f"{self.settings.get('tracking_uri')}: add mlflow to runtime_env.pip (training goes on)")
                return False
            _, run_dir, name, params, tags = item
            try:
                self.run_id = open_run(self.client, self.settings, run_dir, name, params, tags)
            except Exception as exc:  # noqa: BLE001
                _say(f"MLflow at {self.settings.get('tracking_uri')} could not start the run ({first_line(exc)}); "
                     "this run is not recorded, and training goes on")
                return False
        elif self.run_id is None:
            return False
        elif kind == "metrics":
            self.pending.append(item[1])
            self._send()
        elif kind == "tag":
            self.client.set_tag(self.run_id, item[1], item[2])
        elif kind == "end":
            self._send()
            self.client.set_terminated(self.run_id, item[1])
            return False
        return None

    def _send(self) -> None:
        # What could not be sent stays queued in order and goes with the next report or the end.
        try:
            dropped = send_pending(self.client, self.run_id, self.pending)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"could not log metrics ({first_line(exc)}); they are sent again with the next report")
            return
        if dropped:
            self._warn(f"refused a report's metrics ({dropped[0]}); the reports after it are sent as usual")

    def _warn(self, text: str) -> None:
        if not self.warned:
            self.warned = True
            _say(f"MLflow at {self.settings.get('tracking_uri')} {text}; training goes on")


_say = say


