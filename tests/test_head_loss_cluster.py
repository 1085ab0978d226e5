"""A head that dies while ``rayjobs`` follows a job on it, and a head at that address that no longer knows the job.

A private single-node cluster runs a job; ``rayjobs submit`` follows it through a
``FaultProxy``. Every process of that cluster is then killed (SIGKILL, as in a crash):
rayjobs must say that the cluster stopped answering and the job's state is unknown, not
that the job is unaffected. Then the proxy is pointed at another live head, the session
cluster: to the follower that is the same address answering again, as a restarted head
without GCS persistence does, with a job table that lacks the job. rayjobs must name the
job as gone from that cluster with the last state it saw, and exit 4.
"""

from __future__ import annotations

import urllib.parse


from runner.local import cluster_processes, loopback_env
from runner.local import start as start_local_cluster
from runner.local import stop as stop_local_cluster
from tests.support.cli import cli_env
from tests.support.ray_instances import kill_processes
from tests.support.waiting import wait_for_condition
from tests.support.fault_proxy import FaultProxy
from tests.support.cli import CliRun


SLEEPING_JOB = "entrypoint: python -c \"import time; print('job started', flush=True); time.sleep(300)\"\n"


def test_killed_head_then_a_head_that_does_not_know_the_job(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYJOBS_HOME", str(tmp_path / "private-home"))
    doomed = start_local_cluster(name="doomed-head", num_cpus=1, auth=False)
    try:
        spec = tmp_path / "sleeper.yaml"
        # No run record: what is checked is what the follower says, and the record keeper is one process more.
        spec.write_text(f"name: sleeper\nrecord: false\n{SLEEPING_JOB}")
        # The session cluster's token rides along; the private cluster has no auth and ignores it.
        env = cli_env(tmp_path / "private-home", **loopback_env(doomed), RAY_AUTH_TOKEN=ray_cluster.auth_token())
        with FaultProxy(urllib.parse.urlsplit(doomed.dashboard_url).port) as proxy:
            run = CliRun(["submit", str(spec), "--address", proxy.address, "--give-up-after", "60"], env)
            try:
                run.wait_for_stdout("job started")
                kill_processes(cluster_processes(doomed))
                wait_for_condition(lambda: "lost contact with the cluster" in run.stderr, timeout_s=30)
                proxy.upstream_port = urllib.parse.urlsplit(ray_cluster.dashboard_url).port
                code = run.finish(timeout_s=90)
            finally:
                if run.process.poll() is None:
                    run.process.kill()
    finally:
        stop_local_cluster("doomed-head", timeout_s=10)
    stderr = run.stderr
    assert "the job's state is unknown" in stderr and "not affected" not in stderr, stderr
    assert code == 4, stderr
    assert f"no longer knows job {run.job_id()}" in stderr, stderr
    assert "the last state seen was RUNNING" in stderr and "restarted without GCS persistence" in stderr, stderr
    assert "Traceback" not in stderr
