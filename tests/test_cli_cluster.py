"""The rayjobs command against a real local Ray cluster (started once per test session)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rayjobs_agent.vocabulary import decode
from runner.errors import RayJobsError
from tests.support.cli import cli_env, direct_api, popen_rayjobs, run_rayjobs, write_spec
from tests.support.waiting import HANG_GUARD_S, wait_for_condition


SLOW_JOB = ("entrypoint: python -c \"import time; [(print('tick', i, flush=True), time.sleep(0.5)) "
            "for i in range(600)]\"\n")


def plain_spec(directory: Path, name: str, body: str) -> Path:
    """A spec that uploads no code (a job whose entrypoint is a shell command or `python -c` needs none): it runs
    beside the agent, and keeps no run record."""
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def job_status(rayjobs_cli, job_id: str) -> str:
    return json.loads(rayjobs_cli("status", job_id, "--output", "json").stdout)["status"]


def api_status(cluster, job_id: str) -> str:
    """A job's status read in this process: waits poll with it, since a `rayjobs` subprocess per poll costs CPU."""
    return direct_api(cluster).get_job(job_id)["status"]


def job_ids(rayjobs_cli) -> set[str]:
    result = rayjobs_cli("list", "--output", "json")
    assert result.returncode == 0, result.stderr
    return {job["submission_id"] for job in json.loads(result.stdout) if job.get("submission_id")}


