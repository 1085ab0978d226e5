"""A plain Ray Train script on the session cluster, tracked in MLflow, whose progress hook fails.

One job proves two promises about what rayjobs adds to a user's own script:

- ``tracking: mlflow:``: the script's reports reach MLflow with no change to the script, and its record compares
  equal to its spec for a rerun.
- A broken observer never fails a run. The job names two callbacks of its own in ``RAY_TRAIN_CALLBACKS`` (rayjobs
  adds its own after them): one that counts reports, and one built on rayjobs' ``ProgressCallback`` whose report
  hook raises, as a hook of ours would meet a Ray that changed under it. Ray turns an exception in a callback into a
  failed run; the guard turns it into one line in the log and a note in the run record, and the other callbacks,
  the job's own and rayjobs' tracking among them, go on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.records.store import Folder, attempt_events, read_run
from tests.support.cli import plain_train_spec, run_rayjobs
from tests.test_tracking_script import TRACKING

EPOCHS = 3

USER_CALLBACKS = '''
from ray.train.v2._internal.execution.callback import ReportCallback

from rayjobs_agent.guard import guarded
from rayjobs_agent.train_hooks.progress_callback import ProgressCallback


class CountingCallback(ReportCallback):
    def after_report(self, training_report, metrics):
        print(f"user callback: report at epoch {metrics[0]['epoch']}", flush=True)


class BrokenProgress(ProgressCallback):
    @guarded
    def after_report(self, training_report, metrics):
        raise RuntimeError("simulated failure of a progress hook")
'''


@pytest.fixture(scope="module")
def tracked(ray_cluster, ray_cluster_home, mlflow_tracking_server, tmp_path_factory) -> dict:
    """The script's job, submitted and followed to its end; and where it wrote."""
    directory = tmp_path_factory.mktemp("tracked-script")
    experiment = f"script-{directory.name}"
    # One training worker: the callbacks run in the Train controller, whatever the number of workers.
    spec = plain_train_spec(
        directory, "tracked-script", f"--epochs {EPOCHS} --epoch-s 0.1 --workers 1",
        policy=f"record_path: {directory / 'records'}\nrecord_every_s: 1\n",
        runtime_env="  env_vars:\n"
                    "    RAY_TRAIN_CALLBACKS: user_callbacks.CountingCallback,user_callbacks.BrokenProgress\n",
        after=TRACKING.format(uri=mlflow_tracking_server.uri, experiment=experiment))
    (directory / "code" / "user_callbacks.py").write_text(USER_CALLBACKS)
    submitted = run_rayjobs("submit", str(spec), home=ray_cluster_home, timeout=300)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-2000:]
    (record,) = (directory / "records").iterdir()
    return {"submitted": submitted, "experiment": experiment, "runs": directory / "runs", "record": record,
            "home": ray_cluster_home}


def test_a_plain_ray_train_script_is_recorded_in_mlflow_with_no_change_to_it(tracked, mlflow_tracking_server):
    result = tracked["submitted"]
    assert "MLflow tracking is off" not in result.stdout + result.stderr

    client = mlflow_tracking_server.client()
    (run,) = client.search_runs([client.get_experiment_by_name(tracked["experiment"]).experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "plain"
    assert run.data.params["epochs"] == str(EPOCHS) and run.data.params["epoch_s"] == "0.1"
    # Every epoch, though a progress hook beside the tracking failed at each report.
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [point.step for point in history] == list(range(1, EPOCHS + 1))
    runs: Path = tracked["runs"]
    assert run.data.tags["rayjobs.checkpoints"] == f"{runs}/plain"
    assert run.data.tags["rayjobs.latest_checkpoint"].startswith(f"{runs}/plain/checkpoint_")

    # The record the job kept comes back as it was: its code's packages (Ray's own names) and spec compare equal.
    planned = run_rayjobs("rerun", str(tracked["record"]), "--dry-run", home=tracked["home"])
    assert planned.returncode == 0, planned.stderr
    assert not any(word in planned.stderr for word in ("differs", "changed since", "py_modules")), planned.stderr
    assert (f"rayjobs: rerun: the new run would be {tracked['record'].parent}/tracked-script-raysubmit_"
            in planned.stderr)


def test_a_failing_progress_hook_beside_the_jobs_own_callback_leaves_the_training_successful(tracked):
    folder = Folder(str(tracked["record"]))
    document = read_run(folder)
    assert document["status"] == "SUCCEEDED"
    log = run_rayjobs("logs", str(folder.location), home=tracked["home"]).stdout
    assert [line.split("user callback: ", 1)[1] for line in log.splitlines() if "user callback: " in line] == [
        f"report at epoch {epoch}" for epoch in range(1, EPOCHS + 1)], "the job's own callback ran"
    said = [line for line in log.splitlines() if "rayjobs: progress unavailable" in line]
    assert len(said) == 1 and "simulated failure of a progress hook" in said[0], log[-4000:]
    assert said[0].endswith("; the run goes on")
    # rayjobs' own callback, after the job's, went on reporting every epoch.
    (attempt,) = document["attempts"]
    reports = [event for event in attempt_events(folder, attempt["submission_id"]) if event["event"] == "report"]
    assert [event["iteration"] for event in reports] == list(range(1, EPOCHS + 1))
    assert document["iterations"] == EPOCHS and document["cluster"]["nodes"] == 1
    assert any("simulated failure of a progress hook" in note for note in document["notes"]), document["notes"]
