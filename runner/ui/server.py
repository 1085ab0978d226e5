"""``rayjobs ui``'s server: the pages and their JSON API over one location's records, on a standard-library
HTTP server, with a token when it listens anywhere but loopback.

Routes: ``/`` (runs), ``/run/NAME``, ``/compare?run=A&run=B``, ``/pipeline/RUN`` (a pipeline run's graph),
``/static/FILE`` (the pages' script and style); ``/api/runs``, ``/api/run/NAME``, ``/api/pipeline/RUN``,
``/api/run/NAME/log?attempt=SUBMISSION_ID&page=N&q=TEXT``, ``/api/compare?run=A&run=B``, ``/api/search?q=TEXT``.

What a browser may ask, as Jupyter's and MLflow's servers decide it:

- a request names this server in its ``Host`` header (its address, ``localhost``, ``127.0.0.1`` or ``[::1]``,
  and off loopback this machine's names), else 403: a page of another site that a DNS name rebound to
  127.0.0.1 names that site, and is refused;
- the API answers no other site's page: a request with an ``Origin`` that is not this server's own, or that a
  browser marks as from another site (``Sec-Fetch-Site``), is refused with 403;
- off loopback, every request carries the token (in the URL once, then in a cookie named for the port, or as
  ``Authorization: Bearer``), else 401.
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import secrets
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from runner.errors import BadInput, JobNotFound, RayJobsError
from runner.ui import data, pages
from runner.ui.log_pages import log_page, search_log

TOKEN_COOKIE = "rayjobs_ui_token"
DEFAULT_PORT = 8270
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# What a browser's fetch of the page's own API says of where it comes from; "none": typed in the address bar.
_OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_cookie(port: int) -> str:
    """The name of the token's cookie for the server on ``port``: a browser keeps cookies by host, not by port,
    so two servers on one machine would otherwise overwrite each other's."""
    return f"{TOKEN_COOKIE}_{port}"


def host_name(header: str) -> str | None:
    """The name a ``Host`` header gives (``localhost:8270`` → ``localhost``, ``[::1]`` → ``::1``), lowercased;
    None when it is no ``NAME[:PORT]``."""
    header = header.strip().lower()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket:
            return None
    else:
        name, colon, port = header.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name or None


def _same_name(name: str, allowed: frozenset[str]) -> bool:
    if name in allowed:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return any(_address(other) == address for other in allowed)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def machine_names(bound: str) -> frozenset[str]:
    """The names a browser may reach a server bound to ``bound`` by: the loopback names and ``bound`` itself, and
    off loopback this machine's host names and addresses (every interface's, when bound to all of them)."""
    names = set(LOOPBACK_NAMES) | {bound.strip("[]").lower()}
    if is_loopback(bound):
        return frozenset(names)
    hostname = socket.gethostname()
    names |= {hostname.lower(), socket.getfqdn().lower()}
    try:
        official, aliases, addresses = socket.gethostbyname_ex(hostname)
        names |= {official.lower(), *(alias.lower() for alias in aliases), *addresses}
    except OSError:
        pass
    unspecified = _address(bound.strip("[]"))
    if unspecified is not None and unspecified.is_unspecified:
        import psutil

        names |= {entry.address.split("%")[0].lower() for entries in psutil.net_if_addrs().values()
                  for entry in entries if entry.family in (socket.AF_INET, socket.AF_INET6)}
    return frozenset(names)


class RecordsServer(http.server.ThreadingHTTPServer):
    """An HTTP server of one location's run records; ``token`` is None on loopback, where none is asked."""

    daemon_threads = True

    def __init__(self, records: data.Records, host: str, port: int, token: str | None) -> None:
        self.records = records
        self.token = token
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.address_family = family
        super().__init__((host.strip("[]"), port), _Handler)
        self.allowed_hosts = machine_names(host)
        self.cookie = token_cookie(self.server_address[1])

    @property
    def url(self) -> str:
        """The address a browser opens, with the token when one is asked."""
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")


