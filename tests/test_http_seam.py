"""The one HTTP seam (jobs/infra/http.py): loopback never goes through a proxy, an error through a proxy
says so, and no other module of rayjobs sends a request of its own."""

from __future__ import annotations

import ast
import http.server
import json
import socket

import pytest

from runner.client.connection import Connection
from jobs.infra.http import bypass_proxy_for_loopback, fetch, proxy_for
from runner.client.jobs_api import JobsApi
from runner.errors import ClusterUnreachable
from tests.support.cli import REPO_ROOT, loopback_http_server, send_body


class _JobsList(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        send_body(self, 200, json.dumps([]).encode())

    def log_message(self, *args) -> None:
        pass


def _closed_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def dead_proxy(monkeypatch) -> str:
    """HTTP(S)_PROXY set to a loopback port where nothing listens, and no NO_PROXY: a proxy that cannot help."""
    proxy = f"http://127.0.0.1:{_closed_loopback_port()}"
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, proxy)
    return proxy


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.0.2", "[::1]"])
def test_loopback_is_never_proxied(dead_proxy, host):
    assert proxy_for(f"http://{host}:8265/api/jobs/") is None


def test_other_hosts_follow_the_environment(dead_proxy):
    assert proxy_for("http://head.example:8265/api/jobs/") == dead_proxy


def test_a_local_dashboard_answers_although_a_proxy_is_set(dead_proxy):
    with loopback_http_server(_JobsList) as url:
        assert fetch(f"{url}/api/jobs/").status == 200
        assert JobsApi(Connection(address=url, source="--address")).list_jobs() == []


def test_an_error_through_a_proxy_names_the_proxy(dead_proxy):
    # Only the proxy (on loopback) is contacted: the request for the cluster never leaves this machine.
    api = JobsApi(Connection(address="http://ray-head.invalid:8265", source="--address"))
    with pytest.raises(ClusterUnreachable) as raised:
        api.list_jobs()
    assert f"through the proxy at {dead_proxy}" in str(raised.value)
    assert "NO_PROXY" in str(raised.value)


def test_loopback_joins_no_proxy_for_libraries_that_read_it():
    env = {"NO_PROXY": "corp.example"}
    bypass_proxy_for_loopback(env)
    assert env["NO_PROXY"].split(",") == ["corp.example", "127.0.0.1", "localhost", "::1"]
    assert env["no_proxy"].split(",") == ["127.0.0.1", "localhost", "::1"]


_REQUEST_CALLS = {"urlopen", "build_opener", "HTTPConnection", "HTTPSConnection", "create_connection"}


def test_no_module_but_the_seam_sends_requests_of_its_own():
    offenders = {}
    seam = {REPO_ROOT / "jobs" / "infra" / "http.py", REPO_ROOT / "runner" / "client" / "jobs_api.py"}
    for package in ("jobs", "runner"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if path in seam:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            calls = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                     for node in ast.walk(tree) if isinstance(node, ast.Call)}
            imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            imports |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            found = sorted((calls & _REQUEST_CALLS) | {name for name in imports
                                                       if name in ("requests", "aiohttp", "urllib.request")})
            if found:
                offenders[str(path.relative_to(REPO_ROOT))] = found
    assert offenders == {}, "send requests through jobs.infra.http (REST) or JobsApi (log streams)"
