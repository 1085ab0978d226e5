"""The commands that read run records with no cluster (``runs``, ``show``, ``logs RUN``, ``compare``, ``rerun``),
on records the job's own keeper wrote, and what ``submit`` asks a job to record.

One ``runs`` and one ``rerun`` go through the real ``rayjobs`` process; the other calls run the same command
in-process, where what they print and their exit codes are the same and a process start is not the point."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayjobs_agent.wire import RAY_JOB_CONFIG_ENV_VAR, RECORD_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import AGENT_PACKAGE_DIR, RECORD_COMMAND, build_submission
from rayjobs_agent.wire import user_entrypoint
from runner.errors import ExitCode
from runner.records.report import LOST, run_status
from tests.support.cli import cli_env, rayjobs_in_process, run_rayjobs
from tests.support.waiting import HANG_GUARD_S
from rayjobs_agent import supervisor

OBSERVE_PARENT = Path(supervisor.__file__).resolve().parents[1]


def reporting_job(losses: list[float]) -> str:
    events = [{"event": "report", "iteration": i + 1, "epochs": len(losses),
               "metrics": {"epoch": i + 1, "val_loss": loss, "val_accuracy": round(1 - loss, 6)}}
              for i, loss in enumerate(losses)]
    body = "".join(f"print({('rayjobs-event ' + json.dumps(event))!r})\n" for event in events)
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(body)}"


def keep_record(run_dir: Path, submission_id: str, entrypoint: str, spec: dict | None = None) -> None:
    """Run ``entrypoint`` under the keeper as a job would, its log in a file beside ``run_dir``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAYJOBS_")}
    env[RECORD_ENV_VAR] = json.dumps({"name": "cmp", "run_dir": str(run_dir), "every_s": 5, "spec_hash": "h",
                                      "spec": spec or {"name": "cmp", "entrypoint": "train"}})
    env[RAY_JOB_CONFIG_ENV_VAR] = json.dumps({"metadata": {"job_submission_id": submission_id}})
    env["PYTHONPATH"] = str(OBSERVE_PARENT)
    log = run_dir.parent / f"{submission_id}.log"
    with open(log, "ab") as handle:
        subprocess.run([sys.executable, "-m", "rayjobs_agent.supervisor", "--", entrypoint], stdout=handle,
                       stderr=subprocess.STDOUT, env=env, timeout=HANG_GUARD_S, check=False)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """Two finished runs of one study, and a folder that is not a run."""
    root = tmp_path_factory.mktemp("records")
    keep_record(root / "lr-small", "raysubmit_small", reporting_job([0.9, 0.6, 0.4]))
    keep_record(root / "lr-large", "raysubmit_large", reporting_job([0.8, 0.7]) + " && exit 2")
    (root / "not-a-run").mkdir()
    return root


def test_runs_lists_each_run_newest_first_with_status_and_metrics(records):
    listed = run_rayjobs("runs", str(records))
    assert listed.returncode == 0, listed.stderr
    header, first, second = listed.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "STARTED", "DURATION", "ATTEMPTS", "METRICS"]
    assert first.split()[:2] == ["lr-large", "FAILED"] and second.split()[:2] == ["lr-small", "SUCCEEDED"]
    assert "val_loss 0.4" in second and "val_accuracy 0.6" in second

    as_json = json.loads(rayjobs_in_process("runs", str(records), "--output", "json").stdout)
    assert [(run["run"], run["status"], run["iterations"]) for run in as_json] == [
        ("lr-large", "FAILED", 2), ("lr-small", "SUCCEEDED", 3)]


