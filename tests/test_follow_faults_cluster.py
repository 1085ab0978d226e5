"""The follower against a network that breaks: a real TCP proxy between ``rayjobs`` and the dashboard.

Each scenario runs the real ``rayjobs`` command in a subprocess against the session
cluster, through a ``FaultProxy`` that cuts, refuses or stalls connections or answers
502 while a job prints numbered lines. The log that reaches stdout must hold every
line exactly once and in order, and the exit code must be the job's outcome.

The ~30 s scenarios and the six concurrent submits (tests/support/follow_scenarios.py) run side
by side in the background from the start of the session's cluster tier, each with its own proxy and
job, while the other cluster tests keep the cluster busy; this module runs last in that tier and checks
what each one saw. Measured figures are written as JSON to ``follow_faults_figures.json`` in pytest's
base temp directory (its path is printed).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from runner.local import loopback_env
from tests.support.cli import REPO_ROOT, cli_env, dashboard_port, direct_api, rayjobs_command
from tests.support.fault_proxy import FaultProxy
from tests.support.follow_scenarios import (
    CLI_TIMEOUT_S,
    ENDED_JOB_LINES,
    EXPECTED_LINES,
    LINE_COUNT,
    LINE_GAP_S,
    MANY_JOBS,
    MAX_REQUESTS_PER_S,
    _figures,
    numbered_lines,
    record_figure,
)
from tests.support.waiting import HANG_GUARD_S


@pytest.fixture(scope="module")
def figures_file(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.getbasetemp() / "follow_faults_figures.json"
    yield path
    path.write_text(json.dumps(_figures, indent=2, sort_keys=True) + "\n")
    print(f"\nfollow-fault figures ({path}):\n{json.dumps(_figures, indent=2, sort_keys=True)}")


def scenario(follow_fault_scenarios: dict[str, Future], name: str) -> dict[str, Any]:
    result = follow_fault_scenarios[name].result(timeout=HANG_GUARD_S * 3)
    record_figure(f"{name}_s", result["elapsed_s"])
    return result


def assert_complete_log(result: dict[str, Any]) -> None:
    assert result["code"] == 0, result["stderr"]
    assert numbered_lines(result["stdout"]) == EXPECTED_LINES, result["stderr"]
    assert "Traceback" not in result["stderr"]
    assert "SUCCEEDED" in result["stderr"]


def test_connections_cut_every_3s(follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "cuts")
    assert_complete_log(result)
    # The faults really happened during the ~30 s job, not after it: about ten cuts on a quiet machine, but a
    # loaded one stretches the proxy's 3 s sleeps, so the bound is what still means "again and again".
    assert result["cuts"] >= 5, result
    assert result["connections_cut"] >= result["cuts"] // 2, result
    assert result["log_streams"] >= 5, result  # the log stream was really reopened again and again
    record_figure("cuts_connections_cut", result["connections_cut"])
    record_figure("cuts_log_stream_reconnects", result["log_streams"] - 1)


def test_outage_shorter_than_give_up(follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "outage")
    assert_complete_log(result)
    assert "lost contact with the cluster" in result["stderr"]
    assert "the job's state is unknown" in result["stderr"] and "not affected" not in result["stderr"]
    assert "contact with the cluster is back after" in result["stderr"]
    assert result["resets"] >= 3, result  # connections were really turned away during the outage
    assert result["lines_before_outage"] < LINE_COUNT / 2, result  # the outage fell well inside the job


def test_outage_longer_than_give_up_leaves_the_job_running(follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "give_up")
    assert result["code"] == 4, result["stderr"]
    assert "state unknown" in result["stderr"] and "may still be running" in result["stderr"]
    assert "Traceback" not in result["stderr"]
    # Not before --give-up-after (5 s) has passed; how soon after it is the benchmarks' business.
    assert 5 <= result["gave_up_after_s"] < HANG_GUARD_S, result
    assert result["status_at_exit"] == "RUNNING", result
    assert result["status_after_stop"] == "STOPPED", result
    record_figure("give_up_exit_after_s", result["gave_up_after_s"])


def test_bad_gateway_for_5s(follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "bad_gateway")
    assert_complete_log(result)
    assert result["bad_gateway_answers"] >= 2, result
    assert "502" in result["stderr"]


def test_stall_for_12s(follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "stall")
    assert_complete_log(result)
    assert "did not answer within" in result["stderr"]
    assert "contact with the cluster is back after" in result["stderr"]


def test_request_rate_of_a_followed_job(ray_cluster, follow_fault_scenarios, figures_file):
    result = scenario(follow_fault_scenarios, "clean")
    assert_complete_log(result)
    info = direct_api(ray_cluster).get_job(result["job_id"])
    job_s = (info["end_time"] - info["start_time"]) / 1000
    rate = result["follower_requests"] / job_s
    record_figure("clean_follower_requests", result["follower_requests"])
    record_figure("clean_job_s", round(job_s, 1))
    record_figure("clean_requests_per_s", round(rate, 2))
    print(f"follower: {result['follower_requests']} requests over a {job_s:.1f}s job = {rate:.2f} requests/s")
    assert job_s >= LINE_COUNT * LINE_GAP_S * 0.9
    assert rate <= MAX_REQUESTS_PER_S, result
    assert result["log_streams"] == 1, result  # nothing broke, so the stream was never reopened


def test_six_concurrent_submits(follow_fault_scenarios, figures_file):
    runs = follow_fault_scenarios["many"].result(timeout=HANG_GUARD_S * 3)
    assert len(runs) == MANY_JOBS
    for run in runs:
        assert run["code"] == run["expected_code"], run
        assert [line for line in run["stdout"].splitlines() if re.search(r"says \d", line)] == \
            [f"job {run['index']} says {n}" for n in range(3)], run
        assert "Traceback" not in run["stderr"], run
    record_figure("concurrent_submits_s", round(max(run["elapsed_s"] for run in runs), 1))


def _cli(home: Path, cluster, *args: str, timeout: float = CLI_TIMEOUT_S, address: str | None = None):
    env = cli_env(home, **loopback_env(cluster))
    extra = ["--address", address] if address else []
    return subprocess.run([*rayjobs_command(), *args, *extra], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def ended_jobs(follow_fault_scenarios) -> dict[int, str]:
    """One job that succeeded and one that failed, each after printing 300 lines: exit code → id.

    They are the first two of the concurrent submits, which print those lines too."""
    runs = follow_fault_scenarios["many"].result(timeout=HANG_GUARD_S * 3)
    ended = {}
    for run in runs[:2]:
        assert run["code"] == run["expected_code"], run
        ended[run["expected_code"]] = re.search(r"submitted many-\d+ as (raysubmit_\w+)", run["stderr"])[1]
    return ended


def test_logs_follow_on_an_ended_job(ray_cluster, ray_cluster_home, ended_jobs, figures_file):
    started = time.monotonic()
    for code, job_id in ended_jobs.items():
        followed = _cli(ray_cluster_home, ray_cluster, "logs", job_id, "--follow")
        assert followed.returncode == code, followed.stderr
        assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(ENDED_JOB_LINES)], followed.stderr
        assert "Traceback" not in followed.stderr
    record_figure("logs_follow_ended_s", round(time.monotonic() - started, 1))


def _follow_through_faults(cluster, home: Path, job_id: str, *faults: tuple[str, str]):
    with FaultProxy(dashboard_port(cluster)) as proxy:
        for path, fault in faults:
            proxy.fail_path(path, fault, times=2)
        followed = _cli(home, cluster, "logs", job_id, "--follow", address=proxy.address)
        return followed, proxy.path_faults_left()


def test_logs_follow_through_status_answers_cut_off_mid_body(ray_cluster, ray_cluster_home, ended_jobs):
    """A short body on a status call is retried like a refused connection, never a traceback."""
    job_id = ended_jobs[1]
    followed, faults_left = _follow_through_faults(ray_cluster, ray_cluster_home, job_id,
                                                   (f"/api/jobs/{job_id}", "truncate"))
    assert "Traceback" not in followed.stderr, followed.stderr
    assert followed.returncode == 1, followed.stderr
    assert faults_left == 0  # both cut-off answers really happened
    assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(ENDED_JOB_LINES)], followed.stderr


def test_logs_follow_through_502s_on_the_final_log_fetch(ray_cluster, ray_cluster_home, ended_jobs):
    """For an ended job the final log fetch is the whole log; a 502 on it must be retried, not lose the log."""
    job_id = ended_jobs[0]
    followed, faults_left = _follow_through_faults(ray_cluster, ray_cluster_home, job_id,
                                                   ("/api/v0/logs/file", "502"))
    assert followed.returncode == 0, followed.stderr
    assert "could not fetch" not in followed.stderr
    assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(ENDED_JOB_LINES)], followed.stderr
    assert faults_left == 0  # both 502s really happened
