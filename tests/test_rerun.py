"""``rayjobs rerun`` makes a new run linked to the old one: what is decided on the client, the spec a rerun
submits, the links between the records and the checks before it submits.

On the session cluster (test_rerun_cluster.py), a rerun of a finished training run trains again.
"""

from __future__ import annotations

import json
from pathlib import Path

from rayjobs_agent import wire
from rayjobs_agent.wire import RECORD_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import build_submission
from runner.errors import ExitCode
from runner.records.store import Folder
from tests.support.cli import REPO_ROOT, cli_env, rayjobs_in_process, run_rayjobs


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
    workload = json.loads(sent["runtime_env"]["env_vars"][wire.WORKLOAD_ENV_VAR])
    assert workload["run_name"] == "tiny-rerun-3"
    record = json.loads(sent["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert record["run_dir"] == str(new_dir) and record["links"] == {"rerun_of": str(old)}
    assert "the spec differs" not in planned.stderr, "the recorded spec comes back as it was recorded"
    assert "reruns" not in json.loads((old / "run.json").read_text()), "a dry run links nothing"

    continued = rayjobs_in_process("rerun", str(old), "--dry-run", "--continue", "--output", "json", env=env)
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

    same = rayjobs_in_process("rerun", str(old), "--dry-run", "--set", "runtime_env.env_vars.SEED=2", env=env)
    assert same.returncode == 0, same.stderr
    assert ("warning: the spec differs from the recorded one: runtime_env.env_vars.SEED: (not set) in the record, "
            '"2" now') in same.stderr
    assert "requirements.txt is outside the working_dir" in same.stderr
    assert "py_modules" not in same.stderr

    (shared_code / "util.py").write_text("SCALE = 2\n")
    refused = rayjobs_in_process("rerun", str(old), "--dry-run", env=env)
    assert refused.returncode == ExitCode.BAD_INPUT
    assert f"the code in the py_modules entry {shared_code} has changed since the run" in refused.stderr
    forced = rayjobs_in_process("rerun", str(old), "--dry-run", "--force", env=env)
    assert forced.returncode == 0 and "running the code as it is now (--force)" in forced.stderr


def test_the_old_record_gets_the_link_and_an_unwritable_one_does_not_stop_the_rerun(tmp_path):
    from runner.records.rerun import link_rerun, version_differences

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
    from runner.records.rerun import prepare_rerun

    old = recorded_run(tmp_path, vision_spec(tmp_path) + "submission_id: nightly-1\n", "tiny")
    for continue_run in (False, True):
        plan = prepare_rerun(str(old), [], continue_run=continue_run)
        assert plan.loaded.spec.submission_id.startswith("nightly-1-rerun-") and not plan.differences
