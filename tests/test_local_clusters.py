"""The local development cluster without starting one: state files, names, ports, failed starts.

The live cluster (auth, loopback binding, isolation) is tested in test_local_clusters_cluster.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.waiting import HANG_GUARD_S
from runner import local
from runner.errors import ExitCode
from runner.local import ClusterError, LocalCluster, cluster_dir, loopback_env, rayjobs_home
from runner.local.ports import free_ports
from runner.local.processes import psutil_module
from tests.support.cli import cli_env, run_rayjobs


def _state_file(name: str) -> Path:
    return cluster_dir(name) / "cluster.json"


def _write_state_of_a_gone_cluster(name: str, pid: int, temp_dir: str) -> None:
    """The state file a cluster started a minute ago would have left, its pid now ``pid`` and nothing listening."""
    stale = LocalCluster(name=name, dashboard_url="http://127.0.0.1:9", gcs_address="127.0.0.1:9", pid=pid,
                         temp_dir=temp_dir, token_file=None, log_file="", started_at=time.time() - 60)
    cluster_dir(name).mkdir(parents=True)
    _state_file(name).write_text(stale.to_json())


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


def test_a_local_cluster_runs_no_preemption_watcher_unless_the_user_asks(monkeypatch, tmp_path):
    from runner.local.environment import RAY_TRAIN_PREEMPTION_WATCHER_ENV, ray_start_env

    monkeypatch.delenv(RAY_TRAIN_PREEMPTION_WATCHER_ENV, raising=False)
    assert ray_start_env("/opt/ray/bin/ray", 6379, None)[RAY_TRAIN_PREEMPTION_WATCHER_ENV] == "0"
    monkeypatch.setenv(RAY_TRAIN_PREEMPTION_WATCHER_ENV, "1")
    assert ray_start_env("/opt/ray/bin/ray", 6379, None)[RAY_TRAIN_PREEMPTION_WATCHER_ENV] == "1"


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


@pytest.mark.parametrize("ray_says", [
    # Ray's own words when its node does not register within the 30 s it allows, on a busy machine.
    "Exception: The current node timed out during startup. This could happen because some of the "
    "raylet failed to startup or the GCS has become overloaded.",
    "OSError: [Errno 98] Address already in use",
])
def test_a_start_that_may_succeed_on_fresh_ports_is_tried_again_then_reported_once(ray_says, tmp_path):
    tries = tmp_path / "tries"
    fake_ray = tmp_path / "fake-ray"
    fake_ray.write_text(f"#!/bin/sh\necho \"$*\" >> {tries}\necho '{ray_says}'\nexit 1\n")
    fake_ray.chmod(0o755)
    lines = []
    with pytest.raises(ClusterError) as failure:
        local.start(name="busy", ray_executable=str(fake_ray), timeout_s=30, progress=lines.append)
    command_lines = tries.read_text().splitlines()
    assert len(command_lines) == 2
    assert command_lines[0] != command_lines[1], "the second try must use fresh ports"
    assert any("trying again on fresh ports" in line for line in lines)
    message = str(failure.value)
    assert ray_says in message and "tried 2 times" in message
    assert not _state_file("busy").exists()


def test_a_start_that_fails_for_good_is_not_tried_again(tmp_path):
    tries = tmp_path / "tries"
    fake_ray = tmp_path / "fake-ray"
    fake_ray.write_text(f"#!/bin/sh\necho try >> {tries}\necho 'ModuleNotFoundError: no module named ray'\nexit 1\n")
    fake_ray.chmod(0o755)
    with pytest.raises(ClusterError, match="no module named ray"):
        local.start(name="broken-for-good", ray_executable=str(fake_ray), timeout_s=30)
    assert tries.read_text().splitlines() == ["try"]


@pytest.mark.processes
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
    _write_state_of_a_gone_cluster("stale", finished.pid, temp_dir)

    assert local.status("stale") is None
    assert not _state_file("stale").exists()
    assert not Path(temp_dir).exists()
    assert local.stop("stale") is False


def test_state_pointing_at_an_unrelated_process_never_kills_it():
    # Simulates pid reuse: the recorded pid now belongs to some other program
    # that leads its own session, like our `ray start` did.
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _write_state_of_a_gone_cluster("reused", bystander.pid, "/tmp/rj-never-created")
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


@pytest.mark.processes
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


def _recording_ray(tmp_path: Path) -> tuple[Path, Path]:
    """A ``ray`` that writes its command line and its GCS store settings to a file, then fails as Ray would."""
    said = tmp_path / "said"
    fake_ray = tmp_path / "fake-ray"
    fake_ray.write_text(f"#!/bin/sh\necho \"$* redis=$RAY_REDIS_ADDRESS namespace=$RAY_external_storage_namespace\" "
                        f">> {said}\necho 'ModuleNotFoundError: pretend'\nexit 3\n")
    fake_ray.chmod(0o755)
    return fake_ray, said


def test_a_head_that_keeps_its_gcs_in_redis_is_started_with_its_store_and_a_namespace_of_its_own(monkeypatch,
                                                                                                  tmp_path):
    fake_ray, said = _recording_ray(tmp_path)
    monkeypatch.setenv("RAY_REDIS_ADDRESS", "10.0.0.9:6379")  # the caller's: never a local cluster's
    with pytest.raises(ClusterError):
        local.start(name="plain", ray_executable=str(fake_ray), timeout_s=30)
    with pytest.raises(ClusterError):
        local.start(name="kept", ray_executable=str(fake_ray), timeout_s=30, gcs_store="redis://127.0.0.1:6380")
    plain, kept = said.read_text().splitlines()
    assert plain.endswith("redis= namespace=")
    assert "redis=127.0.0.1:6380 namespace=rayjobs-kept-" in kept


@pytest.mark.parametrize("store", ["127.0.0.1:6379", "redis://", "redis://host:0", "redis://host:port", "rediss://h:1"])
def test_a_gcs_store_other_than_a_redis_address_is_refused_before_anything_starts(store, tmp_path):
    with pytest.raises(local.InvalidClusterRequest, match="redis://HOST:PORT"):
        local.start(name="bad-store", ray_executable=str(tmp_path / "never-run"), gcs_store=store)


def test_a_cluster_whose_head_kept_its_gcs_in_redis_is_started_again_as_it_was_after_its_head_died(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    temp_dir = tempfile.mkdtemp(prefix="rj-", dir="/tmp")
    ports = free_ports(["gcs", "dashboard", "ray_client_server", "dashboard_agent_http", "dashboard_agent_grpc",
                        "metrics_export", "runtime_env_agent", "node_manager", "object_manager"])
    cluster_dir("kept").mkdir(parents=True)
    token = cluster_dir("kept") / "auth_token"
    token.write_text("the-same-token")
    died = LocalCluster(name="kept", dashboard_url=f"http://127.0.0.1:{ports['dashboard']}",
                        gcs_address=f"127.0.0.1:{ports['gcs']}", pid=finished.pid, temp_dir=temp_dir,
                        token_file=str(token), log_file="", started_at=time.time() - 60, num_cpus=2, ports=ports,
                        gcs_store="redis://127.0.0.1:6380", storage_namespace="rayjobs-kept-0123")
    _state_file("kept").write_text(died.to_json())
    try:
        assert local.status("kept") is None  # not running; its record stays, for the next start
        assert _state_file("kept").exists() and Path(temp_dir).is_dir()
        fake_ray, said = _recording_ray(tmp_path)
        with pytest.raises(ClusterError):
            local.start(name="kept", ray_executable=str(fake_ray), timeout_s=30)
        (command,) = said.read_text().splitlines()
        assert f"--port={ports['gcs']}" in command and f"--dashboard-port={ports['dashboard']}" in command
        assert f"--temp-dir={temp_dir}" in command
        assert command.endswith("redis=127.0.0.1:6380 namespace=rayjobs-kept-0123")
        assert token.read_text() == "the-same-token"
        assert _state_file("kept").exists() and Path(temp_dir).is_dir()  # a failed start leaves it for another try
    finally:
        assert local.stop("kept") is False  # forgotten for good
    assert not _state_file("kept").exists() and not Path(temp_dir).exists()