def test_show_logs_and_compare_read_the_record_alone(records, tmp_path):
    shown = rayjobs_in_process("show", str(records / "lr-small"))
    assert shown.returncode == 0, shown.stderr
    assert "status:     SUCCEEDED" in shown.stdout and "3 of 3 reports" in shown.stdout
    assert "1. raysubmit_small  SUCCEEDED exit 0" in shown.stdout

    logs = rayjobs_in_process("logs", str(records / "lr-small"))
    assert logs.stdout.encode() == (records / "raysubmit_small.log").read_bytes()
    assert rayjobs_in_process("logs", str(records / "lr-small"), "--tail", "1").stdout.count("\n") == 1

    plot = tmp_path / "curves.png"
    compared = rayjobs_in_process("compare", str(records / "lr-small"), str(records / "lr-large"), "--plot", str(plot))
    assert compared.returncode == 0, compared.stderr
    rows = {line.split()[0]: line.split()[1:] for line in compared.stdout.splitlines()[1:]}
    assert rows["status"] == ["SUCCEEDED", "FAILED"]
    assert rows["val_loss"] == ["0.4", "0.7"] and rows["val_accuracy"] == ["0.6", "0.3"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "curves of val_loss, val_accuracy" in compared.stderr


def test_a_missing_run_or_one_run_to_compare_is_a_clear_error(records, tmp_path):
    missing = rayjobs_in_process("show", str(tmp_path / "nothing-here"))
    assert missing.returncode == ExitCode.NOT_FOUND and "no run record at" in missing.stderr
    alone = rayjobs_in_process("compare", str(records / "lr-small"))
    assert alone.returncode == ExitCode.BAD_INPUT and "at least two" in alone.stderr
    empty = rayjobs_in_process("runs", str(tmp_path))
    assert empty.returncode == 0 and "no runs recorded in" in empty.stderr


def test_a_running_record_that_stopped_being_updated_reads_as_lost():
    document = {"status": "RUNNING", "upload_every_s": 30, "attempts": [{"updated": 1000.0}]}
    assert run_status(document, now=1000.0 + 60) == "RUNNING"
    assert run_status(document, now=1000.0 + 600) == LOST
    assert run_status({**document, "status": "SUCCEEDED"}, now=1e9) == "SUCCEEDED"


def test_submit_wraps_the_entrypoint_and_masks_secrets_in_the_recorded_spec(tmp_path):
    (tmp_path / "code").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: secretive\nentrypoint: python train.py --note 'it''s'\nsecret_env_vars: [PLAIN]\n"
                    "runtime_env:\n  working_dir: code\n  env_vars:\n    PLAIN: hidden\n    HF_TOKEN: hf_abc\n"
                    "    VISIBLE: shown\n")
    submission = build_submission(load_spec(spec))
    assert submission["entrypoint"].startswith(RECORD_COMMAND + " ")
    assert user_entrypoint(submission["entrypoint"]) == "python train.py --note 'it''s'"
    config = json.loads(submission["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert config["spec"]["runtime_env"]["env_vars"] == {"PLAIN": "***", "HF_TOKEN": "***", "VISIBLE": "shown"}
    assert config["base"] == "~/rayjobs-results" and config["every_s"] == 30
    assert config["code"] == {"working_dir": str(tmp_path / "code"), "git": None}
    assert "hf_abc" not in json.dumps(config) and "hidden" not in json.dumps(config)


def test_a_job_that_uploads_no_code_or_turns_the_record_off_runs_beside_the_agent_without_a_record(tmp_path):
    (tmp_path / "code").mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: plain\nentrypoint: echo hi\n")
    bare = build_submission(load_spec(spec))
    assert bare["entrypoint"] == f"{RECORD_COMMAND} 'echo hi'"
    assert bare["runtime_env"] == {"py_modules": [str(AGENT_PACKAGE_DIR)]}
    spec.write_text("name: plain\nentrypoint: python x.py\nrecord: false\nruntime_env:\n  working_dir: code\n")
    submission = build_submission(load_spec(spec))
    assert submission["entrypoint"] == f"{RECORD_COMMAND} 'python x.py'"
    assert RECORD_ENV_VAR not in submission["runtime_env"]["env_vars"]


def test_rerun_submits_the_recorded_spec_and_refuses_changed_code(tmp_path):
    """The recorded package name is Ray's own hash of the working_dir; rerun computes it again and compares."""
    from jobs.infra import ray_internals

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('v1')\n")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: again\nentrypoint: python train.py\nruntime_env:\n  working_dir: code\n  env_vars:\n"
                         "    API_KEY: s3cret\n")
    loaded = load_spec(spec_file)
    config = json.loads(build_submission(loaded)["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    excludes = ray_internals.default_working_dir_excludes() + build_submission(loaded)["runtime_env"]["excludes"]
    run_dir = tmp_path / "runs" / "again-raysubmit_1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "status": "SUCCEEDED", "spec": config["spec"], "attempts": [],
        "code": {**config["code"], "working_dir_package": ray_internals.package_name(code, excludes)}}))

    env = cli_env(tmp_path / "home")
    refused = run_rayjobs("rerun", str(run_dir), "--dry-run", env=env)
    assert refused.returncode == ExitCode.BAD_INPUT and "set API_KEY in this shell's environment" in refused.stderr

    env["API_KEY"] = "s3cret"
    same = rayjobs_in_process("rerun", str(run_dir), "--dry-run", "--output", "json", env=env)
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["runtime_env"]["working_dir"] == str(code)

    (code / "train.py").write_text("print('v2')\n")
    changed = rayjobs_in_process("rerun", str(run_dir), "--dry-run", env=env)
    assert changed.returncode == ExitCode.BAD_INPUT and "has changed since the run" in changed.stderr
    forced = rayjobs_in_process("rerun", str(run_dir), "--dry-run", "--force", env=env)
    assert forced.returncode == 0 and "warning: the code in" in forced.stderr

    shutil.rmtree(code)
    gone = rayjobs_in_process("rerun", str(run_dir), "--dry-run", env=env)
    assert gone.returncode == ExitCode.BAD_INPUT
    assert "is not valid here" in gone.stderr and "working_dir" in gone.stderr and "does not exist" in gone.stderr
