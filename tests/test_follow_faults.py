"""The follower against a network that breaks: a real TCP proxy between ``rayjobs`` and the dashboard.

Each scenario runs the real ``rayjobs`` command in a subprocess against the session
cluster, through a ``FaultProxy`` that cuts, refuses or stalls connections or answers
502 while a job prints numbered lines. The log that reaches stdout must hold every
line exactly once and in order, and the exit code must be the job's outcome.

The ~30 s scenarios and the twenty concurrent submits run side by side in the
background (each scenario with its own proxy and job), so the file stays under
three minutes and the faults strike while the cluster is busy. Measured figures are written as JSON to
``follow_faults_figures.json`` in pytest's base temp directory (its path is printed).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest

from jobs.status import TERMINAL_STATUSES
from runner.local import loopback_env
from tests.support.cli import REPO_ROOT, CliRun, cli_env, dashboard_port, direct_api, proxied_env, rayjobs_command
from tests.support.fault_proxy import FaultProxy
from tests.support.waiting import HANG_GUARD_S, wait_for_condition


LINE_COUNT = 120
LINE_GAP_S = 0.25
EXPECTED_LINES = [f"line {i}" for i in range(LINE_COUNT)]
COUNTING_JOB = (f"entrypoint: python -c \"import time; [(print('line', i, flush=True), time.sleep({LINE_GAP_S})) "
                f"for i in range({LINE_COUNT})]\"\n")
MAX_REQUESTS_PER_S = 2.0
CLI_TIMEOUT_S = 180
MANY_JOBS = 20
MANY_TIMEOUT_S = 300

_figures: dict[str, Any] = {}
_figures_lock = threading.Lock()


def record_figure(name: str, value: Any) -> None:
    with _figures_lock:
        _figures[name] = value


@pytest.fixture(scope="module")
def figures_file(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.getbasetemp() / "follow_faults_figures.json"
    yield path
    path.write_text(json.dumps(_figures, indent=2, sort_keys=True) + "\n")
    print(f"\nfollow-fault figures ({path}):\n{json.dumps(_figures, indent=2, sort_keys=True)}")


def write_counting_spec(directory: Path, name: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\n{COUNTING_JOB}")
    return path


def numbered_lines(stdout: str) -> list[str]:
    # Every stdout line holding "line <digit>" anywhere counts, so a line glued to a repeated or
    # truncated neighbour shows up as a mismatch instead of being filtered away.
    return [line for line in stdout.splitlines() if re.search(r"line \d", line)]


def run_through_proxy(cluster, home: Path, directory: Path, name: str,
                      faults: Callable[..., dict[str, Any] | None],
                      give_up_after_s: float = 30) -> dict[str, Any]:
    """Submit the counting job through a fresh proxy, inject ``faults`` once it runs, follow to the end."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = write_counting_spec(directory, name)
    with FaultProxy(dashboard_port(cluster)) as proxy:
        run = CliRun(["submit", str(spec), "--address", proxy.address, "--give-up-after", f"{give_up_after_s:g}"],
                     proxied_env(cluster, home))
        try:
            run.wait_for_stdout("line 0")
            following_since = time.monotonic()
            extra = faults(proxy, run, cluster) or {}
            code = run.finish()
        finally:
            if run.process.poll() is None:
                run.process.kill()
        job_id = run.job_id()
        log_requests = [r for r in proxy.requests_to("/api/v0/logs/") if f"submission_id={job_id}" in r.path]
        follower_requests = proxy.requests_to(f"/api/jobs/{job_id}") + log_requests
        return {"code": code, "stdout": run.stdout, "stderr": run.stderr, "job_id": job_id,
                "elapsed_s": round(run.elapsed_s, 1), "following_s": round(time.monotonic() - following_since, 1),
                "follower_requests": len(follower_requests),
                "log_streams": len([r for r in log_requests if r.path.startswith("/api/v0/logs/stream")]),
                "connections": proxy.connections, "bad_gateway_answers": proxy.bad_gateway_answers,
                "resets": proxy.resets, **extra}


