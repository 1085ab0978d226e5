"""What the REST client says when the address is not a Ray dashboard."""

from __future__ import annotations

import http.server
import threading

import pytest

from runner.api import JobsApi
from runner.connection import Connection
from runner.errors import NotADashboard
from tests.cli_helpers import run_rayjobs


class _HtmlPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the name http.server calls
        body = b"<!doctype html><html><body>Welcome to nginx!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def html_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


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
