"""The local development cluster, live: auth, loopback binding, isolation from a second cluster (its jobs' Ray
Train actors included)."""

from __future__ import annotations

import ipaddress
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.waiting import wait_for_condition
from runner import local
from runner.local import ClusterError, LocalCluster, cluster_processes
from runner.local.nodes import dashboard_json
from runner.local.processes import psutil_module
from tests.support.cli import plain_train_spec

# A driver that joins the cluster and round-trips a value through its object store. No task: a task would start a
# worker process, which is not what the test is about.
TRIVIAL_DRIVER = 'python -c "import ray; ray.init(); print(ray.get(ray.put(42)))"'


def _get(url: str, headers: dict[str, str] | None = None) -> requests.Response:
    # trust_env=False: a proxy configured in the environment must not see these.
    with requests.Session() as session:
        session.trust_env = False
        return session.get(url, headers=headers or {}, timeout=10)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _listening_addresses(cluster: LocalCluster) -> dict[int, set[str]]:
    """Port -> addresses that the cluster's processes listen on."""
    psutil = psutil_module()
    listening: dict[int, set[str]] = {}
    for proc in cluster_processes(cluster):
        try:
            connections = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        for conn in connections:
            if conn.status == psutil.CONN_LISTEN:
                listening.setdefault(conn.laddr.port, set()).add(conn.laddr.ip)
    return listening


def test_token_file_is_private(ray_cluster):
    token_path = Path(ray_cluster.token_file)
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    token = token_path.read_text().strip()
    assert len(token) == 64 and int(token, 16) >= 0
    assert not str(token_path).startswith(str(Path.home() / ".ray"))


def test_dashboard_refuses_requests_without_the_token(ray_cluster):
    jobs_url = f"{ray_cluster.dashboard_url}/api/jobs/"
    assert _get(jobs_url).status_code == 401
    assert _get(jobs_url, {"Authorization": "Bearer " + "0" * 64}).status_code == 403
    answer = _get(jobs_url, ray_cluster.auth_headers())
    assert answer.status_code == 200
    assert isinstance(answer.json(), list)
    assert _get(f"{ray_cluster.dashboard_url}/api/version", ray_cluster.auth_headers()).status_code == 200


def test_running_cluster_is_found_by_name(ray_cluster):
    found = local.status(ray_cluster.name)
    assert found == ray_cluster
    with pytest.raises(ClusterError, match=f"already running at {ray_cluster.dashboard_url}"):
        local.start(name=ray_cluster.name)


def test_job_client_with_auth_headers_runs_a_driver(ray_cluster):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.dashboard_url, headers=ray_cluster.auth_headers())
    submission_id = client.submit_job(entrypoint=TRIVIAL_DRIVER)
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    status = wait_for_condition(
        lambda: (s := client.get_job_status(submission_id)) in terminal and s, timeout_s=120
    )
    logs = client.get_job_logs(submission_id)
    assert status == JobStatus.SUCCEEDED, logs
    assert "42" in logs.split()


def test_loopback_env_alone_authenticates_a_job_client(ray_cluster, ray_cluster_env):
    # A fresh process, because Ray reads its auth settings when it is imported.
    probe = (
        "import sys\n"
        "from ray.job_submission import JobSubmissionClient\n"
        "print(type(JobSubmissionClient(sys.argv[1]).list_jobs()).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, ray_cluster.dashboard_url],
        env=ray_cluster_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "list"


def test_cluster_listens_on_loopback_only(ray_cluster):
    listening = _listening_addresses(ray_cluster)
    gcs_port = int(ray_cluster.gcs_address.rsplit(":", 1)[1])
    dashboard_port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    assert gcs_port in listening and dashboard_port in listening, listening
    exposed = {port: addrs for port, addrs in listening.items() if not all(_is_loopback(a) for a in addrs)}
    assert exposed == {}


def _actors(cluster: LocalCluster) -> list[dict]:
    document = dashboard_json(cluster, "/api/v0/actors?limit=1000", timeout_s=10)
    return document["data"]["result"]["result"]


def test_a_second_cluster_keeps_out_of_the_firsts_training_and_stops_without_touching_it(ray_cluster, rayjobs_cli,
                                                                                        tmp_path):
    """A second cluster on the host: its own ports, a job on the first stays there, and stopping it leaves the first.

    Ray Train's actors ask Ray's state API with no address, and Ray then scans the host for a GCS: with a
    second cluster started later it warns ``Found multiple active Ray instances … Connecting to latest
    cluster`` and talks to that one, or (no cluster marked latest) fails with ``Found multiple active Ray
    instances``. Two pins keep a job on its own cluster: the job's keeper puts the driver's RAY_ADDRESS into the
    job config every actor gets (rayjobs_agent/pinning.py, for any cluster; its unit checks are
    tests/test_cluster_pinning.py), and a local cluster's processes inherit their own GCS address
    (runner/local/environment.py). Either is enough here; with neither (an empty RAY_ADDRESS for the job's
    actors) the PlacementGroupCleaner fails with that line in the job's log.
    """
    second = local.start(name="second", num_cpus=1, auth=False)
    try:
        assert second.token_file is None
        assert not set(second.ports.values()) & set(ray_cluster.ports.values())
        assert _get(f"{second.dashboard_url}/api/jobs/").status_code == 200
        with pytest.raises(ClusterError, match=f"already running at {second.dashboard_url}"):
            local.start(name="second", auth=False)
        assert cluster_processes(second)
        _a_training_job_on_the_first_stays_there(ray_cluster, second, rayjobs_cli, tmp_path)
    finally:
        assert local.stop("second") is True

    assert cluster_processes(second, leader_alive=False) == []
    assert local.status("second") is None
    assert not Path(second.temp_dir).exists()
    assert local.stop("second") is False

    assert local.status(ray_cluster.name) == ray_cluster
    assert _get(f"{ray_cluster.dashboard_url}/api/jobs/", ray_cluster.auth_headers()).status_code == 200
    assert cluster_processes(ray_cluster)


def _a_training_job_on_the_first_stays_there(first: LocalCluster, second: LocalCluster, rayjobs_cli,
                                            tmp_path: Path) -> None:
    # One training worker is enough: the controller and the worker are both actors the scan could mislead.
    spec = plain_train_spec(tmp_path, "pinned", "--epochs 2 --epoch-s 0 --max-failures 0 --workers 1",
                            policy=f"record_path: {tmp_path / 'records'}\n")
    # --raw: the log exactly as written, so that no line of Ray's is held back from the check below.
    result = rayjobs_cli("submit", str(spec), "--raw", timeout=300)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-4000:]
    assert "final loss" in result.stdout
    assert "Found multiple active Ray instances" not in shown and "Connecting to latest cluster" not in shown

    job_id = next(line.split(" as ", 1)[1].split()[0] for line in result.stderr.splitlines()
                  if line.startswith("rayjobs: submitted pinned as "))
    ray_job = dashboard_json(first, f"/api/jobs/{job_id}", timeout_s=10)["job_id"]
    ours = {actor["class_name"] for actor in _actors(first) if actor.get("job_id") == ray_job}
    assert {"RayTrainWorker", "TrainController"} <= ours, ours
    assert _actors(second) == []
