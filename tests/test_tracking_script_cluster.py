"""``tracking: mlflow:`` on the session cluster: a plain Ray Train script's reports reach MLflow with no change to
the script, and its record compares equal to its spec for a rerun."""

from __future__ import annotations

import shutil

from tests.support.cli import REPO_ROOT
from tests.test_tracking_script import TRACKING

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"


def test_a_plain_ray_train_script_is_recorded_in_mlflow_with_no_change_to_it(rayjobs_cli, mlflow_tracking_server,
                                                                             tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    experiment = f"script-{tmp_path.name}"
    spec = tmp_path / "tracked.yaml"
    spec.write_text(f"name: tracked-script\nentrypoint: python train.py --storage {tmp_path / 'runs'} --epochs 2 "
                    f"--epoch-s 0 --workers 1\nrecord_path: {tmp_path / 'records'}\n"
                    f"runtime_env:\n  working_dir: {code}\n"
                    + TRACKING.format(uri=mlflow_tracking_server.uri, experiment=experiment))
    result = rayjobs_cli("submit", str(spec), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "MLflow tracking is off" not in result.stdout + result.stderr

    client = mlflow_tracking_server.client()
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "plain"
    assert run.data.params["epochs"] == "2" and run.data.params["epoch_s"] == "0.0"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [point.step for point in history] == [1, 2]
    assert run.data.tags["rayjobs.checkpoints"] == f"{tmp_path / 'runs'}/plain"
    assert run.data.tags["rayjobs.latest_checkpoint"].startswith(f"{tmp_path / 'runs'}/plain/checkpoint_")

    # The record the job kept comes back as it was: its code's packages (Ray's own names) and spec compare equal.
    (record,) = (tmp_path / "records").iterdir()
    planned = rayjobs_cli("rerun", str(record), "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert not any(word in planned.stderr for word in ("differs", "changed since", "py_modules")), planned.stderr
    assert f"rayjobs: rerun: the new run would be {tmp_path / 'records'}/tracked-script-raysubmit_" in planned.stderr
