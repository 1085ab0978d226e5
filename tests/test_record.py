"""The run record's keeper (rayjobs_agent/supervisor.py), run as Ray runs an entrypoint: a shell
command whose stdout and stderr are the job's driver log file. No Ray here: what the keeper reads from
Ray (its job's metadata and runtime_env) is given in the same variable Ray sets."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rayjobs_agent.record_layout import RECORD_DIR, RUN_FILE
from rayjobs_agent.vocabulary import EVENT_MARKER
from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_PARENT, RAY_JOB_CONFIG_ENV_VAR, RECORD_ENV_VAR
from runner.records.store import Folder, attempt_events, attempt_log, list_runs, read_run
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from rayjobs_agent import supervisor

OBSERVE_PARENT = Path(supervisor.__file__).resolve().parents[1]
PACKAGE = "_ray_pkg_0123456789abcdef.zip"


def keeper_env(config: dict, submission_id: str = "raysubmit_one", **metadata: str) -> dict[str, str]:
    """The environment Ray and rayjobs give a job's driver: the record's config, the job's config, the module."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_JOB_CONFIG", "RAYJOBS_"))}
    env[RECORD_ENV_VAR] = json.dumps(config)
    env[RAY_JOB_CONFIG_ENV_VAR] = json.dumps({
        "runtime_env": {"working_dir": f"gcs://{PACKAGE}", "py_modules": ["gcs://_ray_pkg_observe.zip"]},
        "metadata": {"job_submission_id": submission_id, **metadata}})
    env["PYTHONPATH"] = os.pathsep.join([str(OBSERVE_PARENT), env.get("PYTHONPATH", "")])
    return env


