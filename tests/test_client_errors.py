"""What the REST client says when the address is not a Ray dashboard."""

from __future__ import annotations

import http.server

import pytest

from runner.client.jobs_api import JobsApi
from runner.client.connection import Connection
from runner.errors import NotADashboard
from tests.support.cli import loopback_http_server, run_rayjobs, send_body


class _HtmlPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the name http.server calls
        send_body(self, 200, b"<!doctype html><html><body>Welcome to nginx!</body></html>", "text/html")

    def log_message(self, *args):
        pass


@pytest.fixture
def html_server():
    with loopback_http_server(_HtmlPage) as url:
        yield url


def test_html_answer_is_not_a_dashboard(html_server):
    api = JobsApi(Connection(address=html_server, source="test"))
    with pytest.raises(NotADashboard, match="not Ray's job API"):
        api.list_jobs()


def test_cli_exit_code_for_a_web_page(html_server, tmp_path):
    result = run_rayjobs("status", "anything", "--address", html_server, "--header", "Authorization: Bearer s3cret",
                         home=tmp_path)
    assert result.returncode == 4
    assert "not Ray's job API" in result.stderr and "Welcome to nginx" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
