"""Recording a training run in MLflow: one MLflow run per training run, never one per rank.

The driver opens the run (or continues the one an earlier attempt of the same run folder left, found
by its ``rayjobs.run_dir`` tag), with the workload's parameters flattened and tags naming the spec,
submission, attempt and commit. The Ray Train controller logs every report once, with the epoch as
its step (:class:`MlflowReporter`, a ``UserCallback``: it runs in the controller, which sees each
report once all ranks made it). The driver adds the plots and ``metrics.csv`` at the end. A sweep is
a parent run with a child run per trial.

Tracking never fails the job: a server that cannot be reached is said once, in one line, and the job
runs on; metrics that could not be sent are kept in ``<run>/mlflow-unsent.jsonl`` and sent with the
next ones that go through.

The requests themselves, and the parameters and tags, are shared with the callback that records a user's
own Ray Train script (``rayjobs_agent/mlflow_tracking.py``, which runs without this package).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from ray.train import UserCallback

from workloads import storage
from rayjobs_agent.mlflow_tracking import (first_line, job_tags, mlflow_client, mlflow_settings,
                                                       numeric_metrics, open_run, send_pending)
from rayjobs_agent.wire import say
from workloads.storage import StoragePath

UNSENT_FILE = "mlflow-unsent.jsonl"


@contextlib.contextmanager
def tracked_training(run_dir: StoragePath, name: str, params: dict[str, Any],
                     parent: MlflowRun | None = None) -> Iterator[MlflowRun | None]:
    """The MLflow run of one training run for the block (None when the job tracks nothing): ended as ``FAILED``
    when the block raises; the block ends it with :meth:`MlflowRun.finish` once the run's files are written."""
    tracked = MlflowRun.open(run_dir, name, params, *((parent.run_id, parent.settings) if parent else ()))
    try:
        yield tracked
    except Exception:
        if tracked:
            tracked.close("FAILED")
        raise


class MlflowRun:
    """One MLflow run, as the driver and the Train controller both write to it. Picklable."""

    def __init__(self, settings: dict[str, str], run_dir: StoragePath, run_id: str | None = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.run_id = run_id
        self.pending: list[dict[str, Any]] = []  # metrics not sent yet: {"metrics": {...}, "step": n}
        self.warned = False
        self.said_dropped = False
        self.unsent_file = False  # whether this process wrote or read <run>/mlflow-unsent.jsonl

    @classmethod
    def open(cls, run_dir: StoragePath, name: str, params: dict[str, Any], parent_run_id: str | None = None,
             settings: dict[str, str] | None = None) -> MlflowRun | None:
        """The MLflow run of ``run_dir``: continued when an earlier attempt made one, else started; None when the
        job tracks nothing or the server cannot be reached at start (said once; the job runs on)."""
        settings = settings if settings is not None else mlflow_settings()
        if not settings:
            return None
        run = cls(settings, run_dir)
        run.run_id = run._call(lambda client: run._start(client, name, params, parent_run_id), "start the run")
        return run if run.run_id else None

    def reporter(self) -> MlflowReporter:
        """The Ray Train callback that logs each report to this run."""
        return MlflowReporter(self)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Send the numeric ``metrics`` at ``step``, after any that could not be sent before."""
        self.pending.append({"metrics": numeric_metrics(metrics), "step": int(step)})
        if self._call(self._send_pending, "log metrics") is None:
            self._keep_unsent()

    def log_artifacts(self, paths: Iterable[StoragePath | None]) -> None:
        """Upload the files among ``paths`` that exist (plots, ``metrics.csv``), on local disk or in object
        storage, to the run."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rayjobs-mlflow-") as scratch:
            for path in paths:
                if path is None or not storage.exists(path):
                    continue
                local = storage.local_path(path)
                if local is None:  # in object storage: MLflow's client uploads files from disk
                    local = Path(scratch) / path.name
                    local.write_bytes(storage.read_bytes(path))
                self._call(lambda client, file=local: client.log_artifact(self.run_id, str(file)),
                           f"upload {local.name}")

    def finish(self, artifacts: Iterable[StoragePath | None]) -> None:
        """Upload ``artifacts`` (those that exist) and end the run as ``FINISHED``."""
        self.log_artifacts(artifacts)
        self.close("FINISHED")

    def close(self, status: str, tags: dict[str, str] | None = None) -> None:
        """End the run as ``FINISHED`` or ``FAILED``, sending what is still pending first."""
        def end(client: Any) -> bool:
            self._send_pending(client)
            for key, value in (tags or {}).items():
                client.set_tag(self.run_id, key, value)
            client.set_terminated(self.run_id, status)
            return True

        self.pending = self._read_unsent() + self.pending  # what the Train controller could not send
        if self._call(end, "end the run") is None:
            self._keep_unsent()

    def _start(self, client: Any, name: str, params: dict[str, Any], parent_run_id: str | None) -> str:
        return open_run(client, self.settings, str(self.run_dir), name, params, job_tags(), parent_run_id)

    def _send_pending(self, client: Any) -> bool:
        dropped = send_pending(client, self.run_id, self.pending)
        self._forget_unsent()
        if dropped and not self.said_dropped:
            self.said_dropped = True
            say(f"MLflow at {self.settings['tracking_uri']} refused a report's metrics ({dropped[0]}); the reports "
                "after it are sent as usual")
        return True

    def _call(self, action: Any, what: str) -> Any:
        try:
            return action(mlflow_client(self.settings))
        except Exception as exc:  # noqa: BLE001 - tracking must never fail the job
            if not self.warned:
                self.warned = True
                say(f"MLflow at {self.settings['tracking_uri']} could not {what} ({first_line(exc)}); the job runs "
                    f"on, and metrics not sent are kept in {self.run_dir / UNSENT_FILE} and sent later")
            return None

    def _keep_unsent(self) -> None:
        if not self.pending:
            return
        try:
            storage.write_text(self.run_dir / UNSENT_FILE, "".join(json.dumps(entry) + "\n" for entry in self.pending))
            self.unsent_file = True
        except Exception:  # noqa: BLE001 - the run's storage is another failure's business
            pass

    def _read_unsent(self) -> list[dict[str, Any]]:
        try:
            if storage.exists(self.run_dir / UNSENT_FILE):
                self.unsent_file = True
                return [json.loads(line) for line in storage.read_text(self.run_dir / UNSENT_FILE).splitlines() if line]
        except Exception:  # noqa: BLE001
            pass
        return []

    def _forget_unsent(self) -> None:
        # Looked for only where it may be: a request to the run's storage per epoch is not free in S3.
        if not self.unsent_file:
            return
        try:
            storage.delete_file(self.run_dir / UNSENT_FILE)
            self.unsent_file = False
        except Exception:  # noqa: BLE001
            pass


class MlflowReporter(UserCallback):
    """Logs every report of a Ray Train run to its MLflow run, once (rank 0's metrics; they are global)."""

    def __init__(self, run: MlflowRun) -> None:
        self.run = run
        self.reports = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.reports += 1
        if not metrics:
            return
        reported = metrics[0]
        epoch = reported.get("epoch")
        self.run.log_metrics(reported, int(epoch) if isinstance(epoch, (int, float)) else self.reports)
