"""The follower's fault scenarios: each runs the real ``rayjobs submit`` through a ``FaultProxy`` that
cuts, refuses or stalls connections or answers 502 while a job prints numbered lines, plus ten
submits at once. They mostly wait on jobs that sleep, so the session starts them in the background
as soon as its cluster tier begins (``follow_fault_scenarios`` in tests/conftest.py), and
tests/test_follow_faults_cluster.py, which runs last in that tier, checks what each one saw. Meanwhile the
other cluster tests keep the cluster busy, which is when faults should strike.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from jobs.infra.status import TERMINAL_STATUSES
from runner.local import loopback_env
from tests.support.cli import REPO_ROOT, CliRun, cli_env, dashboard_port, direct_api, proxied_env, rayjobs_command
from tests.support.fault_proxy import FaultProxy
from tests.support.waiting import wait_for_condition

LINE_COUNT = 120
LINE_GAP_S = 0.25
EXPECTED_LINES = [f"line {i}" for i in range(LINE_COUNT)]
COUNTING_JOB = (f"entrypoint: python -c \"import time; [(print('line', i, flush=True), time.sleep({LINE_GAP_S})) "
                f"for i in range({LINE_COUNT})]\"\n")
MAX_REQUESTS_PER_S = 2.0
CLI_TIMEOUT_S = 180
MANY_JOBS = 6
ENDED_JOB_LINES = 300
MANY_TIMEOUT_S = 300

_figures: dict[str, Any] = {}
_figures_lock = threading.Lock()


def record_figure(name: str, value: Any) -> None:
    with _figures_lock:
        _figures[name] = value


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
    """``MANY_JOBS`` short jobs submitted and followed at once, each by its own process; half fail.

    The first two (one succeeds, one fails) also print ``ENDED_JOB_LINES`` numbered lines: once ended, they are
    the jobs whose whole log tests/test_follow_faults_cluster.py follows again (each job costs the cluster a
    worker process and a driver, so these serve both)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = cli_env(home, **loopback_env(cluster))
    started = time.monotonic()
    runs = []
    for index in range(MANY_JOBS):
        spec = directory / f"many-{index}.yaml"
        numbered = f"[print('line', i) for i in range({ENDED_JOB_LINES})]; " if index < 2 else ""
        spec.write_text(f"name: many-{index}\nentrypoint: python -c \"import sys; [print('job {index} says', n) "
                        f"for n in range(3)]; {numbered}sys.exit({index % 2})\"\n")
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


def start_scenarios(cluster, home: Path, directory: Path) -> tuple[ThreadPoolExecutor, dict[str, Future]]:
    """Start every scenario and the many concurrent submits in the background; (the pool, a future per name)."""
    pool = ThreadPoolExecutor(max_workers=len(SCENARIOS) + 1, thread_name_prefix="scenario")
    futures = {name: pool.submit(run_through_proxy, cluster, home, directory / name,
                                 f"faults-{name.replace('_', '-')}", faults, give_up)
               for name, (faults, give_up) in SCENARIOS.items()}
    futures["many"] = pool.submit(submit_many, cluster, home, directory / "many")
    return pool, futures
