"""A cluster queue under a nemesis, checked against its history; and a head that keeps its GCS in Redis, restarted.

The first test is the queue's promises on a head that dies: a local cluster started with ``rayjobs cluster up
--gcs-store redis://…`` runs a job of a queue limited to one while another waits; every process of the cluster (its
jobs' too) is SIGKILLed, and ``rayjobs cluster up`` brings the head back on its ports. The queue's limit and waiting
job are still there, the job that was running is lost and goes back into its queue at its first place as
``<id>-attempt2``, both then run once, in that order, and a client that knew the head before it died reads the queue
from the new one.

The second is the history of tests/support/queue_history.py: three clients submit (the ``rayjobs`` command and the
Python API, fixed and generated ids, three priorities, ``--no-wait`` and followed), stop and set limits for a minute
while a nemesis kills the keeper (once the moment it claims a slot), a job's wrapper and a submitting client, cuts
the clients' connections, and kills and restarts the head; then the checker tests the whole history against the
queue's invariants. ``QUEUE_HISTORY_SEED`` replays another seed; benchmarks/queue_history.py runs it for longer.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from runner.client.queue import ClusterQueue
from runner.local import cluster_processes
from runner.local.state import LocalCluster
from tests.support.cli import direct_api, run_rayjobs
from tests.support.queue_nemesis import Plan, job_processes, run_history
from tests.support.ray_instances import kill_processes
from tests.support.redis_server import redis_server, redis_server_executable
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(redis_server_executable() is None, reason="redis-server is not installed")]

SEED = int(os.environ.get("QUEUE_HISTORY_SEED") or 20261129)

HOLDER = ("python -c \"import os, pathlib, time; print('restart-job started', flush=True); "
          "[time.sleep(0.1) for _ in iter(lambda: pathlib.Path(os.environ['RELEASE_FLAG']).exists(), True)]; "
          "print('restart-job ended', flush=True)\"")


def _spec(directory: Path, name: str, flag: Path) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\nentrypoint: {json.dumps(HOLDER)}\nqueue: restart-q\nneeds: {{CPU: 0}}\n"
                    f"record: false\nmax_retries: 1\nretry_backoff: {{initial_s: 0, max_s: 0}}\n"
                    f"runtime_env:\n  env_vars:\n    RELEASE_FLAG: '{flag}'\n")
    return path


def _status(api, job_id: str) -> str | None:
    from runner.errors import JobNotFound

    try:
        return api.get_job(job_id)["status"]
    except JobNotFound:
        return None


def test_a_head_that_keeps_its_gcs_in_redis_comes_back_with_its_queue_and_retries_the_job_it_lost(tmp_path):
    home, name = tmp_path / "home", "restart"
    flag = tmp_path / "release"
    with redis_server(tmp_path / "redis") as store:
        up = run_rayjobs("cluster", "up", "--name", name, "--num-cpus", "1", "--gcs-store", store, home=home,
                         timeout=400)
        assert up.returncode == 0, up.stderr
        assert f"its GCS is kept in {store}" in up.stderr, up.stderr
        try:
            cluster = LocalCluster.from_json((home / "clusters" / name / "cluster.json").read_text())
            api = direct_api(cluster)
            at = ["--cluster", name]
            assert run_rayjobs("queue", "set", "restart-q", "--max-running", "1", *at, home=home).returncode == 0
            submitted = [run_rayjobs("submit", str(_spec(tmp_path, job, flag)), "--no-wait", *at, home=home)
                         for job in ("first", "second")]
            assert all(result.returncode == 0 for result in submitted), [result.stderr for result in submitted]
            first, second = (result.stdout.strip().splitlines()[-1] for result in submitted)
            queue = ClusterQueue(api)  # a client that knows the head as it is now, as a follower does
            wait_for_condition(lambda: "restart-job started" in api.job_log(first).splitlines()
                               and queue.place_of(second),
                               timeout_s=HANG_GUARD_S, interval_s=1)

            # Every process of the cluster and of its jobs, as a machine that loses power.
            doomed = list({process.pid: process for process in
                           cluster_processes(cluster) + job_processes(cluster)}.values())
            kill_processes(doomed)
            psutil.wait_procs(doomed, timeout=30)
            down = run_rayjobs("cluster", "status", "--name", name, home=home)
            assert down.returncode == 4, down.stdout
            again = run_rayjobs("cluster", "up", "--name", name, home=home, timeout=400)
            assert again.returncode == 0, again.stderr
            assert "starting its head again on its ports, with its jobs and queue" in again.stderr, again.stderr
            assert LocalCluster.from_json((home / "clusters" / name / "cluster.json").read_text()).dashboard_url \
                == cluster.dashboard_url

            # The job that ran on the dead head is lost, and goes back to the queue's first place as attempt 2.
            wait_for_condition(lambda: _status(api, first) == "FAILED", timeout_s=HANG_GUARD_S, interval_s=1)
            retried = f"{first}-attempt2"
            wait_for_condition(lambda: _status(api, retried) == "RUNNING"
                               and "restart-job started" in api.job_log(retried).splitlines(), timeout_s=HANG_GUARD_S,
                               interval_s=1)
            place = queue.place_of(second)
            assert place is not None and place["position"] == 1 and place["max_running"] == 1, place
            assert _status(api, second) is None  # still an entry of the queue, no Ray job

            flag.touch()
            wait_for_condition(lambda: _status(api, second) == "SUCCEEDED", timeout_s=HANG_GUARD_S, interval_s=1)
            assert _status(api, retried) == "SUCCEEDED"
            assert api.job_log(second).splitlines().count("restart-job started") == 1
            assert api.get_job(retried)["start_time"] < api.get_job(second)["start_time"]
            shown = run_rayjobs("queue", "restart-q", *at, home=home)
            assert "0 of 1 running, 0 waiting" in shown.stdout, shown.stdout
        finally:
            run_rayjobs("cluster", "down", "--name", name, home=home, timeout=120)


def test_the_queue_keeps_its_promises_through_kills_cuts_and_a_head_restart(tmp_path, capsys):
    started = time.monotonic()
    run = run_history(Plan(seed=SEED, client_s=60.0, keeper_kills=1, keeper_kills_at_claim=1, wrapper_kills=1,
                           proxy_cuts=2, client_kills=1), tmp_path)
    report = run.report
    with capsys.disabled():
        print(f"\n{report.text()}\n(wall {time.monotonic() - started:.0f}s; replay: QUEUE_HISTORY_SEED={SEED})")
    assert not report.violations, report.text()
    figures = report.figures
    assert figures["faults"].get("head-restart") == 1, figures
    accepted = [op for op in run.history.ops if op.kind == "submit" and op.outcome == "ok"]
    assert len(accepted) >= 10, run.history.text()  # the clients got work through, faults and all
    assert figures["jobs_by_status"].get("SUCCEEDED"), figures
