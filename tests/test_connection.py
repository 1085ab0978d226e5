"""Which cluster rayjobs talks to, and with which headers."""

from __future__ import annotations

import json

import pytest

from jobs.address import normalize_address
from runner.connection import parse_header, resolve_connection
from runner.errors import BadInput, NoCluster


@pytest.fixture(autouse=True)
def no_ray_env(monkeypatch, tmp_path):
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                 "RAY_AUTH_MODE"):
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