def cut_every_3s(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    cuts = connections_cut = 0
    while run.process.poll() is None:
        time.sleep(3)
        connections_cut += proxy.cut_all()
        cuts += 1
    return {"cuts": cuts, "connections_cut": connections_cut}


def outage_15s(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    run.wait_for_stdout("line 8")
    lines_before = len(run.stdout_lines)
    proxy.outage(15)
    time.sleep(15)
    return {"lines_before_outage": lines_before, "lines_after_outage_started": len(run.stdout_lines)}


def bad_gateway_5s(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    run.wait_for_stdout("line 20")
    # The open log stream is cut too, so its reconnects meet the 502s as well.
    proxy.answer_502(5)
    proxy.cut_all()
    time.sleep(5)
    return {}


def stall_12s(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    run.wait_for_stdout("line 8")
    # Longer than the status call's 10 s timeout, shorter than --give-up-after.
    proxy.stall(12)
    time.sleep(12)
    return {}


def no_faults(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    return {}


def outage_until_exit(proxy: FaultProxy, run: CliRun, cluster) -> dict[str, Any]:
    run.wait_for_stdout("line 4")
    lost_at = time.monotonic()
    proxy.outage(CLI_TIMEOUT_S)
    run.finish()
    gave_up_after_s = time.monotonic() - lost_at
    # Seen from the cluster itself, right away: the job must not have been touched.
    api = direct_api(cluster)
    job_id = run.job_id()
    status_at_exit = api.get_job(job_id)["status"]
    api.stop_job(job_id)
    wait_for_condition(lambda: api.get_job(job_id)["status"] in TERMINAL_STATUSES, timeout_s=60)
    return {"gave_up_after_s": round(gave_up_after_s, 1), "status_at_exit": status_at_exit,
            "status_after_stop": api.get_job(job_id)["status"]}


def submit_many(cluster, home: Path, directory: Path) -> list[dict[str, Any]]:
    """``MANY_JOBS`` short jobs submitted and followed at once, each by its own process; half fail."""
    directory.mkdir(parents=True, exist_ok=True)
    env = cli_env(home, **loopback_env(cluster))
    started = time.monotonic()
    runs = []
    for index in range(MANY_JOBS):
        spec = directory / f"many-{index}.yaml"
        spec.write_text(f"name: many-{index}\nentrypoint: python -c \"import sys; [print('job {index} says', n) "
                        f"for n in range(3)]; sys.exit({index % 2})\"\n")
        runs.append((index, subprocess.Popen([*rayjobs_command(), "submit", str(spec)], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env,
                                             stdin=subprocess.DEVNULL)))
    results = []
    try:
        for index, process in runs:
            try:
                stdout, stderr = process.communicate(timeout=max(1.0, MANY_TIMEOUT_S - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            results.append({"index": index, "expected_code": index % 2, "code": process.returncode,
                            "stdout": stdout, "stderr": stderr, "elapsed_s": time.monotonic() - started})
    finally:
        for _, process in runs:
            if process.poll() is None:
                process.kill()
    return results


SCENARIOS: dict[str, tuple[Callable[..., dict[str, Any] | None], float]] = {
    "cuts": (cut_every_3s, 30),
    "outage": (outage_15s, 30),
    "bad_gateway": (bad_gateway_5s, 30),
    "stall": (stall_12s, 30),
    "clean": (no_faults, 30),
    "give_up": (outage_until_exit, 5),
}


@pytest.fixture(scope="module")
def scenario_runs(ray_cluster, ray_cluster_home, tmp_path_factory, figures_file) -> dict[str, Future]:
    """All proxied scenarios and the many concurrent submits, started together; each test waits for its own.

    The scenarios mostly wait on jobs that sleep, so running them side by side keeps the
    file short, and the twenty submits make the cluster busy while the faults strike.
    """
    directory = tmp_path_factory.mktemp("follow-faults")
    pool = ThreadPoolExecutor(max_workers=len(SCENARIOS) + 1, thread_name_prefix="scenario")
    started = time.monotonic()
    futures = {name: pool.submit(run_through_proxy, ray_cluster, ray_cluster_home, directory / name,
                                 f"faults-{name.replace('_', '-')}", faults, give_up)
               for name, (faults, give_up) in SCENARIOS.items()}
    futures["many"] = pool.submit(submit_many, ray_cluster, ray_cluster_home, directory / "many")
    yield futures
    pool.shutdown(wait=True)
    record_figure("all_background_scenarios_wall_s", round(time.monotonic() - started, 1))


def scenario(scenario_runs: dict[str, Future], name: str) -> dict[str, Any]:
    result = scenario_runs[name].result(timeout=CLI_TIMEOUT_S + 60)
    record_figure(f"{name}_s", result["elapsed_s"])
    return result


def assert_complete_log(result: dict[str, Any]) -> None:
    assert result["code"] == 0, result["stderr"]
    assert numbered_lines(result["stdout"]) == EXPECTED_LINES, result["stderr"]
    assert "Traceback" not in result["stderr"]
    assert "SUCCEEDED" in result["stderr"]


def test_connections_cut_every_3s(scenario_runs, figures_file):
    result = scenario(scenario_runs, "cuts")
    assert_complete_log(result)
    assert result["cuts"] >= 8, result  # the faults really happened during the job, not after it
    assert result["connections_cut"] >= result["cuts"] // 2, result
    assert result["log_streams"] >= 5, result  # the log stream was really reopened again and again
    record_figure("cuts_connections_cut", result["connections_cut"])
    record_figure("cuts_log_stream_reconnects", result["log_streams"] - 1)


def test_outage_shorter_than_give_up(scenario_runs, figures_file):
    result = scenario(scenario_runs, "outage")
    assert_complete_log(result)
    assert "lost contact with the cluster" in result["stderr"]
    assert "the job's state is unknown" in result["stderr"] and "not affected" not in result["stderr"]
    assert "contact with the cluster is back after" in result["stderr"]
    assert result["resets"] >= 3, result  # connections were really turned away during the outage
    assert result["lines_before_outage"] < LINE_COUNT / 2, result  # the outage fell well inside the job


def test_outage_longer_than_give_up_leaves_the_job_running(scenario_runs, figures_file):
    result = scenario(scenario_runs, "give_up")
    assert result["code"] == 4, result["stderr"]
    assert "state unknown" in result["stderr"] and "may still be running" in result["stderr"]
    assert "Traceback" not in result["stderr"]
    # Not before --give-up-after (5 s) has passed; how soon after it is the benchmarks' business.
    assert 5 <= result["gave_up_after_s"] < HANG_GUARD_S, result
    assert result["status_at_exit"] == "RUNNING", result
    assert result["status_after_stop"] == "STOPPED", result
    record_figure("give_up_exit_after_s", result["gave_up_after_s"])


def test_bad_gateway_for_5s(scenario_runs, figures_file):
    result = scenario(scenario_runs, "bad_gateway")
    assert_complete_log(result)
    assert result["bad_gateway_answers"] >= 2, result
    assert "502" in result["stderr"]


def test_stall_for_12s(scenario_runs, figures_file):
    result = scenario(scenario_runs, "stall")
    assert_complete_log(result)
    assert "did not answer within" in result["stderr"]
    assert "contact with the cluster is back after" in result["stderr"]


def test_request_rate_of_a_followed_job(ray_cluster, scenario_runs, figures_file):
    result = scenario(scenario_runs, "clean")
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


def test_twenty_concurrent_submits(scenario_runs, figures_file):
    runs = scenario_runs["many"].result(timeout=MANY_TIMEOUT_S + 60)
    assert len(runs) == MANY_JOBS
    for run in runs:
        assert run["code"] == run["expected_code"], run
        assert [line for line in run["stdout"].splitlines() if re.search(r"says \d", line)] == \
            [f"job {run['index']} says {n}" for n in range(3)], run
        assert "Traceback" not in run["stderr"], run
    record_figure("twenty_concurrent_submits_s", round(max(run["elapsed_s"] for run in runs), 1))


def _cli(home: Path, cluster, *args: str, timeout: float = CLI_TIMEOUT_S, address: str | None = None):
    env = cli_env(home, **loopback_env(cluster))
    extra = ["--address", address] if address else []
    return subprocess.run([*rayjobs_command(), *args, *extra], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)


def _ended_job(cluster, home: Path, directory: Path, name: str, lines: int, exit_code: int) -> str:
    spec = directory / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python -c \"import sys; [print('line', i) for i in range({lines})]; "
                    f"sys.exit({exit_code})\"\n")
    submitted = _cli(home, cluster, "submit", str(spec), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    api = direct_api(cluster)
    wait_for_condition(lambda: api.get_job(job_id)["status"] in TERMINAL_STATUSES, timeout_s=120)
    return job_id


@pytest.fixture(scope="module")
def ended_jobs(ray_cluster, ray_cluster_home, tmp_path_factory) -> dict[int, str]:
    """One job that succeeded and one that failed, each after printing 300 lines: exit code → id."""
    directory = tmp_path_factory.mktemp("ended-jobs")
    return {code: _ended_job(ray_cluster, ray_cluster_home, directory, f"ended-{code}", 300, code) for code in (0, 1)}


def test_logs_follow_on_an_ended_job(ray_cluster, ray_cluster_home, ended_jobs, figures_file):
    started = time.monotonic()
    for code, job_id in ended_jobs.items():
        followed = _cli(ray_cluster_home, ray_cluster, "logs", job_id, "--follow")
        assert followed.returncode == code, followed.stderr
        assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(300)], followed.stderr
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
    assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(300)], followed.stderr


def test_logs_follow_through_502s_on_the_final_log_fetch(ray_cluster, ray_cluster_home, ended_jobs):
    """For an ended job the final log fetch is the whole log; a 502 on it must be retried, not lose the log."""
    job_id = ended_jobs[0]
    followed, faults_left = _follow_through_faults(ray_cluster, ray_cluster_home, job_id,
                                                   ("/api/v0/logs/file", "502"))
    assert followed.returncode == 0, followed.stderr
    assert "could not fetch" not in followed.stderr
    assert numbered_lines(followed.stdout) == [f"line {i}" for i in range(300)], followed.stderr
    assert faults_left == 0  # both 502s really happened