def test_submit_follows_to_success(rayjobs_cli, tmp_path):
    # Two tasks: each task start is a worker process; 0² + 1² still shows the tasks' results came back.
    spec = write_spec(tmp_path, "hello-ok", "entrypoint: python -m workloads.hello\n"
                                             "workload:\n  kind: hello\n  tasks: 2\n  work_ms: 10\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 0, result.stderr
    assert "hello: sum of squares = 1 (expected 1)" in result.stdout
    assert "SUCCEEDED in" in result.stderr
    assert "Traceback" not in result.stderr


def test_failing_job_exit_code_and_summary(rayjobs_cli, tmp_path):
    spec = write_spec(tmp_path, "hello-fail", "entrypoint: python -m workloads.hello\n"
                                               "workload:\n  kind: hello\n  tasks: 1\n  fail: true\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 1, result.stderr
    assert "FAILED in" in result.stderr
    assert "JOB_ENTRYPOINT_COMMAND_ERROR" in result.stderr
    assert "last lines of its log" in result.stderr
    tail = result.stderr.split("last lines of its log")[1]
    assert "failing on purpose" in tail
    assert "rayjobs-event" not in tail, "the agent's cause event is said in words, not shown as it is written"


def test_a_proxy_in_the_environment_does_not_stand_between_rayjobs_and_a_local_cluster(ray_cluster_home):
    # A corporate HTTP(S)_PROXY with no NO_PROXY; the proxy's port on loopback has nothing listening.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_proxy = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = cli_env(ray_cluster_home, HTTP_PROXY=dead_proxy, HTTPS_PROXY=dead_proxy, http_proxy=dead_proxy,
                  https_proxy=dead_proxy)
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    listed = run_rayjobs("list", "--output", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)


@pytest.fixture(scope="module")
def json_submitted(ray_cluster, ray_cluster_home, tmp_path_factory) -> subprocess.CompletedProcess:
    """`rayjobs submit --output json` of a job that prints one line: its JSON output, and a job Ray's CLI then reads."""
    spec = plain_spec(tmp_path_factory.mktemp("json-out"), "json-out", "entrypoint: echo from-the-job\n")
    return run_rayjobs("submit", str(spec), "--output", "json", home=ray_cluster_home)


def test_json_output_keeps_stdout_parsable(json_submitted):
    result = json_submitted
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "SUCCEEDED" and summary["exit_code"] == 0
    assert "from-the-job" in result.stderr
    # Under stable keys (docs/live-view.md); a job that trains nothing has reported nothing but the resource sample
    # the agent takes as it ends, so that even a job shorter than the sampling interval has its totals.
    progress = summary["progress"]
    resources = progress.pop("resources")
    assert progress == {"stage": None, "epoch": None, "epochs": None, "iterations": 0, "metrics": {},
                        "attempts": 0, "nodes": None, "restarts": [], "training_state": None,
                        "seconds_per_epoch": None, "counts": {}, "events": 1, "step": None,
                        "steps": None, "trials": {}, "job_attempts": 1, "causes": [], "waiting": None,
                        "stalled_s": None}
    assert resources["event"] == "resources" and resources["cpus"] > 0


def test_no_wait_then_logs_follow(rayjobs_cli, tmp_path):
    spec = plain_spec(tmp_path, "no-wait", "entrypoint: python -c \"import time; [(print('line', i, flush=True), "
                                           "time.sleep(0.3)) for i in range(5)]\"\n")
    submitted = rayjobs_cli("submit", str(spec), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.startswith("raysubmit_")
    assert f"rayjobs logs --follow {job_id}" in submitted.stderr
    followed = rayjobs_cli("logs", job_id, "--follow")
    assert followed.returncode == 0, followed.stderr
    lines = [line for line in followed.stdout.splitlines() if line.startswith("line ")]
    assert lines == [f"line {i}" for i in range(5)]
    # An ended job: the whole log again, same outcome code.
    again = rayjobs_cli("logs", job_id, "--follow")
    assert again.returncode == 0
    assert [line for line in again.stdout.splitlines() if line.startswith("line ")] == lines
    # The log as written: after the job's last line, the agent's own lines (its last resource sample) may follow.
    tail = rayjobs_cli("logs", job_id, "--tail", "3")
    assert [line for line in tail.stdout.splitlines() if decode(line) is None][-1] == "line 4", tail.stdout


def test_stop_and_status_and_delete(detached, rayjobs_cli):
    # The job the Ctrl-C test left running (one slow job serves both).
    job_id = detached["job_id"]
    running = rayjobs_cli("status", job_id)
    assert running.returncode == 0 and "RUNNING" in running.stdout
    refused = rayjobs_cli("delete", job_id)
    assert refused.returncode == 2 and "only finished jobs can be deleted" in refused.stderr
    stopped = rayjobs_cli("stop", job_id, "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert "STOPPED" in stopped.stderr
    status = rayjobs_cli("status", job_id)
    assert status.returncode == 3 and "STOPPED" in status.stdout
    listed = rayjobs_cli("list", "--status", "STOPPED")
    assert job_id in listed.stdout and "detach" in listed.stdout
    deleted = rayjobs_cli("delete", job_id)
    assert deleted.returncode == 0, deleted.stderr
    gone = rayjobs_cli("status", job_id)
    assert gone.returncode == 6 and "no job" in gone.stderr


def test_unknown_job_id(rayjobs_cli):
    for command in ("status", "logs", "stop"):
        result = rayjobs_cli(command, "raysubmit_doesnotexist")
        assert result.returncode == 6, (command, result.stderr)
        assert "no job 'raysubmit_doesnotexist'" in result.stderr
        assert "Traceback" not in result.stderr


def test_bad_spec_submits_nothing(rayjobs_cli, tmp_path):
    before = job_ids(rayjobs_cli)
    spec = write_spec(tmp_path, "bad", "entrypoint: echo hi\nentrypoint_num_gpu: 1\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 2
    assert "entrypoint_num_gpu: unknown field (did you mean 'entrypoint_num_gpus'?)" in result.stderr
    assert job_ids(rayjobs_cli) == before


def test_a_sweep_no_trial_of_which_fits_is_refused_whatever_started_the_cluster(ray_cluster, rayjobs_cli, tmp_path):
    """The session cluster, addressed by its URL as a cluster started with `ray start` would be."""
    before = job_ids(rayjobs_cli)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(Path("specs/quickstart.yaml").read_text().replace("working_dir: ..", f"working_dir: {Path.cwd()}")
                    + "sweep:\n  metric: val_accuracy\n  mode: max\n  parameters:\n"
                    "    workload.train.lr: {choice: [0.002, 0.0005]}\n")
    result = rayjobs_cli("submit", str(spec), "--address", ray_cluster.dashboard_url,
                         "--set", "workload.train.num_workers=8")
    assert result.returncode == 2, result.stderr
    assert "one trial of the sweep needs 8 CPUs" in result.stderr and "no trial fits" in result.stderr
    assert job_ids(rayjobs_cli) == before


def test_timeout_stops_the_job(ray_cluster, rayjobs_cli, tmp_path):
    spec = plain_spec(tmp_path, "too-slow", SLOW_JOB + "timeout_s: 3\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 5, result.stderr
    assert "ran past its timeout_s of 3s" in result.stderr
    job_id = next(word for word in result.stderr.split() if word.startswith("raysubmit_"))
    if "The stop is queued" in result.stderr:
        # On a loaded machine the job may still be PENDING at 3 s: Ray applies the stop once it starts.
        wait_for_condition(lambda: api_status(ray_cluster, job_id) == "STOPPED", timeout_s=HANG_GUARD_S,
                           interval_s=0.5)
    else:
        assert job_status(rayjobs_cli, job_id) == "STOPPED"


@pytest.fixture(scope="module")
def detached(ray_cluster, ray_cluster_home, tmp_path_factory) -> dict:
    """A slow job followed by `rayjobs submit` until Ctrl-C: the command's exit, and the job it left running.

    The test of `stop`, `status` and `delete` goes on with that same job (it stops it); without it the job is
    stopped when the module ends."""
    spec = plain_spec(tmp_path_factory.mktemp("detach"), "detach", SLOW_JOB)
    # PYTHONFAULTHANDLER: if it hangs, SIGABRT makes it print every thread's stack.
    process = popen_rayjobs("submit", str(spec), home=ray_cluster_home, PYTHONFAULTHANDLER="1")
    try:
        # Interrupt while following: once the job's own output arrives (not an earlier line
        # some library may print while the job is still being submitted).
        line = process.stdout.readline()
        while line and not line.startswith("tick"):
            line = process.stdout.readline()
        assert line, process.stderr.read()
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            pytest.fail(f"still running 30 s after Ctrl-C; its threads then:\n{stderr[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
    job_id = next((word.rstrip(",") for word in stderr.split() if word.startswith("raysubmit_")), None)
    yield {"code": process.returncode, "stderr": stderr, "job_id": job_id,
           "status_after": api_status(ray_cluster, job_id) if job_id else None}
    if job_id:
        # The stop test normally stopped and deleted it already (then the job is gone: nothing to stop).
        with contextlib.suppress(RayJobsError):
            direct_api(ray_cluster).stop_job(job_id)


def test_ctrl_c_detaches_and_leaves_the_job_running(detached):
    assert detached["code"] == 130, detached["stderr"]
    assert "keeps running on the cluster" in detached["stderr"]
    assert detached["job_id"], detached["stderr"]
    assert detached["status_after"] == "RUNNING"


def test_interop_with_ray_job_cli(ray_cluster, rayjobs_cli, json_submitted):
    env = cli_env(None, RAY_ADDRESS=ray_cluster.dashboard_url, RAY_AUTH_MODE="token",
                  RAY_AUTH_TOKEN_PATH=str(ray_cluster.token_file))
    ray_cli = [str(Path(sys.executable).parent / "ray"), "job"]
    # rayjobs submits, Ray's CLI reads it.
    assert json_submitted.returncode == 0, json_submitted.stderr
    job_id = json.loads(json_submitted.stdout)["submission_id"]
    ray_status = subprocess.run([*ray_cli, "status", job_id], capture_output=True, text=True, env=env, timeout=120)
    assert ray_status.returncode == 0, ray_status.stderr
    assert "succeeded" in ray_status.stdout.lower()
    ray_logs = subprocess.run([*ray_cli, "logs", job_id], capture_output=True, text=True, env=env, timeout=120)
    assert "from-the-job" in ray_logs.stdout
    # Ray's CLI submits, rayjobs reads it.
    ray_submit = subprocess.run([*ray_cli, "submit", "--no-wait", "--submission-id", "from-ray-cli", "--",
                                 "echo", "interop-from-ray"], capture_output=True, text=True, env=env, timeout=120)
    assert ray_submit.returncode == 0, ray_submit.stderr
    followed = rayjobs_cli("logs", "from-ray-cli", "--follow")
    assert followed.returncode == 0, followed.stderr
    assert "interop-from-ray" in followed.stdout
    assert rayjobs_cli("status", "from-ray-cli").returncode == 0


def test_missing_token_is_refused_clearly(ray_cluster, tmp_path):
    # A different RAYJOBS_HOME: rayjobs does not know this cluster's token.
    result = run_rayjobs("list", "--address", ray_cluster.dashboard_url, home=tmp_path)
    assert result.returncode == 7
    assert "needs a token" in result.stderr