def make_server(records: data.Records, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> RecordsServer:
    """A server of ``records`` bound to ``host``:``port`` (0: any free port), not yet serving.

    Raises:
        BadInput: the address cannot be bound (in use, or not this machine's) (exit code 2).
    """
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    try:
        return RecordsServer(records, host, port, token)
    except OSError as exc:
        raise BadInput(f"cannot serve on {host}:{port}: {exc.strerror or exc}; choose another with --port "
                       "(0 picks a free one)") from None


def serve_in_thread(server: RecordsServer) -> threading.Thread:
    """Serve in a background thread (for tests and scripts); ``server.shutdown()`` ends it."""
    thread = threading.Thread(target=server.serve_forever, name="rayjobs-ui", daemon=True)
    thread.start()
    return thread


def _cookie(header: str, name: str) -> str | None:
    # Read by hand: the standard library's parser drops every cookie of a header when one is malformed, and a
    # browser sends this host's cookies of every other server on it too.
    for pair in header.split(";"):
        key, equals, value = pair.strip().partition("=")
        if equals and key == name:
            return value.strip().strip('"')
    return None


def _same(given: str, token: str) -> bool:
    """Whether ``given`` is the token, in constant time; any text compares (as bytes), none raises."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


class _Handler(http.server.BaseHTTPRequestHandler):
    server: RecordsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        # A page asks every few seconds while a run goes on; a line each would bury what the command says.
        return

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if not self._host_allowed():
            self._send(403, b"this rayjobs ui answers to its own address only (the Host header names another)\n",
                       "text/plain; charset=utf-8")
            return
        set_cookie = self._authorized(query)
        if set_cookie is None:
            self._send(401, b"this rayjobs ui asks for its token: open the URL it printed (with ?token=...) or send "
                            b"Authorization: Bearer TOKEN\n", "text/plain; charset=utf-8")
            return
        parts = [urllib.parse.unquote(part) for part in url.path.strip("/").split("/")] if url.path != "/" else []
        if parts[:1] == ["api"] and not self._from_own_page():
            self._json({"error": "this API answers its own pages only (the request came from another site)"}, 403)
            return
        try:
            self._route(parts, query, set_cookie)
        except JobNotFound as exc:
            self._json({"error": str(exc)}, 404)
        except RayJobsError as exc:
            self._json({"error": str(exc)}, 400 if isinstance(exc, BadInput) else 502)

    def _route(self, parts: list[str], query: dict[str, list[str]], set_cookie: bool) -> None:
        records = self.server.records
        first = query.get
        if not parts or parts == ["index.html"]:
            self._html(pages.runs_page(), set_cookie)
        elif parts[0] == "run" and len(parts) == 2:
            self._html(pages.run_page(parts[1]), set_cookie)
        elif parts == ["compare"]:
            self._html(pages.compare_page(), set_cookie)
        elif parts[0] == "pipeline" and len(parts) == 2:
            self._html(pages.pipeline_page(parts[1]), set_cookie)
        elif parts[0] == pages.STATIC_FOLDER and len(parts) == 2 and parts[1] in pages.static_files():
            self._send(200, pages.static_file(parts[1]), pages.static_files()[parts[1]])
        elif parts == ["api", "runs"]:
            self._json(data.runs_table(records))
        elif parts[:2] == ["api", "run"] and len(parts) == 3:
            self._json(data.run_detail(records, parts[2]))
        elif parts[:2] == ["api", "run"] and len(parts) == 4 and parts[3] == "log":
            self._json(self._log(parts[2], (first("attempt") or [""])[0], (first("page") or ["0"])[0],
                                 (first("q") or [""])[0]))
        elif parts[:2] == ["api", "pipeline"] and len(parts) == 3:
            self._json(data.pipeline_detail(records, parts[2]))
        elif parts == ["api", "compare"]:
            self._json(data.compare_data(records, query.get("run") or []))
        elif parts == ["api", "search"]:
            self._json(data.search_runs(records, (first("q") or [""])[0].strip()))
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _log(self, name: str, submission: str, page: str, text: str) -> dict[str, Any]:
        folder = self.server.records.folder(name)
        known = data.submissions(data.read_run(folder))
        if not known:
            raise JobNotFound(f"run {name!r} has no attempts, so no log")
        if submission not in known:
            submission = known[-1]
        if text.strip():
            return {"submission_id": submission, "query": text, "matches": search_log(folder, submission, text)}
        try:
            number = int(page)
        except ValueError:
            raise BadInput(f"page {page!r} is not a number") from None
        return {"submission_id": submission, **log_page(folder, submission, number)}

    def _host_allowed(self) -> bool:
        name = host_name(self.headers.get("Host") or "")
        return name is not None and _same_name(name, self.server.allowed_hosts)

    def _from_own_page(self) -> bool:
        """Whether a request to the API comes from this server's own page (or from no page at all: a script)."""
        if (self.headers.get("Sec-Fetch-Site") or "same-origin").lower() not in _OWN_FETCH_SITES:
            return False
        origin = self.headers.get("Origin")
        own = f"http://{(self.headers.get('Host') or '').strip().lower()}"
        return origin is None or origin.strip().lower() == own

    def _authorized(self, query: dict[str, list[str]]) -> bool | None:
        """None when refused; else whether the answer sets the token's cookie (it came in the URL)."""
        token = self.server.token
        if token is None:
            return False
        given = (query.get("token") or [""])[0]
        if given and _same(given, token):
            return True
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer ") and _same(header[len("Bearer "):].strip(), token):
            return False
        cookie = _cookie(self.headers.get("Cookie", ""), self.server.cookie)
        if cookie is not None and _same(cookie, token):
            return False
        return None

    def _html(self, page: str, set_cookie: bool) -> None:
        headers = {}
        if set_cookie:
            headers["Set-Cookie"] = f"{self.server.cookie}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
        self._send(200, page.encode(), "text/html; charset=utf-8", headers)

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(status, pages.json_text(value).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # The pages load nothing from anywhere else, run no inline script or style, and are framed by no page;
        # a browser refuses whatever would.
        self.send_header("Content-Security-Policy", pages.CONTENT_SECURITY_POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        # A page's URL may hold the token: it is never sent on to another site.
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def serve(records: data.Records, host: str, port: int, say: Callable[[str], None]) -> None:
    """Serve ``records`` until interrupted, having said where (and the token, once, when one is asked)."""
    server = make_server(records, host, port)
    with server:
        if server.token:
            say(f"serving the run records of {records.location.location} at {server.url} (token auth on: "
                "open this URL once, or send Authorization: Bearer TOKEN; Ctrl-C stops it)")
        else:
            say(f"serving the run records of {records.location.location} at {server.url} (Ctrl-C stops it)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            say("stopped")
