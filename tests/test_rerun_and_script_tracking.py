"""``rayjobs rerun`` makes a new run linked to the old one, and ``tracking: mlflow:`` records a user's own Ray Train
script through the callback shipped with its code (workloads/rayjobs_observe/tracking_callback.py).

The fast tier checks what is decided on the client: the spec a rerun submits, the links, the checks before it
submits, and the specs that would record nothing. The cluster tier, on the session cluster, shows what only a
job can: a rerun of a finished training run trains again, and a plain script's reports reach MLflow.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs import keys
from jobs.keys import RECORD_ENV_VAR, TRACKING_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import TRACKING_CALLBACK, TRAIN_CALLBACKS_ENV_VAR, build_submission
from runner.errors import ExitCode
from runner.runs.store import Folder
from tests.support.cli import REPO_ROOT, cli_env, run_rayjobs
from tests.support.mlflow_server import free_port
from workloads.rayjobs_observe import mlflow_tracking

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"
TRACKING = "tracking:\n  mlflow:\n    tracking_uri: {uri}\n    experiment: {experiment}\n"
# The smallest run of the built-in training: the quickstart's code path, one worker, one epoch.
TINY_VISION = ["workload.stages=[preprocess, train]", "workload.data.synthetic_per_class=6",
               "workload.data.image_size=16", "workload.train.epochs=1", "workload.train.batch_size=8", "workload.train.num_workers=1",
               "workload.train.max_failures=0", "timeout_s=600"]


def recorded_run(tmp_path: Path, spec_text: str, run_name: str, *, reruns: list[str] | None = None) -> Path:
    """A run folder whose run.json holds what a job of ``spec_text`` would have recorded (as the keeper writes it)."""
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(spec_text)
    config = json.loads(build_submission(load_spec(spec_file))["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    run_dir = tmp_path / "runs" / run_name
    run_dir.mkdir(parents=True)
    document = {"status": "SUCCEEDED", "run_dir": str(run_dir), "spec": config["spec"], "attempts": [],
                "code": config["code"], "versions": {"ray": "0.0.1"}}
    if reruns is not None:
        document["reruns"] = reruns
    (run_dir / "run.json").write_text(json.dumps(document))
    return run_dir


def vision_spec(tmp_path: Path, run_name: str = "tiny") -> str:
    return (f"name: tiny\nentrypoint: python -m workloads.vision\nruntime_env:\n  working_dir: {REPO_ROOT}\n"
            f"workload:\n  kind: vision\n  run_name: {run_name}\n  storage_path: {tmp_path / 'runs'}\n"
            f"  data:\n    source: synthetic\n    output_dir: {tmp_path / 'data'}\n")


def test_a_rerun_is_a_new_run_beside_the_old_one_and_continue_keeps_the_old_one(tmp_path):
    old = recorded_run(tmp_path, vision_spec(tmp_path, "tiny-rerun-1"), "tiny-rerun-1")
    (old.parent / "tiny-rerun-2").mkdir()  # taken by an earlier rerun: the next number is free
    env = cli_env(tmp_path / "home")

    planned = run_rayjobs("rerun", str(old), "--dry-run", "--output", "json", env=env)
    assert planned.returncode == 0, planned.stderr
    new_dir = old.parent / "tiny-rerun-3"
    assert f"rayjobs: rerun: the new run would be {new_dir} (rerun of {old})" in planned.stderr
    sent = json.loads(planned.stdout)
    workload = json.loads(sent["runtime_env"]["env_vars"][keys.WORKLOAD_ENV_VAR])
    assert workload["run_name"] == "tiny-rerun-3"
    record = json.loads(sent["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert record["run_dir"] == str(new_dir) and record["links"] == {"rerun_of": str(old)}
    assert "the spec differs" not in planned.stderr, "the recorded spec comes back as it was recorded"
    assert "reruns" not in json.loads((old / "run.json").read_text()), "a dry run links nothing"

    continued = run_rayjobs("rerun", str(old), "--dry-run", "--continue", "--output", "json", env=env)
    assert continued.returncode == 0, continued.stderr
    record = json.loads(json.loads(continued.stdout)["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert record["run_dir"] == str(old) and "links" not in record
    assert f"rayjobs: rerun: continuing the run in {old}" in continued.stderr


def test_each_difference_from_the_recorded_run_is_listed_and_changed_py_modules_need_force(tmp_path):
    (tmp_path / "code").mkdir()
    shared_code = tmp_path / "shared_code"
    shared_code.mkdir()
    (shared_code / "util.py").write_text("SCALE = 1\n")
    old = recorded_run(tmp_path, f"name: plain\nentrypoint: python train.py\nruntime_env:\n  working_dir: code\n"
                       f"  py_modules: [{shared_code}]\n  pip: {tmp_path / 'requirements.txt'}\n", "plain-raysubmit_1")
    (tmp_path / "requirements.txt").write_text("torch\n")
    document = json.loads((old / "run.json").read_text())
    from jobs.infra import ray_internals

    # What the keeper records: Ray's package of each py_modules entry, rayjobs' own observer last.
    document["code"]["py_modules_packages"] = [ray_internals.package_name(shared_code, []), "_ray_pkg_observer.zip"]
    (old / "run.json").write_text(json.dumps(document))
    env = cli_env(tmp_path / "home")

    same = run_rayjobs("rerun", str(old), "--dry-run", "--set", "runtime_env.env_vars.SEED=2", env=env)
    assert same.returncode == 0, same.stderr
    assert ("warning: the spec differs from the recorded one: runtime_env.env_vars.SEED: (not set) in the record, "
            '"2" now') in same.stderr
    assert "requirements.txt is outside the working_dir" in same.stderr
    assert "py_modules" not in same.stderr

    (shared_code / "util.py").write_text("SCALE = 2\n")
    refused = run_rayjobs("rerun", str(old), "--dry-run", env=env)
    assert refused.returncode == ExitCode.BAD_INPUT
    assert f"the code in the py_modules entry {shared_code} has changed since the run" in refused.stderr
    forced = run_rayjobs("rerun", str(old), "--dry-run", "--force", env=env)
    assert forced.returncode == 0 and "running the code as it is now (--force)" in forced.stderr


def test_the_old_record_gets_the_link_and_an_unwritable_one_does_not_stop_the_rerun(tmp_path):
    from runner.runs.rerun import link_rerun, version_differences

    old = recorded_run(tmp_path, vision_spec(tmp_path), "tiny", reruns=["/elsewhere/tiny-rerun-1"])
    assert link_rerun(Folder(str(old)), str(old.parent / "tiny-rerun-2")) is None
    document = json.loads((old / "run.json").read_text())
    assert document["reruns"] == ["/elsewhere/tiny-rerun-1", str(old.parent / "tiny-rerun-2")]
    assert document["status"] == "SUCCEEDED" and document["spec"]["name"] == "tiny", "the rest is kept as it was"

    (old / "run.json").write_text("{ cut short")
    problem = link_rerun(Folder(str(old)), str(old.parent / "tiny-rerun-3"))
    assert problem is not None and (old / "run.json").read_text() == "{ cut short", "nothing written over it"

    assert version_differences({"versions": {"ray": "2.50.0"}}, "2.60.0") == [
        "the run ran on Ray 2.50.0; the cluster runs Ray 2.60.0"]
    assert version_differences({"versions": {"ray": "2.60.0"}}, "2.60.0") == []


def test_a_fixed_submission_id_gets_a_fresh_one_so_that_the_rerun_never_attaches_to_the_finished_job(tmp_path):
    from runner.runs.rerun import prepare_rerun

    old = recorded_run(tmp_path, vision_spec(tmp_path) + "submission_id: nightly-1\n", "tiny")
    for continue_run in (False, True):
        plan = prepare_rerun(str(old), [], continue_run=continue_run)
        assert plan.loaded.spec.submission_id.startswith("nightly-1-rerun-") and not plan.differences


def test_tracking_is_refused_where_nothing_would_record_it_and_shipped_where_something_does(tmp_path):
    pytest.importorskip("mlflow", reason="the tracking block needs MLflow's client where the spec is checked")
    tracking = TRACKING.format(uri="http://127.0.0.1:5000", experiment="e")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: script\nentrypoint: python train.py\n" + tracking)
    refused = run_rayjobs("validate", str(spec), env=cli_env(tmp_path / "home"))
    assert refused.returncode == ExitCode.BAD_INPUT
    assert "tracking needs code uploaded with the job" in refused.stderr

    (tmp_path / "code").mkdir()
    spec.write_text("name: script\nentrypoint: python train.py\nruntime_env:\n  working_dir: code\n  env_vars:\n"
                    "    RAY_TRAIN_V2_ENABLED: '0'\n" + tracking)
    v1 = run_rayjobs("validate", str(spec), env=cli_env(tmp_path / "home"))
    assert v1.returncode == ExitCode.BAD_INPUT and "turn v2 off" in v1.stderr

    spec.write_text("name: script\nentrypoint: python train.py\nprogress: false\nruntime_env:\n  working_dir: code\n"
                    + tracking)
    env_vars = build_submission(load_spec(spec))["runtime_env"]["env_vars"]
    assert env_vars[TRAIN_CALLBACKS_ENV_VAR] == TRACKING_CALLBACK
    assert json.loads(env_vars[TRACKING_ENV_VAR])["mlflow"]["experiment"] == "e"

    # A workload records its own runs: the callback would record each twice.
    spec.write_text(vision_spec(tmp_path).replace("name: tiny", "name: vision") + tracking)
    env_vars = build_submission(load_spec(spec))["runtime_env"]["env_vars"]
    assert TRACKING_CALLBACK not in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "") and TRACKING_ENV_VAR in env_vars


@pytest.mark.parametrize("mlflow_installed", [True, False])
def test_the_callback_says_once_why_nothing_is_recorded_and_never_raises(mlflow_installed, monkeypatch, capsys):
    from workloads.rayjobs_observe.tracking_callback import TrackingCallback

    if not mlflow_installed:
        monkeypatch.setitem(sys.modules, "mlflow", None)
        monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    down = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(TRACKING_ENV_VAR, json.dumps({"mlflow": {"tracking_uri": down, "experiment": "x"}}))
    callback = TrackingCallback()
    context = SimpleNamespace(run_config=SimpleNamespace(name="plain", storage_path="/tmp/runs"),
                              train_loop_config={"epochs": 2})
    callback.after_controller_start(context)
    for epoch in (1, 2):
        callback.after_report(SimpleNamespace(checkpoint=None), [{"epoch": epoch, "loss": 0.5}])
    callback.after_controller_state_update(None, type("FinishedState", (), {})())
    callback.after_report(None, None)  # what no Ray sends: still no exception
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayjobs:")]
    expected = f"MLflow at {down} could not start the run" if mlflow_installed else "MLflow's client is not installed"
    assert len(said) == 1 and expected in said[0], said


def test_names_shared_with_the_cluster_side_are_the_clients():
    assert mlflow_tracking.TRACKING_ENV_VAR == keys.TRACKING_ENV_VAR
    assert mlflow_tracking.RECORD_ENV_VAR == keys.RECORD_ENV_VAR
    tags = dict(mlflow_tracking._JOB_METADATA_TAGS)
    assert keys.METADATA_SPEC_HASH in tags and keys.METADATA_ATTEMPT in tags


def test_a_rerun_of_a_finished_training_run_trains_again_and_the_records_point_at_each_other(rj, tmp_path):
    overrides = [*TINY_VISION, f"workload.data.output_dir={tmp_path / 'data'}",
                 f"workload.storage_path={tmp_path / 'runs'}", "workload.run_name=tiny"]
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

    again = rj("rerun", str(old), timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    new = tmp_path / "runs" / "tiny-rerun-1"
    assert "already finished" not in again.stdout
    assert "epoch 1/1" in again.stderr, again.stderr[-3000:]
    assert not any(word in again.stderr for word in ("differs", "changed since", "py_modules")), again.stderr[-3000:]
    assert (new / "checkpoint_epoch_0001" / "state.pt").stat().st_size > 1000
    assert json.loads((old / "run.json").read_text())["reruns"] == [str(new)]
    assert json.loads((new / "run.json").read_text())["rerun_of"] == str(old)


def test_a_plain_ray_train_script_is_recorded_in_mlflow_with_no_change_to_it(rj, mlflow_tracking, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    experiment = f"script-{tmp_path.name}"
    spec = tmp_path / "tracked.yaml"
    spec.write_text(f"name: tracked-script\nentrypoint: python train.py --storage {tmp_path / 'runs'} --epochs 2 "
                    f"--epoch-s 0\nrecord_path: {tmp_path / 'records'}\nruntime_env:\n  working_dir: {code}\n"
                    + TRACKING.format(uri=mlflow_tracking.uri, experiment=experiment))
    result = rj("submit", str(spec), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "MLflow tracking is off" not in result.stdout + result.stderr

    client = mlflow_tracking.client()
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "plain"
    assert run.data.params["epochs"] == "2" and run.data.params["epoch_s"] == "0.0"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [point.step for point in history] == [1, 2]
    assert run.data.tags["rayjobs.checkpoints"] == f"{tmp_path / 'runs'}/plain"
    assert run.data.tags["rayjobs.latest_checkpoint"].startswith(f"{tmp_path / 'runs'}/plain/checkpoint_")

    # The record the job kept comes back as it was: its code's packages (Ray's own names) and spec compare equal.
    (record,) = (tmp_path / "records").iterdir()
    planned = rj("rerun", str(record), "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert not any(word in planned.stderr for word in ("differs", "changed since", "py_modules")), planned.stderr
    assert f"rayjobs: rerun: the new run would be {tmp_path / 'records'}/tracked-script-raysubmit_" in planned.stderr
