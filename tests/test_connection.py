"""Which cluster rayjobs talks to, and with which headers."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from jobs.infra.address import normalize_address
from runner import local
from runner.local import LocalCluster, cluster_dir
from runner.client.connection import parse_header, resolve_connection
from runner.errors import BadInput, NoCluster
from tests.support.waiting import HANG_GUARD_S, wait_for_condition


@pytest.fixture(autouse=True)
def no_ray_env(monkeypatch, tmp_path):
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                 "RAY_AUTH_MODE", "RAYJOBS_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAYJOBS_HOME", str(tmp_path / "home"))


def test_cli_flag_beats_everything(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://env:8265")
    connection = resolve_connection("http://flag:8265", "http://spec:8265")
    assert (connection.address, connection.source) == ("http://flag:8265", "--address")


def test_spec_beats_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://env:8265")
    assert resolve_connection(None, "http://spec:8265").address == "http://spec:8265"


def test_api_server_address_beats_ray_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://ray-address:8265")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://api-server:8265")
    assert resolve_connection().address == "http://api-server:8265"


def test_no_address_and_no_local_cluster():
    with pytest.raises(NoCluster, match="rayjobs cluster up"):
        resolve_connection()


def test_host_port_means_http():
    assert normalize_address("head:8265/") == "http://head:8265"


def test_ray_client_scheme_refused():
    with pytest.raises(ValueError, match="Ray Client port"):
        normalize_address("ray://head:10001")
    with pytest.raises(BadInput, match="Ray Client port"):
        resolve_connection("ray://head:10001")


def test_headers_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("RAY_JOB_HEADERS", json.dumps({"X-Team": "a", "X-Keep": "k"}))
    connection = resolve_connection("http://h:1", cli_headers=["X-Team: b"])
    assert connection.headers == {"X-Team": "b", "X-Keep": "k"}
    assert "b" not in repr(connection)


def test_bad_header_env(monkeypatch):
    monkeypatch.setenv("RAY_JOB_HEADERS", "not json")
    with pytest.raises(BadInput, match="RAY_JOB_HEADERS"):
        resolve_connection("http://h:1")


def test_bad_header_flag():
    with pytest.raises(BadInput, match="Name: value"):
        parse_header("no colon here")


def test_token_from_environment(monkeypatch, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("secret-token\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    assert resolve_connection("http://h:1").headers["Authorization"] == "Bearer secret-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "direct")
    assert resolve_connection("http://h:1").headers["Authorization"] == "Bearer direct"


def test_explicit_authorization_header_wins(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    connection = resolve_connection("http://h:1", cli_headers=["Authorization: Bearer from-flag"])
    assert connection.headers["Authorization"] == "Bearer from-flag"


# --- local clusters by name and by address ---------------------------------------------------------
# A stand-in leader: a live process whose command line names the cluster's temp dir is what a
# running `ray start` looks like to rayjobs. Nothing listens on the ports; resolving never connects.


def _stand_in(*argv: str) -> subprocess.Popen:
    """A sleeping process whose command line ends with ``argv``, returned once /proc shows it.

    Popen returns when the child's close-on-exec pipe closes, which the kernel does before it
    maps the new program's arguments: for a moment, more on a loaded machine, the child's
    command line reads empty, and a check that looks for the temp dir in it would miss it.
    """
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])
    wanted = [sys.executable, "-c", "import time; time.sleep(120)", *argv]
    wait_for_condition(lambda: psutil.Process(process.pid).cmdline() == wanted, timeout_s=HANG_GUARD_S,
                       interval_s=0.005)
    return process


@pytest.fixture
def local_cluster_state(tmp_path):
    """Write the state of a "running" local cluster under RAYJOBS_HOME: ``make(name, port)``."""
    leaders: list[subprocess.Popen] = []

    def make(name: str, port: int, token: str | None = "cluster-token", alive: bool = True) -> LocalCluster:
        temp_dir = str(tmp_path / f"rj-{name}")
        leader = _stand_in(temp_dir)
        leaders.append(leader)
        if not alive:
            leader.kill()
            leader.wait()
        directory = cluster_dir(name)
        directory.mkdir(parents=True)
        token_file = None
        if token is not None:
            token_file = directory / "auth_token"
            token_file.write_text(token)
        state = LocalCluster(name=name, dashboard_url=f"http://127.0.0.1:{port}", gcs_address=f"127.0.0.1:{port + 1}",
                             pid=leader.pid, temp_dir=temp_dir, token_file=str(token_file) if token_file else None,
                             log_file=str(directory / "ray-start.log"), started_at=time.time())
        (directory / "cluster.json").write_text(state.to_json())
        return state

    yield make
    for leader in leaders:
        leader.kill()
        leader.wait()


@pytest.mark.parametrize("spelling", ["http://127.0.0.1:{port}", "127.0.0.1:{port}/", "localhost:{port}",
                                      "https://LocalHost:{port}/", "  http://localhost:{port}// "])
def test_any_spelling_of_a_local_clusters_address_gets_its_token(local_cluster_state, spelling):
    local_cluster_state("dev", 23456, token="dev-token")
    local_cluster_state("other", 23460, token="other-token")
    connection = resolve_connection(spelling.format(port=23456))
    assert connection.headers["Authorization"] == "Bearer dev-token"
    assert connection.local_cluster == "dev"


def test_address_from_the_environment_is_matched_too(local_cluster_state, monkeypatch):
    local_cluster_state("dev", 23456, token="dev-token")
    monkeypatch.setenv("RAY_ADDRESS", "localhost:23456")
    assert resolve_connection().headers["Authorization"] == "Bearer dev-token"
    assert resolve_connection(None, "127.0.0.1:23456").headers["Authorization"] == "Bearer dev-token"


def test_other_addresses_get_no_local_token(local_cluster_state):
    local_cluster_state("dev", 23456)
    for address in ("http://127.0.0.1:23457", "http://10.0.0.5:23456", "http://127.0.0.1"):
        connection = resolve_connection(address)
        assert "Authorization" not in connection.headers, address
        assert connection.local_cluster is None


def test_a_token_the_user_gave_beats_the_local_one(local_cluster_state, monkeypatch):
    local_cluster_state("dev", 23456, token="dev-token")
    assert resolve_connection("localhost:23456", cli_headers=["Authorization: Bearer mine"]).headers[
        "Authorization"] == "Bearer mine"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert resolve_connection("localhost:23456").headers["Authorization"] == "Bearer from-env"
    assert resolve_connection(cluster_name="dev").headers["Authorization"] == "Bearer from-env"


def test_matching_only_reads_state(local_cluster_state):
    local_cluster_state("gone", 23456, alive=False)
    garbled = cluster_dir("garbled")
    garbled.mkdir(parents=True)
    (garbled / "cluster.json").write_text("{not json")
    # A live process that is not this cluster's leader (its pid was reused): never touched.
    stranger = _stand_in()
    try:
        reused = local_cluster_state("reused", 23470)
        reused.pid = stranger.pid
        (cluster_dir("reused") / "cluster.json").write_text(reused.to_json())
        for address in ("localhost:23456", "localhost:23470"):
            assert "Authorization" not in resolve_connection(address).headers
        with pytest.raises(NoCluster):
            resolve_connection(cluster_name="gone")
        assert (cluster_dir("gone") / "cluster.json").is_file()
        assert (garbled / "cluster.json").read_text() == "{not json"
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_dead_clusters_leftovers_are_left_to_the_cluster_commands(local_cluster_state):
    gone = local_cluster_state("gone", 23456, alive=False)
    # A process the dead cluster left behind: it names the cluster's temp dir.
    leftover = _stand_in(gone.temp_dir)
    try:
        with pytest.raises(NoCluster):
            resolve_connection(cluster_name="gone")
        with pytest.raises(NoCluster):
            resolve_connection()
        assert resolve_connection("localhost:23456").local_cluster is None
        assert resolve_connection("http://remote.example:8265").local_cluster is None
        assert leftover.poll() is None
        assert (cluster_dir("gone") / "cluster.json").is_file()
        # `rayjobs cluster status` is where a stale cluster gets cleaned up.
        assert local.status("gone") is None
        assert leftover.wait(timeout=30) is not None
        assert not (cluster_dir("gone") / "cluster.json").exists()
    finally:
        leftover.kill()
        leftover.wait()


def test_cluster_by_name(local_cluster_state):
    local_cluster_state("dev", 23456, token="dev-token")
    connection = resolve_connection(cluster_name="dev")
    assert (connection.address, connection.source, connection.local_cluster) == (
        "http://127.0.0.1:23456", "--cluster", "dev")
    assert connection.headers["Authorization"] == "Bearer dev-token"


def test_cluster_precedence(local_cluster_state, monkeypatch):
    local_cluster_state("dev", 23456)
    local_cluster_state("default", 23460)
    monkeypatch.setenv("RAY_ADDRESS", "http://elsewhere:8265")
    monkeypatch.setenv("RAYJOBS_CLUSTER", "dev")
    # RAYJOBS_CLUSTER beats RAY_ADDRESS (and the default cluster); the spec beats RAYJOBS_CLUSTER.
    assert resolve_connection().address == "http://127.0.0.1:23456"
    assert resolve_connection().source == "RAYJOBS_CLUSTER"
    assert resolve_connection(None, "http://spec:8265").address == "http://spec:8265"
    # Flags beat the spec and the environment, even a RAYJOBS_CLUSTER that names no cluster.
    assert resolve_connection(None, "http://spec:8265", cluster_name="default").address == "http://127.0.0.1:23460"
    monkeypatch.setenv("RAYJOBS_CLUSTER", "no-such-cluster")
    assert resolve_connection("http://flag:8265").address == "http://flag:8265"


def test_cluster_and_address_together_must_agree(local_cluster_state):
    local_cluster_state("dev", 23456)
    local_cluster_state("other", 23460)
    assert resolve_connection("localhost:23456/", cluster_name="dev").local_cluster == "dev"
    for address in ("http://127.0.0.1:23460", "http://elsewhere:8265"):
        with pytest.raises(BadInput, match="--cluster dev and --address .* name different clusters") as caught:
            resolve_connection(address, cluster_name="dev")
        assert caught.value.exit_code == 2


def test_unknown_cluster_name_lists_the_running_ones(local_cluster_state):
    local_cluster_state("dev", 23456)
    local_cluster_state("ci", 23460)
    with pytest.raises(NoCluster) as caught:
        resolve_connection(cluster_name="staging")
    message = str(caught.value)
    assert "no local cluster 'staging' is running (named by --cluster)" in message
    assert "'ci' at http://127.0.0.1:23460, 'dev' at http://127.0.0.1:23456" in message
    assert "rayjobs cluster up --name staging" in message
    assert caught.value.exit_code == 4


def test_unknown_cluster_name_when_none_runs(monkeypatch):
    monkeypatch.setenv("RAYJOBS_CLUSTER", "staging")
    with pytest.raises(NoCluster, match="named by RAYJOBS_CLUSTER.*No local cluster is running under"):
        resolve_connection()


def test_no_address_names_the_running_clusters(local_cluster_state):
    local_cluster_state("dev", 23456)
    with pytest.raises(NoCluster, match="'dev' at http://127.0.0.1:23456.*--cluster NAME"):
        resolve_connection()


@pytest.mark.parametrize("name", ["", "../etc", "-x"])
def test_bad_cluster_name_is_bad_input(name):
    with pytest.raises(BadInput):
        resolve_connection(cluster_name=name)
