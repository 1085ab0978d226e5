"""The spec's ``sweep`` block: checked before anything runs, shown by --dry-run, and its trials followed.

No Ray here: the checks, the trial plan and how many trials fit are pure functions of the spec and the
cluster's resources; the sweep running for real is tests/test_sweep.py.
"""

from __future__ import annotations

import re

import pytest
import yaml

from jobs.errors import SpecError
from jobs.loader import validate_spec_data
from jobs.sweep import SweepSpec, apply_values
from jobs.workload_contract import Demand
from tests.support.cli import REPO_ROOT, run_rayjobs

QUICKSTART = REPO_ROOT / "specs" / "quickstart.yaml"
DOCUMENTED_SWEEP = re.compile(r"```yaml\n(sweep:\n.*?)```", re.DOTALL)


def quickstart_with(sweep: dict) -> dict:
    document = yaml.safe_load(QUICKSTART.read_text())
    document["sweep"] = sweep
    # A layout of its own, not the spec's auto: what a trial asks of the cluster is what these tests count.
    document["workload"]["train"].update(num_workers=2, cpus_per_worker=1)
    return document


def problems_of(sweep: dict) -> list[str]:
    with pytest.raises(SpecError) as raised:
        validate_spec_data(quickstart_with(sweep), QUICKSTART)
    return [f"{'.'.join(map(str, problem.path))}: {problem.message}" for problem in raised.value.problems]


def a_sweep(**parameters: dict) -> dict:
    return {"metric": "val_accuracy", "mode": "max", "parameters": parameters}


def test_the_documented_sweep_block_fits_onto_the_quickstart_spec():
    block = DOCUMENTED_SWEEP.search((REPO_ROOT / "docs" / "sweeps.md").read_text())
    assert block, "docs/sweeps.md shows a sweep block to copy"
    loaded = validate_spec_data(quickstart_with(yaml.safe_load(block[1])["sweep"]), QUICKSTART)
    assert loaded.spec.sweep is not None and loaded.spec.sweep.trial_count() >= 2


@pytest.mark.parametrize(("parameters", "expected"), [
    ({"workload.train.batch_size": {"randint": [0, 64]}},
     "randint [0, 64] can produce 0, which workload.train.batch_size does not accept: Input should be greater than 0"),
    ({"workload.train.epochs": {"uniform": [1, 3]}},
     "workload.train.epochs does not accept: Input should be a valid integer, got a number with a fractional part"),
    ({"workload.train.optimizer": {"choice": ["adamw", "sgdd"]}},
     "can produce 'sgdd', which workload.train.optimizer does not accept"),
    ({"workload.train.lrr": {"choice": [0.1]}}, "workload.train has no field 'lrr' (did you mean 'lr'?)"),
    ({"workload.data.image_size": {"choice": [32, 64]}}, "only workload.train.* can be swept"),
    ({"train.lr": {"choice": [0.1]}}, "is not a workload field: write workload.SECTION.FIELD"),
    ({"workload.train.lr": {"loguniform": [0, 0.1]}}, "loguniform needs a low end above 0"),
    ({"workload.train.lr": {"uniform": [0.1, 0.01]}}, "is not a range"),
    ({"workload.train.lr": {"choice": [0.1], "uniform": [0.1, 0.2]}}, "give exactly one of"),
], ids=["bound", "float-for-int", "choice", "unknown-field", "not-sweepable", "not-workload", "log-zero",
        "backwards", "two-forms"])
def test_a_sweep_that_could_produce_an_invalid_value_is_refused_before_anything_runs(parameters, expected):
    problems = problems_of(a_sweep(**parameters))
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith("sweep.parameters."), problems


def test_the_metric_must_be_one_the_workload_reports():
    (problem,) = problems_of({**a_sweep(**{"workload.train.lr": {"choice": [0.1]}}), "metric": "val_acuracy"})
    assert problem == ("sweep.metric: 'val_acuracy' is not a metric the workload reports (did you mean "
                       "'val_accuracy'?); it reports val_accuracy, val_loss, train_loss")


