"""The local development cluster: auth, loopback binding, isolation, state files."""

from __future__ import annotations

import ipaddress
import json
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from runner import local
from runner.errors import ExitCode
from runner.local import ClusterError, LocalCluster, cluster_dir, cluster_processes, loopback_env, rayjobs_home
from runner.local.ports import free_ports
from runner.local.processes import psutil_module
from tests.support.cli import cli_env, run_rayjobs

TRIVIAL_DRIVER = 'python -c "import ray; ray.init(); print(ray.get(ray.remote(lambda: 42).remote()))"'


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


def _state_file(name: str) -> Path:
    return cluster_dir(name) / "cluster.json"


# ----------------------------------------------------------------- no cluster needed


def test_rayjobs_home_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYJOBS_HOME", str(tmp_path / "elsewhere"))
    assert rayjobs_home() == tmp_path / "elsewhere"
    monkeypatch.delenv("RAYJOBS_HOME")
    assert rayjobs_home() == Path.home() / ".rayjobs"


def test_state_round_trips_through_json():
    cluster = LocalCluster(
        name="x",
        dashboard_url="http://127.0.0.1:1234",
        gcs_address="127.0.0.1:5678",
        pid=42,
        temp_dir="/tmp/rj-abc",
        token_file=None,
        log_file="/tmp/log",
        started_at=1.5,
        ports={"gcs": 5678},
    )
    data = json.loads(cluster.to_json())
    data["written_by_a_newer_version"] = True
    assert LocalCluster.from_json(json.dumps(data)) == cluster


def test_state_with_worker_nodes_round_trips_through_json():
    cluster = LocalCluster(
        name="x", dashboard_url="http://127.0.0.1:1234", gcs_address="127.0.0.1:5678", pid=42,
        temp_dir="/tmp/rj-abc", token_file=None, log_file="/tmp/log", started_at=1.5, num_cpus=1,
        worker_nodes=[local.WorkerNode(name="worker-1", pid=43, log_file="/tmp/w1", ports={"node_manager": 2000},
                                       leader_create_time=2.0)],
        object_store_memory=256 * 2**20,
    )
    assert cluster.node_count == 2
    data = json.loads(cluster.to_json())
    data["worker_nodes"][0]["written_by_a_newer_version"] = True
    assert LocalCluster.from_json(json.dumps(data)) == cluster


def test_state_without_worker_nodes_is_a_single_node_cluster():
    data = dict(name="x", dashboard_url="", gcs_address="", pid=1, temp_dir="", token_file=None, log_file="",
                started_at=0.0)
    cluster = LocalCluster.from_json(json.dumps(data))
    assert cluster.worker_nodes == [] and cluster.node_count == 1 and cluster.object_store_memory is None
    with pytest.raises(ValueError):
        LocalCluster.from_json(json.dumps({**data, "worker_nodes": "worker-1"}))


def test_bad_node_counts_are_refused_before_anything_starts():
    for nodes in (0, -1, local.MAX_NODES + 1, True, 1.5):
        with pytest.raises(local.InvalidClusterRequest, match="nodes must be"):
            local.start(name="never", nodes=nodes)
    assert not cluster_dir("never").exists()


def test_auth_headers_carry_the_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    base = dict(name="x", dashboard_url="", gcs_address="", pid=1, temp_dir="", log_file="", started_at=0.0)
    assert LocalCluster(token_file=str(token_file), **base).auth_headers() == {"Authorization": "Bearer s3cret"}
    assert LocalCluster(token_file=None, **base).auth_headers() == {}
    with pytest.raises(ClusterError, match="Cannot read the auth token"):
        LocalCluster(token_file=str(tmp_path / "missing"), **base).auth_headers()


