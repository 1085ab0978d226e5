"""A sweep declared in the spec, run with Ray Tune over the vision workload's TorchTrainer on the in-process Ray.

One small grid sweep of the quickstart on generated images proves what a user relies on: each trial
trains in its own run folder with its own values, a trial that fails is reported while the sweep goes
on, the best trial is chosen by the sweep's metric and mode and its checkpoint, chosen by the same, goes
on to inference, trials.csv and trials.png describe every trial, no placement group outlives the sweep,
MLflow (a real server on loopback) has the sweep as a parent run with one child run per trial, and the
same sweep submitted again, now with refit, runs no finished trial again, trains the best values on the
whole training split and infers with that run. The searchers (random, Optuna's TPE), ASHA, refit, an
edited sweep and a driver killed mid-trial are checked with trials that report set figures instead of
training (tests/support/sweep_trials.py).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.cli import REPO_ROOT
from tests.support.waiting import wait_for_condition
from workloads.ray_train.metrics import read_metrics_csv

EPOCHS = 1
# The second learning rate makes the loss non-finite in the first epoch: that trial fails for real.
GOOD_LR, DIVERGING_LR = 0.01, 1.0e6


def sweep_spec(tmp_path: Path) -> tuple[dict, Path]:
    """The quickstart spec, small, with a grid sweep of its learning rate; and where its run goes."""
    document = yaml.safe_load((REPO_ROOT / "specs" / "quickstart.yaml").read_text())
    workload = document["workload"]
    workload.update(run_name="swept", storage_path=str(tmp_path / "runs"))
    workload["data"].update(output_dir=str(tmp_path / "data"), synthetic_per_class=10, image_size=16)
    # One Train worker per run (trials and refit alike): every Train worker is a process of its own that
    # imports torch, and what a sweep does with a trial does not depend on how many workers train it.
    workload["train"].update(epochs=EPOCHS, batch_size=16, num_workers=1)
    workload["infer"].update(num_actors=1)
    # Chosen by the lowest loss, without a refit: the best trial's own checkpoint goes to inference.
    document["sweep"] = {"metric": "val_loss", "mode": "min", "search": "grid", "refit": False,
                         "parameters": {"workload.train.lr": {"choice": [GOOD_LR, DIVERGING_LR]}}}
    return document, tmp_path / "runs" / "swept"


def run_sweep_in_process(document: dict) -> dict:
    from jobs.loader import validate_spec_data
    from workloads.vision.__main__ import run_stages

    loaded = validate_spec_data(document, REPO_ROOT / "specs" / "quickstart.yaml")
    return run_stages(loaded.workload, loaded.spec.sweep)


def test_a_grid_sweep_trains_each_trial_reports_a_failed_one_infers_with_the_best_and_refits_when_asked(workload_ray,
                                                                                     mlflow_tracking_server,
                                                                                     monkeypatch, tmp_path, capsys):
    import ray

    from rayjobs_agent.wire import TRACKING_ENV_VAR

    document, run_dir = sweep_spec(tmp_path)
    tracking = {"mlflow": {"tracking_uri": mlflow_tracking_server.uri, "experiment": f"sweep-{tmp_path.name}"}}
    document["tracking"] = tracking
    # What the job's environment holds (rayjobs sets it from the spec's tracking block).
    monkeypatch.setenv(TRACKING_ENV_VAR, json.dumps(tracking))
    produced = run_sweep_in_process(document)
    printed = capsys.readouterr().out

    sweep = produced["sweep"]
    assert [(trial.name, trial.values["workload.train.lr"], trial.status) for trial in sweep.trials] == [
        ("trial-0000", GOOD_LR, "FINISHED"), ("trial-0001", DIVERGING_LR, "FAILED")]
    good, failed = sweep.trials
    # Training stopped at the first non-finite step, said where and what to lower, and left no checkpoint.
    assert "diverged: at epoch 1, step " in failed.error and "Lower train.lr" in failed.error, failed.error
    assert failed.best is None and not list(failed.run_dir.glob("checkpoint_epoch_*"))
    assert sweep.best is good and good.run_dir == run_dir / "trials" / "trial-0000"
    rows = read_metrics_csv(good.run_dir / "metrics.csv")
    assert [int(row["epoch"]) for row in rows] == list(range(1, EPOCHS + 1))
    assert good.best == min(row["val_loss"] for row in rows)

    with open(run_dir / "trials.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [(row["trial"], float(row["workload.train.lr"]), row["status"], row["epochs"]) for row in table] == [
        ("trial-0000", GOOD_LR, "FINISHED", str(EPOCHS)), ("trial-0001", DIVERGING_LR, "FAILED", "0")]
    assert abs(float(table[0]["best_val_loss"]) - good.best) < 1e-5
    assert (run_dir / "trials.png").stat().st_size > 1000

    # Trials trained on part of the training split and were compared on the rest, class by class; the
    # validation split, where inference measured the best trial, took no part in the choice.
    def paths(folder: Path) -> set[str]:
        return {path for part in sorted(folder.glob("*.parquet")) for path in pq.read_table(part).column("path").to_pylist()}

    carved = json.loads((run_dir / "selection" / "_manifest.json").read_text())
    assert carved["counts"] == {"train": 60, "val": 20}
    assert set(carved["counts_per_class"]["val"].values()) == {2}
    trained_on, compared_on = paths(run_dir / "selection" / "train"), paths(run_dir / "selection" / "val")
    assert trained_on | compared_on == paths(tmp_path / "data" / "train") and not trained_on & compared_on
    assert not (trained_on | compared_on) & paths(tmp_path / "data" / "val")
    assert "Trials train on 60 of the 80 training images and are compared on the other 20" in printed
    assert f"Test accuracy of the best trial: {produced['infer']['accuracy']:.4f}" in printed

    # Inference used the best trial's checkpoint of the lowest val_loss, in that trial's folder, on the
    # validation split.
    from workloads.vision.training.model import list_checkpoints

    assert produced["infer"]["rows"] == 20
    lowest_loss = min(list_checkpoints(good.run_dir), key=lambda item: item[1]["val_loss"])[0]
    assert produced["infer"]["checkpoint"] == str(lowest_loss)
    assert (good.run_dir / "predictions").is_dir() and (good.run_dir / "inference_metrics.json").exists()
    assert f"Trial trial-0000: epoch {EPOCHS}/{EPOCHS}, val_loss {good.best:.4f}" in printed, "Tune had the report"
    assert f"Best trial: trial-0000 (val_loss {good.best:.4f})" in printed
    assert printed.index("trial-0000  0.01") < printed.index("trial-0001  1e+06"), "the table is best first"

    # No trial's placement group outlives the sweep (Ray removes a group a little after its trainer ends).
    wait_for_condition(lambda: all(group["state"] == "REMOVED"
                                   for group in ray.util.placement_group_table().values()), timeout_s=60)

    # MLflow: the sweep's run, and under it one run per trial.
    client = mlflow_tracking_server.client()
    experiment_id = client.get_experiment_by_name(f"sweep-{tmp_path.name}").experiment_id
    runs = {run.data.tags["rayjobs.run_dir"]: run for run in client.search_runs([experiment_id])}
    assert set(runs) == {str(run_dir), str(good.run_dir), str(failed.run_dir)}
    parent, good_run, failed_run = runs[str(run_dir)], runs[str(good.run_dir)], runs[str(failed.run_dir)]
    assert good_run.data.tags["mlflow.parentRunId"] == failed_run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (good_run.info.status, failed_run.info.status, parent.info.status) == ("FINISHED", "FAILED", "FINISHED")
    assert good_run.data.params["train.lr"] == str(GOOD_LR) and good_run.data.params["train.num_workers"] == "1"
    history = client.get_metric_history(good_run.info.run_id, "val_accuracy")
    assert [(point.step, point.value) for point in history] == [(int(row["epoch"]), row["val_accuracy"])
                                                                for row in rows]
    assert {artifact.path for artifact in client.list_artifacts(good_run.info.run_id)} >= {"metrics.csv",
                                                                                           "loss_curve.png"}
    assert {artifact.path for artifact in client.list_artifacts(parent.info.run_id)} == {"trials.csv", "trials.png"}
    assert parent.data.tags["rayjobs.best_trial"] == "trial-0000"

    # The same sweep again, now with a refit (which a continued sweep honours): Tune's state in the run folder
    # says what is done, and the best values train once more, on every training image.
    document["workload"]["stages"] = ["train", "infer"]
    document["sweep"]["refit"] = True
    again = run_sweep_in_process(document)
    printed = capsys.readouterr().out
    assert "Continuing the sweep" in printed and "Trial trial-0000 started" not in printed
    assert "carved earlier" in printed
    assert [(trial.name, trial.status) for trial in again["sweep"].trials] == [
        ("trial-0000", "FINISHED"), ("trial-0001", "FAILED")]
    assert read_metrics_csv(good.run_dir / "metrics.csv") == rows
    refit = again["sweep"].refit
    assert refit.run_dir == run_dir / "refit" and refit.values == {"workload.train.lr": GOOD_LR}
    refit_rows = read_metrics_csv(refit.run_dir / "metrics.csv")
    assert len(refit_rows) == EPOCHS and refit.score == refit_rows[-1]["val_loss"]
    assert json.loads(next((refit.run_dir).glob("checkpoint_*/meta.json")).read_text())["val_rows"] == 20
    assert again["infer"]["checkpoint"] == str(list_checkpoints(refit.run_dir)[-1][0])
    assert (refit.run_dir / "predictions").is_dir()
    assert (f"Refit on the whole training split: val_loss {refit.score:.4f} on the validation split after {EPOCHS} "
            f"epoch(s); trial-0000 was chosen with val_loss {good.best:.4f} on the held-out share") in printed
    assert "Test accuracy of the refit run (the best values trained on the whole training split): " in printed
    with open(run_dir / "trials.csv", newline="") as handle:
        last = list(csv.DictReader(handle))[-1]
    assert (last["trial"], float(last["workload.train.lr"]), float(last["validation_val_loss"])) == (
        "refit", GOOD_LR, pytest.approx(refit.score, rel=1e-5))
    assert len(client.search_runs([experiment_id])) == 4, "the sweep's MLflow run is continued; the refit is new"


def test_the_held_out_share_is_taken_from_every_class_seeded_and_leaves_each_class_rows_to_train_on():
    from workloads.vision.training.selection import held_out_rows

    labels = [0] * 10 + [1] * 5 + [2] * 2 + [3]
    held = held_out_rows(labels, 0.2, seed=7)
    assert held == held_out_rows(labels, 0.2, seed=7) != held_out_rows(labels, 0.2, seed=8)
    per_class = {label: sum(1 for row in held if labels[row] == label) for label in range(4)}
    assert per_class == {0: 2, 1: 1, 2: 1, 3: 0}, "a share of each class; a class of one row keeps it for training"
    assert all(sum(1 for row in range(len(labels)) if labels[row] == label and row not in held_out_rows(labels, 0.9, 1))
               >= 1 for label in range(4)), "however large the share, every class trains on a row"


def test_asha_stops_a_trial_that_is_behind_at_its_first_rung(workload_ray, tmp_path):
    from jobs.sweep import SweepSpec
    from jobs.workload_contract import Demand
    from tests.support.sweep_trials import EPOCHS, report_the_learning_rate
    from workloads.ray_train.sweep import run_sweep

    # One trial at a time, so the first has reached every rung when the second meets the first one.
    sweep = SweepSpec.model_validate({
        "metric": "val_accuracy", "mode": "max", "search": "grid", "max_concurrent": 1,
        "scheduler": {"asha": {"grace_period": 1, "reduction_factor": 2}},
        "parameters": {"workload.train.lr": {"choice": [0.9, 0.1]}}})
    outcome = run_sweep(sweep, report_the_learning_rate, tmp_path / "run", Demand("training", 1, 1.0), EPOCHS)
    assert [(trial.name, trial.status, trial.epochs) for trial in outcome.trials] == [
        ("trial-0000", "FINISHED", EPOCHS), ("trial-0001", "STOPPED_EARLY", 1)]
    assert outcome.best is outcome.trials[0]
    with open(tmp_path / "run" / "trials.csv", newline="") as handle:
        assert [(row["trial"], row["stopped_early"]) for row in csv.DictReader(handle)] == [
            ("trial-0000", "False"), ("trial-0001", "True")]


def test_a_sweep_whose_driver_dies_mid_trial_continues_from_s3_and_the_trial_resumes_from_its_checkpoint(
        workload_ray, s3_endpoint, aws_env, tmp_path):
    import signal
    import subprocess
    import sys

    from tests.support.ray_instances import driver_env_joining_this_ray
    from tests.support.s3_server import create_bucket
    from tests.support.sweep_trials import EPOCHS, SWEEP_DRIVER
    from jobs.infra import ray_internals
    from tests.support.waiting import HANG_GUARD_S
    from workloads import storage

    create_bucket(s3_endpoint, "rayjobs-sweeps")
    run_dir = f"s3://rayjobs-sweeps/{tmp_path.name}/run"
    starts, stalled = tmp_path / "starts.txt", tmp_path / "stalled"
    job_env = {**aws_env, "SWEEP_STARTS": str(starts), "SWEEP_STALLED": str(stalled)}
    # The sweep runs in a job's driver of its own, joined to this Ray, so that it can die as a job's driver does.
    env = driver_env_joining_this_ray(**job_env, SWEEP_JOB_ENV=json.dumps(job_env))
    command = [sys.executable, "-c", SWEEP_DRIVER, run_dir]
    tune_state = storage.storage_path(run_dir) / "tune"

    def finished_trial_in_the_bucket() -> bool:
        return any("TERMINATED" in storage.read_text(path) for path in storage.list_files(tune_state, ".json")
                   if path.name.startswith("experiment_state"))

    # What Ray Train restores a run from: its record of the checkpoints, written once a report is taken in.
    interrupted_trial_snapshot = storage.storage_path(run_dir) / "trials" / "trial-0001" / (
        ray_internals.checkpoint_snapshot_filename())

    def checkpoint_of_the_first_epoch_recorded() -> bool:
        return storage.exists(interrupted_trial_snapshot) and "checkpoint_" in storage.read_text(
            interrupted_trial_snapshot)

    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            # trial-0001 is in its second epoch, after its trainer's start-up
            try:
                wait_for_condition(stalled.exists, timeout_s=2 * HANG_GUARD_S)
            except AssertionError:
                pytest.fail(f"trial-0001 had not reached its second epoch after {2 * HANG_GUARD_S} s.\n"
                            f"{what_holds_this_ray()}\nthe driver's output:\n"
                            f"{(tmp_path / 'first.log').read_text(errors='replace')[-6000:]}")
            # Each look lists and reads objects in the bucket: once a second is often enough.
            wait_for_condition(finished_trial_in_the_bucket, timeout_s=HANG_GUARD_S, interval_s=1.0)
            wait_for_condition(checkpoint_of_the_first_epoch_recorded, timeout_s=HANG_GUARD_S, interval_s=1.0)
            first.send_signal(signal.SIGKILL)  # as when the job's node is lost
        finally:
            if first.poll() is None:
                first.kill()
            first.wait()

    # Its output goes to a file, which a hang guard's kill leaves for reading.
    with open(tmp_path / "again.log", "w") as log:
        try:
            returncode = subprocess.run(command, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=2 * HANG_GUARD_S).returncode
        except subprocess.TimeoutExpired:
            pytest.fail(f"the second driver had not finished the sweep after {2 * HANG_GUARD_S} s.\n"
                        f"{what_holds_this_ray()}\nits output:\n"
                        f"{(tmp_path / 'again.log').read_text(errors='replace')[-6000:]}")
    again = (tmp_path / "again.log").read_text(errors="replace")
    assert returncode == 0, again[-6000:]
    assert "Continuing the sweep" in again
    trials = json.loads(again.split("TRIALS ", 1)[1].splitlines()[0])
    assert trials == [["trial-0000", "FINISHED", EPOCHS], ["trial-0001", "FINISHED", EPOCHS]]
    assert starts.read_text().splitlines() == ["trial-0000 from epoch 1", "trial-0001 from epoch 1",
                                               "trial-0001 from epoch 2"], "trial-0000 was not run again; " \
        "trial-0001 continued after the checkpoint of its first epoch"
    trial_metrics = storage.read_text(storage.storage_path(run_dir) / "trials" / "trial-0001" / "metrics.csv")
    assert [line.split(",")[0] for line in trial_metrics.splitlines()[1:]] == [str(epoch) for epoch in
                                                                                range(1, EPOCHS + 1)]


def what_holds_this_ray() -> str:
    """The in-process Ray's free resources and its placement groups not yet removed, for a hang's report."""
    import ray

    groups = [(group["placement_group_id"][:8], group["state"], group["bundles"])
              for group in ray.util.placement_group_table().values() if group["state"] != "REMOVED"]
    free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
    return f"CPUs free: {free} of {total}; placement groups not removed: {groups}"


def test_an_optuna_sweep_draws_each_trial_from_the_results_before_it(workload_ray, tmp_path):
    optuna = pytest.importorskip("optuna", reason="optuna (the optuna extra, in dev) is not installed")
    from jobs.sweep import SweepSpec
    from jobs.workload_contract import Demand
    from tests.support.sweep_trials import EPOCHS, report_the_learning_rate
    from workloads.ray_train.sweep import run_sweep

    # Three trials: one drawn at random, then two by TPE, the last from two results that differ.
    bounds, samples = (1e-4, 1.0), 3
    sweep = SweepSpec.model_validate({
        "metric": "val_accuracy", "mode": "max", "search": "optuna", "samples": samples, "seed": 11,
        "max_concurrent": 1,
        "parameters": {"workload.train.lr": {"loguniform": list(bounds)}}})
    outcome = run_sweep(sweep, report_the_learning_rate, tmp_path / "run", Demand("training", 1, 1.0), EPOCHS)
    drawn = [trial.values["workload.train.lr"] for trial in outcome.trials]
    assert [(trial.status, trial.epochs) for trial in outcome.trials] == [("FINISHED", EPOCHS)] * samples
    assert all(bounds[0] <= value <= bounds[1] for value in drawn)

    # The same study replayed with Optuna alone, each trial told what the sweep's trial reported (its
    # learning rate): the sweep drew exactly these values, so TPE saw every result before the next draw.
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
        seed=11, n_startup_trials=sweep.random_trials_first()))
    replayed = []
    for _ in range(samples):
        trial = study.ask({"workload.train.lr": optuna.distributions.FloatDistribution(*bounds, log=True)})
        replayed.append(trial.params["workload.train.lr"])
        study.tell(trial, trial.params["workload.train.lr"])
    assert drawn == replayed
    assert outcome.best is max(outcome.trials, key=lambda trial: trial.best)


def test_a_random_sweep_draws_every_parameter_from_its_distribution(workload_ray, tmp_path):
    from jobs.sweep import SweepSpec
    from jobs.workload_contract import Demand
    from tests.support.sweep_trials import EPOCHS, report_the_learning_rate
    from workloads.ray_train.sweep import run_sweep

    sweep = SweepSpec.model_validate({
        "metric": "val_accuracy", "mode": "max", "search": "random", "samples": 3, "seed": 5,
        "parameters": {"workload.train.lr": {"loguniform": [1e-4, 1.0]},
                       "workload.train.weight_decay": {"choice": [0.0, 0.05]}}})
    outcome = run_sweep(sweep, report_the_learning_rate, tmp_path / "run", Demand("training", 1, 1.0), EPOCHS)
    assert [(trial.name, trial.status) for trial in outcome.trials] == [
        (f"trial-{number:04d}", "FINISHED") for number in range(3)]
    rates = [trial.values["workload.train.lr"] for trial in outcome.trials]
    assert all(1e-4 <= rate <= 1.0 for rate in rates) and len(set(rates)) == 3, rates
    assert {trial.values["workload.train.weight_decay"] for trial in outcome.trials} <= {0.0, 0.05}
    assert outcome.best is max(outcome.trials, key=lambda trial: trial.best)
    with open(tmp_path / "run" / "trials.csv", newline="") as handle:
        assert [float(row["workload.train.lr"]) for row in csv.DictReader(handle)] == pytest.approx(rates)


def test_a_sweep_refits_its_best_values_and_refuses_an_edited_definition_unless_told_to_restart(workload_ray,
                                                                                                tmp_path):
    from jobs.sweep import SweepSpec
    from jobs.workload_contract import Demand
    from tests.support.sweep_trials import EPOCHS, refit_at_half_the_learning_rate, report_the_learning_rate
    from jobs.errors import BadInput
    from workloads.ray_train.sweep import check_definition, run_sweep

    definition = {"metric": "val_accuracy", "mode": "max", "search": "grid",
                  "parameters": {"workload.train.lr": {"choice": [0.3, 0.6]}}}
    run_dir = tmp_path / "run"
    outcome = run_sweep(SweepSpec.model_validate(definition), report_the_learning_rate, run_dir,
                        Demand("training", 1, 1.0), EPOCHS, refit_at_half_the_learning_rate)
    assert outcome.best.name == "trial-0001" and outcome.best.best == 0.6
    refit = outcome.refit
    assert (refit.values, refit.run_dir, refit.epochs, refit.score) == ({"workload.train.lr": 0.6}, run_dir / "refit",
                                                                         EPOCHS, 0.3)
    with open(run_dir / "trials.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["trial"], row["best_val_accuracy"], row["validation_val_accuracy"]) for row in rows] == [
        ("trial-0000", "0.3", ""), ("trial-0001", "0.6", ""), ("refit", "", "0.3")]

    # Edited, then submitted to the same run: refused, naming each change, before anything is touched.
    edited = {**definition, "mode": "min", "parameters": {"workload.train.lr": {"choice": [0.3, 0.9]}}}
    with pytest.raises(BadInput) as refused:
        check_definition(SweepSpec.model_validate(edited), run_dir)
    assert "sweep.mode: 'max' -> 'min'" in str(refused.value)
    assert "sweep.parameters.workload.train.lr: {'choice': [0.3, 0.6]} -> {'choice': [0.3, 0.9]}" in str(refused.value)
    assert "sweep.on_change: restart" in str(refused.value) and (run_dir / "trials" / "trial-0001").is_dir()
    check_definition(SweepSpec.model_validate({**definition, "refit": False}), run_dir)  # honoured, not an edit

    # Asked to restart: the earlier trials go, and the new sweep starts from its first trial.
    check_definition(SweepSpec.model_validate({**edited, "on_change": "restart"}), run_dir)
    assert not any((run_dir / name).exists() for name in ("tune", "trials", "refit", "trials.csv"))
    assert json.loads((run_dir / "sweep.json").read_text())["mode"] == "min"