def test_a_workload_that_does_not_sweep_refuses_a_sweep_block():
    document = {"name": "hi", "entrypoint": "python -m workloads.hello", "workload": {"kind": "hello"},
                "sweep": a_sweep(**{"workload.tasks": {"choice": [1, 2]}})}
    with pytest.raises(SpecError, match="this workload does not run sweeps"):
        validate_spec_data(document, None)


def test_the_bad_spec_names_file_line_and_field_and_exits_2(tmp_path):
    spec = tmp_path / "swept.yaml"
    text = QUICKSTART.read_text().replace("working_dir: ..", f"working_dir: {REPO_ROOT}")
    spec.write_text(text + "sweep:\n  metric: val_accuracy\n  mode: max\n  parameters:\n"
                           "    workload.train.batch_size: {randint: [0, 8]}\n")
    result = run_rayjobs("validate", str(spec))
    assert result.returncode == 2
    line = len(text.splitlines()) + 5
    assert f"{spec}:{line}: sweep.parameters.workload.train.batch_size: randint [0, 8] can produce 0" in result.stderr


def test_grid_trials_are_every_combination_times_the_samples():
    sweep = SweepSpec.model_validate({**a_sweep(**{"workload.train.lr": {"loguniform": [1e-4, 1e-2]},
                                                   "workload.train.weight_decay": {"choice": [0.0, 0.05]},
                                                   "workload.train.optimizer": {"choice": ["sgd", "adamw"]}}),
                                      "search": "grid", "samples": 3})
    assert sweep.trial_count() == 12
    assert len(sweep.grid()) == 4 and {"workload.train.weight_decay": 0.05, "workload.train.optimizer": "sgd"} \
        in sweep.grid()
    random_sweep = sweep.model_copy(update={"search": "random"})
    assert random_sweep.trial_count() == 3


def test_trial_values_land_in_the_workload_document_without_touching_the_original():
    original = {"train": {"lr": 0.1}, "data": {"image_size": 32}}
    applied = apply_values(original, {"workload.train.lr": 0.5, "workload.train.vit.num_layers": 2})
    assert applied == {"train": {"lr": 0.5, "vit": {"num_layers": 2}}, "data": {"image_size": 32}}
    assert original == {"train": {"lr": 0.1}, "data": {"image_size": 32}}


