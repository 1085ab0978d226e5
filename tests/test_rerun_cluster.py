"""``rayjobs rerun`` on the session cluster: a rerun of a finished training run trains again, and the two records
point at each other."""

from __future__ import annotations

import json

from rayjobs_agent.wire import RECORD_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import build_submission
from tests.support.cli import REPO_ROOT
from tests.support.images import write_tiny_dataset

# The smallest run of the built-in training: the quickstart's code path, one worker, one epoch. Its dataset is
# written here in the preprocess stage's layout, so the job runs the training stage alone (preprocessing would
# start Ray tasks of its own, in processes of their own, and is not what a rerun is about).
TINY_VISION = ["workload.stages=[train]", "workload.data.image_size=16", "workload.train.epochs=1",
               "workload.train.batch_size=8", "workload.train.num_workers=1", "workload.train.max_failures=0",
               "timeout_s=600"]
CLASSES = ["pizza", "sushi"]


def test_a_rerun_of_a_finished_training_run_trains_again_and_the_records_point_at_each_other(rayjobs_cli, tmp_path):
    overrides = [*TINY_VISION, f"workload.data.output_dir={tmp_path / 'data'}",
                 f"workload.storage_path={tmp_path / 'runs'}", "workload.run_name=tiny"]
    write_tiny_dataset(tmp_path / "data", CLASSES, {"train": 6, "val": 2})
    # The finished run as its job left it: its record, and a checkpoint of its last epoch. Submitted again as it
    # was, the training finds that checkpoint and trains nothing; a job less to wait for than training it here.
    spec = load_spec(REPO_ROOT / "specs" / "quickstart.yaml", overrides)
    config = json.loads(build_submission(spec)["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    old = tmp_path / "runs" / "tiny"
    (old / "checkpoint_epoch_0001").mkdir(parents=True)
    (old / "checkpoint_epoch_0001" / "meta.json").write_text(json.dumps({"epoch": 1, "val_accuracy": 0.5}))
    (old / "checkpoint_epoch_0001" / "state.pt").write_bytes(b"weights")
    (old / "run.json").write_text(json.dumps({"status": "SUCCEEDED", "run_dir": str(old), "spec": config["spec"],
                                              "code": config["code"], "attempts": []}))

    again = rayjobs_cli("rerun", str(old), timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    new = tmp_path / "runs" / "tiny-rerun-1"
    assert "already finished" not in again.stdout
    assert "epoch 1/1" in again.stderr, again.stderr[-3000:]
    assert not any(word in again.stderr for word in ("differs", "changed since", "py_modules")), again.stderr[-3000:]
    assert (new / "checkpoint_epoch_0001" / "state.pt").stat().st_size > 1000
    assert json.loads((old / "run.json").read_text())["reruns"] == [str(new)]
    assert json.loads((new / "run.json").read_text())["rerun_of"] == str(old)