def test_loopback_env_names_the_auth_settings(tmp_path):
    base = dict(name="x", dashboard_url="", gcs_address="", pid=1, temp_dir="", log_file="", started_at=0.0)
    plain = loopback_env()
    assert plain["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert "127.0.0.1" in plain["NO_PROXY"].split(",")
    assert "RAY_AUTH_MODE" not in plain
    with_token = loopback_env(LocalCluster(token_file=str(tmp_path / "t"), **base))
    assert with_token["RAY_AUTH_MODE"] == "token"
    assert with_token["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "t")
    assert loopback_env(LocalCluster(token_file=None, **base))["RAY_AUTH_MODE"] == "disabled"


def test_picked_ports_are_distinct_free_and_outside_the_ephemeral_range():
    ports = free_ports([f"p{i}" for i in range(9)])
    assert len(set(ports.values())) == 9
    ephemeral_floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in ports.values():
        assert 20000 <= port < ephemeral_floor
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


@pytest.mark.parametrize("name", ["", "../escape", "a/b", "-dash", "x" * 64])
def test_bad_cluster_names_are_refused(name):
    with pytest.raises(ClusterError, match="Invalid cluster name"):
        local.start(name=name)


def test_failed_start_reports_the_log_and_leaves_nothing(tmp_path):
    fake_ray = tmp_path / "fake-ray"
    fake_ray.write_text("#!/bin/sh\necho 'cannot start: pretend failure'\nexit 3\n")
    fake_ray.chmod(0o755)
    with pytest.raises(ClusterError) as failure:
        local.start(name="broken", ray_executable=str(fake_ray), timeout_s=30)
    message = str(failure.value)
    assert "exited with code 3" in message
    assert "pretend failure" in message
    assert "\n" not in message
    assert not _state_file("broken").exists()
    assert local.status("broken") is None


@pytest.mark.timeout(HANG_GUARD_S)  # it must not wait for the fake ray's 300 s sleep
def test_start_timeout_kills_what_was_started(tmp_path):
    fake_ray = tmp_path / "hanging-ray"
    fake_ray.write_text("#!/bin/sh\necho still booting\nsleep 300\n")
    fake_ray.chmod(0o755)
    before = {p.pid for p in psutil_module().process_iter()}
    with pytest.raises(ClusterError, match="did not get its dashboard ready within 1 s.*still booting"):
        local.start(name="hangs", ray_executable=str(fake_ray), timeout_s=1)

    def survivors() -> list[str]:
        return [
            " ".join(p.info["cmdline"] or [])
            for p in psutil_module().process_iter(["pid", "cmdline"])
            if p.info["pid"] not in before
            and (str(fake_ray) in " ".join(p.info["cmdline"] or []) or p.info["cmdline"] == ["sleep", "300"])
        ]

    assert survivors() == []
    assert not _state_file("hangs").exists()


def test_stale_state_of_a_dead_process_is_dropped():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    temp_dir = tempfile.mkdtemp(prefix="rj-", dir="/tmp")
    stale = LocalCluster(
        name="stale",
        dashboard_url="http://127.0.0.1:9",
        gcs_address="127.0.0.1:9",
        pid=finished.pid,
        temp_dir=temp_dir,
        token_file=None,
        log_file="",
        started_at=time.time() - 60,
    )
    cluster_dir("stale").mkdir(parents=True)
    _state_file("stale").write_text(stale.to_json())

    assert local.status("stale") is None
    assert not _state_file("stale").exists()
    assert not Path(temp_dir).exists()
    assert local.stop("stale") is False


def test_state_pointing_at_an_unrelated_process_never_kills_it():
    # Simulates pid reuse: the recorded pid now belongs to some other program
    # that leads its own session, like our `ray start` did.
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        stale = LocalCluster(
            name="reused",
            dashboard_url="http://127.0.0.1:9",
            gcs_address="127.0.0.1:9",
            pid=bystander.pid,
            temp_dir="/tmp/rj-never-created",
            token_file=None,
            log_file="",
            started_at=time.time() - 60,
        )
        cluster_dir("reused").mkdir(parents=True)
        _state_file("reused").write_text(stale.to_json())
        assert local.status("reused") is None
        assert not _state_file("reused").exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_unreadable_state_file_is_dropped():
    cluster_dir("garbled").mkdir(parents=True)
    _state_file("garbled").write_text("{not json")
    assert local.status("garbled") is None
    assert not _state_file("garbled").exists()


@pytest.mark.parametrize("command", ["status", "up", "down"])
def test_cluster_commands_refuse_a_bad_name_as_bad_input(command, tmp_path):
    result = run_rayjobs("cluster", command, "--name", "bad name!", home=tmp_path, timeout=60)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert "Invalid cluster name 'bad name!'" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("ray", ["exits", "missing"])
def test_a_failed_start_has_one_exit_code_through_cluster_up_and_submit_local(ray, tmp_path):
    fake_ray = tmp_path / "fake-ray"
    if ray == "exits":
        fake_ray.write_text("#!/bin/sh\necho 'cannot start: pretend failure'\nexit 3\n")
        fake_ray.chmod(0o755)
        expected = "exited with code 3"
    else:
        expected = f"The Ray executable '{fake_ray}' was not found"
    env = cli_env(tmp_path / "home", RAYJOBS_RAY_EXECUTABLE=str(fake_ray))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: job\nentrypoint: echo hi\n")
    up = run_rayjobs("cluster", "up", env=env, timeout=120)
    submitted = run_rayjobs("submit", str(spec), "--local", env=env, timeout=120)
    for result in (up, submitted):
        assert result.returncode == ExitCode.CLUSTER_UNREACHABLE, result.stderr
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "clusters" / "default" / "cluster.json").exists()


# ----------------------------------------------------------------- live cluster


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


def test_second_cluster_starts_and_stops_without_touching_the_first(ray_cluster):
    second = local.start(name="second", num_cpus=1, auth=False)
    try:
        assert second.token_file is None
        assert not set(second.ports.values()) & set(ray_cluster.ports.values())
        assert _get(f"{second.dashboard_url}/api/jobs/").status_code == 200
        with pytest.raises(ClusterError, match=f"already running at {second.dashboard_url}"):
            local.start(name="second", auth=False)
        assert cluster_processes(second)
    finally:
        assert local.stop("second") is True

    assert cluster_processes(second, leader_alive=False) == []
    assert local.status("second") is None
    assert not Path(second.temp_dir).exists()
    assert local.stop("second") is False

    assert local.status(ray_cluster.name) == ray_cluster
    assert _get(f"{ray_cluster.dashboard_url}/api/jobs/", ray_cluster.auth_headers()).status_code == 200
    assert cluster_processes(ray_cluster)