def test_dry_run_prints_the_trial_plan(tmp_path):
    spec = tmp_path / "swept.yaml"
    text = QUICKSTART.read_text().replace("working_dir: ..", f"working_dir: {REPO_ROOT}")
    text = text.replace("num_workers: auto", "num_workers: 2").replace("cpus_per_worker: auto", "cpus_per_worker: 1")
    spec.write_text(text + "sweep:\n  metric: val_accuracy\n  mode: max\n  search: grid\n  samples: 2\n"
                           "  scheduler: {asha: {grace_period: 2}}\n  parameters:\n"
                           "    workload.train.lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
                           "    workload.train.weight_decay: {choice: [0.0, 0.05]}\n")
    result = run_rayjobs("submit", str(spec), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "# sweep: 4 trial(s), choosing by val_accuracy (max), search grid" in result.stdout
    assert "#   workload.train.lr: loguniform [0.0001, 0.01]" in result.stdout
    assert "#   grid point: train.weight_decay=0.05" in result.stdout
    assert "#   each trial: 2 workers × 1 CPU, at most 3 epoch(s)" in result.stdout
    assert "#   scheduler: asha (every trial runs 2 epoch(s) before it can be stopped); at once: auto" in result.stdout
    assert "#   trials compared on: 20% of each class of the training split, held out" in result.stdout
    assert "RAYJOBS_SWEEP" in result.stdout


def test_an_optuna_sweep_is_checked_like_the_others_and_its_plan_says_when_tpe_takes_over():
    pytest.importorskip("optuna", reason="optuna (the optuna extra, in dev) is not installed")
    from jobs.sweep import trial_plan

    loaded = validate_spec_data(quickstart_with({**a_sweep(**{"workload.train.lr": {"loguniform": [1e-4, 1e-2]}}),
                                                 "search": "optuna", "samples": 8}), QUICKSTART)
    plan = trial_plan(loaded.spec.sweep, loaded.workload)
    assert plan["trials"] == 8 and plan["search"] == "optuna (TPE; the first 4 trial(s) drawn at random)"
    assert SweepSpec.model_validate({**a_sweep(**{"workload.train.lr": {"choice": [0.1]}}), "search": "optuna",
                                     "samples": 40}).random_trials_first() == 10, "never more than Optuna's own ten"
    (problem,) = problems_of({**a_sweep(**{"workload.train.lr": {"choice": [0.1, [0.2]]}}), "search": "optuna"})
    assert "optuna chooses among numbers, strings, booleans and null only, not [0.2]" in problem


def test_an_optuna_sweep_without_optuna_installed_is_refused_with_the_install_command(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "optuna"
                        else real_find_spec(name, *args))
    (problem,) = problems_of({**a_sweep(**{"workload.train.lr": {"choice": [0.1, 0.2]}}), "search": "optuna"})
    assert problem.startswith("sweep.search: ") and "pip install 'rayjobs[optuna]'" in problem, problem


def test_how_many_trials_run_at_once_comes_from_the_clusters_resources():
    from jobs.sweep import SweepDoesNotFit as BadInput
    from jobs.sweep import sweep_concurrency, trials_that_fit

    per_trial = Demand("training", count=2, cpus=1.0)
    sweep = SweepSpec.model_validate({**a_sweep(**{"workload.train.lr": {"choice": [0.1, 0.2, 0.3]}}),
                                      "search": "grid"})
    assert trials_that_fit(per_trial, {"CPU": 7.0}) == 3
    assert sweep_concurrency(sweep, per_trial, {"CPU": 16.0}) == 3, "never more than the sweep's trials"
    assert sweep_concurrency(sweep, per_trial, {"CPU": 4.0}) == 2
    with pytest.raises(BadInput, match=r"max_concurrent is 3, and the cluster holds 2 trial\(s\) at once: one trial "
                                       r"needs 2 CPUs \(2 workers × 1 CPU; .*\), the cluster has 4 CPUs"):
        sweep_concurrency(sweep.model_copy(update={"max_concurrent": 3}), per_trial, {"CPU": 4.0})
    with pytest.raises(BadInput, match="no trial fits"):
        sweep_concurrency(sweep, Demand("training", count=2, cpus=1.0, gpus=1), {"CPU": 8.0})


def test_a_sweep_the_cluster_cannot_hold_is_refused_at_submit_before_anything_is_sent():
    import io

    from jobs.submission import build_submission
    from runner.errors import BadInput
    from runner.run.lifecycle import submit_or_attach
    from tests.support.fake_cluster import FakeClient

    sweep = {**a_sweep(**{"workload.train.lr": {"choice": [0.1, 0.2, 0.3]}}), "search": "grid", "max_concurrent": 3}
    loaded = validate_spec_data(quickstart_with(sweep), QUICKSTART)
    client = FakeClient()
    client.nodes = [{"CPU": 2.0}, {"CPU": 2.0}]  # 4 CPUs over two nodes: two trials of 2 workers × 1 CPU
    with pytest.raises(BadInput, match=r"sweep.max_concurrent is 3, and the cluster holds 2 trial\(s\) at once: one "
                                       r"trial needs 2 CPUs \(2 workers × 1 CPU; .*\), the cluster has 4 CPUs "
                                       r"\(its largest node has 2\), so lower "):
        submit_or_attach(client, build_submission(loaded), name="quickstart", loaded=loaded)
    assert not client.called("submit")

    fits = validate_spec_data(quickstart_with({**sweep, "max_concurrent": 2}), QUICKSTART)
    submit_or_attach(client, build_submission(fits), name="quickstart", loaded=fits)
    assert len(client.called("submit")) == 1

    client.autoscaler = True  # the cluster may grow: said, and sent
    notes = io.StringIO()
    submit_or_attach(client, build_submission(loaded), name="quickstart", notes=notes, loaded=loaded)
    assert len(client.called("submit")) == 2
    assert "warning: sweep.max_concurrent is 3" in notes.getvalue() and "autoscales" in notes.getvalue()


def test_the_follower_shows_each_trial_and_where_the_sweep_stands():
    from runner.follow.progress import RunProgress, event_line

    progress = RunProgress()
    lines = []
    for event in [{"event": "trial", "trial": "trial-0000", "state": "started", "values": {"workload.train.lr": 0.01}},
                  {"event": "trial", "trial": "trial-0001", "state": "started", "values": {"workload.train.lr": 1e6}},
                  {"event": "trial", "trial": "trial-0000", "state": "running", "epoch": 1, "metric": 0.5},
                  {"event": "trial", "trial": "trial-0001", "state": "failed"}]:
        progress.update(event)
        lines.append(event_line(event, progress))
    assert lines == ["trial trial-0000 started: train.lr=0.01 (trials: 1 running)",
                     "trial trial-0001 started: train.lr=1e+06 (trials: 2 running)",
                     "trial trial-0000: epoch 1 · 0.5 (trials: 2 running)",
                     "trial trial-0001 failed (trials: 1 running, 1 failed)"]
    assert progress.as_dict()["trials"]["trial-0000"] == {"state": "running", "values": {"workload.train.lr": 0.01},
                                                          "epoch": 1, "metric": 0.5}


def test_the_job_gets_the_checked_sweep(monkeypatch):
    from rayjobs_agent.wire import SWEEP_ENV_VAR
    from jobs.submission import build_submission
    from workloads.params import load_sweep

    loaded = validate_spec_data(quickstart_with(a_sweep(**{"workload.train.lr": {"choice": [0.1, 0.2]}})), QUICKSTART)
    monkeypatch.setenv(SWEEP_ENV_VAR, build_submission(loaded)["runtime_env"]["env_vars"][SWEEP_ENV_VAR])
    assert load_sweep() == loaded.spec.sweep
    monkeypatch.delenv(SWEEP_ENV_VAR)
    assert load_sweep() is None


def test_a_stored_sweep_and_an_edited_one_differ_by_each_changed_field_and_refit_is_no_edit():
    from jobs.sweep import definition_changes, stored_definition

    first = a_sweep(**{"workload.train.lr": {"choice": [0.1, 0.2]}})
    stored = stored_definition(SweepSpec.model_validate(first))
    honoured = {**first, "refit": False, "on_change": "restart"}
    assert definition_changes(stored, SweepSpec.model_validate(honoured)) == []
    edited = {**a_sweep(**{"workload.train.lr": {"loguniform": [1e-4, 1e-2]},
                           "workload.train.weight_decay": {"choice": [0.0]}}), "samples": 3}
    assert definition_changes(stored, SweepSpec.model_validate(edited)) == [
        "sweep.parameters.workload.train.lr: {'choice': [0.1, 0.2]} -> {'loguniform': [0.0001, 0.01]}",
        "sweep.parameters.workload.train.weight_decay: absent -> {'choice': [0.0]}",
        "sweep.samples: 1 -> 3"]


def test_a_sweep_without_refit_trains_nothing_more(tmp_path):
    from workloads.ray_train.sweep import SweepOutcome, TrialOutcome, refit_best

    sweep = SweepSpec.model_validate({**a_sweep(**{"workload.train.lr": {"choice": [0.1]}}), "refit": False})
    best = TrialOutcome("trial-0000", {"workload.train.lr": 0.1}, "FINISHED", 1, 0.5, tmp_path / "trials" / "t")
    outcome = SweepOutcome([best], best, tmp_path / "trials.csv", None)
    assert refit_best(sweep, outcome, lambda *args: pytest.fail("refit ran"), tmp_path) is None


def test_the_checkpoint_to_infer_with_is_the_best_by_the_sweeps_metric_and_mode(tmp_path):
    import json

    from workloads.vision.training.model import META_FILE, STATE_FILE, best_checkpoint

    for epoch, accuracy, loss in ((1, 0.5, 0.9), (2, 0.7, 1.2), (3, 0.6, 0.4)):
        folder = tmp_path / f"checkpoint_epoch_{epoch:04d}"
        folder.mkdir()
        (folder / STATE_FILE).write_bytes(b"state")
        (folder / META_FILE).write_text(json.dumps({"epoch": epoch, "val_accuracy": accuracy, "val_loss": loss}))
    assert best_checkpoint(tmp_path)[1]["epoch"] == 2
    assert best_checkpoint(tmp_path, "val_loss", "min")[1]["epoch"] == 3
    assert best_checkpoint(tmp_path, "val_loss", "max")[1]["epoch"] == 2