def run_keeper(entrypoint: str, log: Path, env: dict[str, str], **popen: object) -> subprocess.Popen:
    """Start the keeper on ``entrypoint`` with stdout and stderr appended to ``log``, as Ray's job supervisor does."""
    with open(log, "ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "rayjobs_agent.supervisor", "--", entrypoint],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True, **popen)


def python_command(code: str) -> str:
    """A shell command that runs ``code`` with this Python."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(textwrap.dedent(code))}"


def config_for(run_dir: Path | str, **extra: object) -> dict:
    return {"name": "rec", "run_dir": str(run_dir), "every_s": 1, "spec_hash": "abc123",
            "spec": {"name": "rec", "entrypoint": "python train.py",
                     "runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "***"}}},
            "code": {"working_dir": "/src", "git": {"commit": "f" * 40, "dirty": False, "changes_hash": None}},
            **extra}


REPORTING_JOB = f"""
import json, sys, time
sys.stdout.write("starting\\n")
for i in range(3):
    event = {{"event": "report", "time": time.time(), "iteration": i + 1, "epochs": 3,
              "metrics": {{"epoch": i + 1, "val_loss": 1.0 / (i + 1), "val_accuracy": 0.3 * (i + 1)}}}}
    print("(TrainController pid=1) {EVENT_MARKER} " + json.dumps(event), flush=True)
sys.stdout.buffer.write(b"bytes that are not UTF-8: \\xff\\xfe\\n")
sys.stderr.write("an error line\\n")
sys.exit(3)
"""


def test_the_record_holds_the_log_byte_for_byte_the_events_and_the_outcome(tmp_path):
    log = tmp_path / "job-driver.log"
    log.write_bytes(b"Running entrypoint for job raysubmit_one: ...\n")  # Ray's own first line
    keeper = run_keeper(python_command(REPORTING_JOB), log, keeper_env(config_for(tmp_path / "run")))
    assert keeper.wait(timeout=HANG_GUARD_S) == 3, "the keeper exits as its entrypoint did"

    folder = Folder(str(tmp_path / "run"))
    document = read_run(folder)
    assert document["status"] == "FAILED"
    (attempt,) = document["attempts"]
    assert (attempt["submission_id"], attempt["exit_code"], attempt["status"]) == ("raysubmit_one", 3, "FAILED")
    assert attempt_log(folder, "raysubmit_one") == log.read_bytes(), "the whole log, invalid UTF-8 and all"
    assert attempt["log_bytes"] == log.stat().st_size
    events = attempt_events(folder, "raysubmit_one")
    assert [event["iteration"] for event in events if event["event"] == "report"] == [1, 2, 3]
    # The agent's decision on why it failed is an event of the record too (a plain exit: no known cause), and so are
    # its resource samples, the last taken as the entrypoint ended, before the decision.
    decided = [event for event in events if event["event"] != "resources"][3:]
    assert [(event["event"], event["cause"], event["exit_code"]) for event in decided] == [("cause", "unknown", 3)]
    assert [event["event"] for event in events][-2:] == ["resources", "cause"]
    assert attempt["cause"]["cause"] == "unknown"
    assert document["metrics"] == {"epoch": 3, "val_loss": pytest.approx(1 / 3), "val_accuracy": pytest.approx(0.9)}
    assert (document["iterations"], document["epochs"]) == (3, 3)
    assert document["code"]["working_dir_package"] == PACKAGE, "the package hash Ray gave the working_dir"
    assert document["code"]["git"]["commit"] == "f" * 40
    assert document["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert document["versions"]["ray"], "the cluster's Ray version"


def test_the_record_holds_the_spec_as_the_client_masked_it(tmp_path):
    """The spec in run.json is the one ``rayjobs submit`` hands the job, masked on the way: no value of a secret
    variable, there or copied into the entrypoint, and no URL's password."""
    from jobs.loader import load_spec
    from jobs.submission import build_submission

    token, password = "tok-" + os.urandom(8).hex(), "pw-" + os.urandom(8).hex()
    (tmp_path / "project").mkdir()
    spec = tmp_path / "project" / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: rec
        entrypoint: python train.py --token {token} --db https://me:{password}@db.invalid/x
        runtime_env:
          working_dir: .
          env_vars:
            AWS_SECRET_ACCESS_KEY: {token}
            DATABASE_URL: https://me:{password}@db.invalid/x
        tracking:
          mlflow:
            tracking_uri: https://mlflow.invalid
            experiment: rec
        """))
    submission = build_submission(load_spec(spec))
    config = json.loads(submission["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    config.pop("base", None)
    config["run_dir"] = str(tmp_path / "run")
    keeper = run_keeper(python_command("print('done')"), tmp_path / "job-driver.log", keeper_env(config))
    assert keeper.wait(timeout=HANG_GUARD_S) == 0

    run_json = (tmp_path / "run" / RUN_FILE).read_text()
    assert token not in run_json and password not in run_json
    shown = read_run(Folder(str(tmp_path / "run")))["spec"]
    assert shown["runtime_env"]["env_vars"]["AWS_SECRET_ACCESS_KEY"] == "***"
    assert shown["entrypoint"] == "python train.py --token *** --db https://me:***@db.invalid/x"
    assert shown["tracking"]["mlflow"]["tracking_uri"] == "https://mlflow.invalid"


@pytest.mark.processes
def test_the_log_is_uploaded_while_the_job_runs_and_in_parts(tmp_path):
    log = tmp_path / "job-driver.log"
    job = python_command("""
        import sys, time
        for i in range(40):
            print(f"line {i:04d} " + "x" * 80, flush=True)
        while True:
            time.sleep(0.1)
    """)
    keeper = run_keeper(job, log, keeper_env(config_for(tmp_path / "run", part_bytes=1000)))
    folder = Folder(str(tmp_path / "run"))
    try:
        wait_for_condition(lambda: b"line 0039" in attempt_log(folder, "raysubmit_one"), timeout_s=HANG_GUARD_S)
        document = read_run(folder)
        assert document["status"] == "RUNNING" and document["ended"] is None
        assert attempt_log(folder, "raysubmit_one") == log.read_bytes()
        parts = folder.files(f"{RECORD_DIR}/logs/raysubmit_one")
        assert len(parts) == -(-log.stat().st_size // 1000) > 3, "full parts are kept, the last one grows"
    finally:
        os.killpg(keeper.pid, signal.SIGTERM)  # as `ray job stop` does: the whole process group
        keeper.wait(timeout=HANG_GUARD_S)
    assert keeper.returncode == -signal.SIGTERM, "the keeper dies of the signal its entrypoint died of"
    assert read_run(folder)["status"] == "STOPPED"


@pytest.mark.processes
def test_a_second_submission_of_the_same_run_adds_an_attempt(tmp_path):
    run_dir = tmp_path / "run"
    for submission_id, code in (("raysubmit_a", 1), ("raysubmit_b", 0)):
        log = tmp_path / f"{submission_id}.log"
        env = keeper_env(config_for(run_dir), submission_id,
                         **({METADATA_ATTEMPT: "2", METADATA_PARENT: "raysubmit_a"} if code == 0 else {}))
        assert run_keeper(python_command(f"print('{submission_id}'); raise SystemExit({code})"), log,
                          env).wait(timeout=HANG_GUARD_S) == code
    document = read_run(Folder(str(run_dir)))
    assert [(a["submission_id"], a["attempt"], a["status"]) for a in document["attempts"]] == [
        ("raysubmit_a", 1, "FAILED"), ("raysubmit_b", 2, "SUCCEEDED")]
    assert document["status"] == "SUCCEEDED"
    assert b"raysubmit_a" in attempt_log(Folder(str(run_dir)), "raysubmit_a")


def test_a_job_without_a_run_folder_gets_one_named_after_it_and_its_first_submission(tmp_path):
    config = {**config_for(""), "run_dir": None, "base": str(tmp_path / "records")}
    env = keeper_env(config, "raysubmit_retry", **{METADATA_ATTEMPT: "2", METADATA_PARENT: "raysubmit_first"})
    assert run_keeper("true", tmp_path / "log", env).wait(timeout=HANG_GUARD_S) == 0
    ((folder, document),) = list_runs(Folder(str(tmp_path / "records")))
    assert folder.name == "rec-raysubmit_first"
    assert document["attempts"][0]["attempt"] == 2


@pytest.mark.processes
def test_a_record_that_cannot_be_written_is_said_once_and_the_job_runs_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    log = tmp_path / "log"
    keeper = run_keeper(python_command("import time\nfor i in range(3): print(i, flush=True); time.sleep(0.5)"), log,
                        keeper_env(config_for(blocker / "run")))
    assert keeper.wait(timeout=HANG_GUARD_S) == 0
    text = log.read_text()
    assert text.count("rayjobs: the run record at") == 1, text
    assert "the job goes on" in text and "0\n1\n2\n" in text


@pytest.mark.processes
def test_the_record_goes_to_s3(tmp_path, aws_env, s3_endpoint):
    from tests.support.s3_server import create_bucket

    create_bucket(s3_endpoint, "records")
    log = tmp_path / "log"
    env = {**keeper_env(config_for("s3://records/team/run-1")), **aws_env}
    assert run_keeper(python_command(REPORTING_JOB), log, env).wait(timeout=HANG_GUARD_S) == 3
    ((folder, document),) = list_runs(Folder("s3://records/team"))
    assert folder.location == "s3://records/team/run-1" and document["status"] == "FAILED"
    assert attempt_log(folder, "raysubmit_one") == log.read_bytes()
    assert [event["event"] for event in attempt_events(folder, "raysubmit_one")
            if event["event"] != "resources"] == ["report"] * 3 + ["cause"]


def test_a_killed_entrypoint_leaves_a_failed_record_with_what_it_printed(tmp_path):
    log = tmp_path / "log"
    job = python_command("import os, signal\nprint('before the kill', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    keeper = run_keeper(job, log, keeper_env(config_for(tmp_path / "run")))
    keeper.wait(timeout=HANG_GUARD_S)
    document = read_run(Folder(str(tmp_path / "run")))
    assert document["status"] == "FAILED"
    assert b"before the kill" in attempt_log(Folder(str(tmp_path / "run")), "raysubmit_one")
    started = document["attempts"][0]["started"]
    assert started <= document["ended"] <= time.time()


@pytest.mark.processes
def test_a_stopped_job_keeps_what_its_script_writes_after_the_shell_has_died(tmp_path):
    """Ray stops a job by signalling its process group: the shell dies at once, the script it runs writes last."""
    log = tmp_path / "log"
    job = python_command("""
        import signal, sys, time
        def stopped(signum, frame):
            time.sleep(1)
            print("the script's last words", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, stopped)
        print("running", flush=True)
        time.sleep(60)
    """)
    # Two commands, so that the shell stays the keeper's child and the script is its grandchild.
    keeper = run_keeper(f"true; {job}", log, keeper_env(config_for(tmp_path / "run")))
    wait_for_condition(lambda: b"running" in log.read_bytes(), timeout_s=HANG_GUARD_S)
    os.killpg(keeper.pid, signal.SIGTERM)
    keeper.wait(timeout=HANG_GUARD_S)
    folder = Folder(str(tmp_path / "run"))
    assert read_run(folder)["status"] == "STOPPED"
    assert b"the script's last words" in log.read_bytes()
    assert attempt_log(folder, "raysubmit_one") == log.read_bytes()
