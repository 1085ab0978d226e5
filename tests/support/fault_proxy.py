"""A TCP proxy in front of a local dashboard that breaks the network on command.

Tests point a client at ``proxy.address`` instead of the dashboard and then cut,
refuse, stall or answer 502 to its connections, to see that the client rides the
faults out. The proxy also counts the HTTP requests it forwards, so a test can
tell how hard a client hits the cluster.

It only ever connects to 127.0.0.1, listens on 127.0.0.1 on a free port, and
shuts itself down when its ``with`` block ends (or after ``max_lifetime_s`` at the
latest, so a forgotten proxy cannot outlive a hung test for long).
"""

from __future__ import annotations

import collections
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
_BUFFER = 65536
_TRUNCATE_BODY_BYTES = 8
_POLL_S = 0.1
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]$")
_BAD_GATEWAY = (b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n"
                b"Connection: close\r\n\r\nbad gateway\n")


@dataclass
class _PathFault:
    path: str
    fault: str
    times: int
    after: int
    method: str | None = None


@dataclass(frozen=True)
class SeenRequest:
    """One HTTP request the proxy forwarded."""

    at: float  # time.monotonic() when its request line passed through
    method: str
    path: str


class _RequestCounter:
    """Finds request lines in one connection's client-to-server bytes.

    It follows the HTTP/1.1 framing (headers, then ``Content-Length`` bytes of
    body) so that bytes inside an uploaded body are never taken for a request
    line, and stops looking once the connection is upgraded (a websocket) or
    uses a framing it does not follow.
    """

    def __init__(self, record) -> None:
        self._record = record
        self._buffer = b""
        self._skip_body = 0
        self._done = False

    def feed(self, data: bytes) -> None:
        if self._done:
            return
        if self._skip_body:
            skipped = min(self._skip_body, len(data))
            self._skip_body -= skipped
            data = data[skipped:]
        self._buffer += data
        while not self._done and not self._skip_body:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > 65536:  # not HTTP after all
                    self._done = True
                return
            head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
            lines = head.split(b"\r\n")
            match = _REQUEST_LINE.match(lines[0])
            if match is None:
                self._done = True
                return
            self._record(match.group(1).decode(), match.group(2).decode("latin-1"))
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip().lower()
            if b"upgrade" in headers or b"chunked" in headers.get(b"transfer-encoding", b""):
                self._done = True
                return
            body = int(headers.get(b"content-length", b"0") or 0)
            skipped = min(body, len(self._buffer))
            self._buffer = self._buffer[skipped:]
            self._skip_body = body - skipped


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.counter = _RequestCounter(proxy._record_request)
        self.truncate_response = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="fault-proxy-link", daemon=True).start()

    def _run(self) -> None:
        if self.proxy._has_path_faults():
            fault = self.proxy._fault_for(*_peek_request(self.client))
            if fault == "hold":
                # The request waits whole in the client's socket, as in a slow network: it reaches the dashboard
                # on release even when the client has given up on it and gone.
                with self.proxy._lock:
                    self.proxy.held_requests += 1
                self.proxy._released.wait(self.proxy.max_lifetime_s)
            if fault == "502":
                with self.proxy._lock:
                    self.proxy.bad_gateway_answers += 1
                self.proxy._forget(self)
                _answer_bad_gateway(self.client)
                self.closed.set()
                return
            self.truncate_response = fault == "truncate"
        try:
            self.upstream = socket.create_connection((LOOPBACK, self.proxy.upstream_port), timeout=5)
        except OSError:
            self.close(abort=True)
            return
        if self.closed.is_set():  # cut while connecting
            self.close()
            return
        threading.Thread(target=self._pump, args=(self.upstream, self.client, False),
                         name="fault-proxy-down", daemon=True).start()
        self._pump(self.client, self.upstream, True)

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        held = b""
        try:
            source.settimeout(_POLL_S)  # inside the try: a cut may have closed the socket already
            while not self.closed.is_set():
                try:
                    data = source.recv(_BUFFER)
                except socket.timeout:
                    continue
                if not data:
                    break
                # A stall holds the bytes back; they go on once it ends, unless a cut came first.
                while self.proxy._stalled() and not self.closed.is_set():
                    time.sleep(_POLL_S)
                if self.closed.is_set():
                    break
                if from_client:
                    self.counter.feed(data)
                elif self.truncate_response:
                    held += data
                    head_end = held.find(b"\r\n\r\n")
                    if head_end < 0 or len(held) < head_end + 4 + _TRUNCATE_BODY_BYTES:
                        continue
                    target.sendall(held[:head_end + 4 + _TRUNCATE_BODY_BYTES])
                    break
                target.sendall(data)
                if not from_client:
                    self.proxy._count_down(len(data))
        except OSError:
            pass
        self.close()

    def close(self, abort: bool = False) -> None:
        """Close both sides; ``abort`` resets the client's connection instead of ending it cleanly."""
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            try:
                if abort and sock is self.client:
                    # SO_LINGER with a zero timeout makes close() send RST, as a dying middlebox would.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        self.proxy._forget(self)


class FaultProxy:
    """A fault-injecting TCP proxy from 127.0.0.1:<free port> to 127.0.0.1:``upstream_port``.

    Use it as a context manager. ``address`` is the URL to give the client.
    """

    def __init__(self, upstream_port: int, max_lifetime_s: float = 600.0) -> None:
        self.upstream_port = int(upstream_port)
        self.max_lifetime_s = max_lifetime_s
        self.connections = 0
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._outage_until = 0.0
        self._bad_gateway_until = 0.0
        self._stall_until = 0.0
        self._path_faults: list[_PathFault] = []
        self.bad_gateway_answers = 0
        self.held_requests = 0
        self._released = threading.Event()
        self.resets = 0
        self.bytes_down = 0  # bytes forwarded from the dashboard to clients
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)

    @property
    def address(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._stopping.set()
        self._thread.join(timeout=5)
        self.cut_all()

    # --- faults -------------------------------------------------------------------------------------

    def cut_all(self, abort: bool = True) -> int:
        """Close every open connection now, both directions; returns how many were cut."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close(abort=abort)
        return len(links)

    def outage(self, seconds: float) -> None:
        """Cut every connection and reset each new one for ``seconds`` (the cluster looks gone)."""
        with self._lock:
            self._outage_until = time.monotonic() + seconds
        self.cut_all()

    def end_outage(self) -> None:
        with self._lock:
            self._outage_until = 0.0

    def answer_502(self, seconds: float) -> None:
        """For ``seconds``, answer each new connection with ``502 Bad Gateway`` (as a proxy whose backend is down)."""
        with self._lock:
            self._bad_gateway_until = time.monotonic() + seconds

    def stall(self, seconds: float) -> None:
        """For ``seconds``, accept connections but forward nothing either way (a black hole that later heals)."""
        with self._lock:
            self._stall_until = time.monotonic() + seconds

    def fail_path(self, path: str, fault: str, times: int = 1, after: int = 0) -> None:
        """Break the connections whose first request is for exactly ``path`` (query ignored).

        The first ``after`` of them pass; the next ``times`` get ``fault``: ``"502"`` (answered
        with 502 Bad Gateway) or ``"truncate"`` (the response is cut off a few bytes into its
        body, so the client reads a short body from a connection that then ends).
        """
        if fault not in ("502", "truncate"):  # a "hold" is set with hold_path
            raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            self._path_faults.append(_PathFault(path, fault, times, after))

    def hold_path(self, path: str, method: str | None = None, times: int = 1, after: int = 0) -> None:
        """Hold the next ``times`` requests for exactly ``path`` (and ``method``, when given), once ``after`` of them
        have passed, until :meth:`release`: the dashboard gets each one only then, whatever became of its client."""
        with self._lock:
            self._path_faults.append(_PathFault(path, "hold", times, after, method))

    def release(self) -> None:
        """Let the held requests (and any held from now on) go on to the dashboard."""
        self._released.set()

    def path_faults_left(self) -> int:
        """How many faults set with ``fail_path`` have not struck yet."""
        with self._lock:
            return sum(rule.times for rule in self._path_faults)

    # --- counters -----------------------------------------------------------------------------------

    def requests_to(self, prefix: str = "/", since: float | None = None, until: float | None = None) -> list[SeenRequest]:
        """Forwarded requests whose path starts with ``prefix``, optionally within a monotonic time window."""
        with self._lock:
            seen = list(self.requests)
        return [r for r in seen if r.path.startswith(prefix)
                and (since is None or r.at >= since) and (until is None or r.at <= until)]

    def request_counts(self) -> dict[str, int]:
        """``"METHOD path"`` → how often it was forwarded."""
        with self._lock:
            return dict(collections.Counter(f"{r.method} {r.path}" for r in self.requests))

    # --- internals ----------------------------------------------------------------------------------

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            for rule in self._path_faults:
                if rule.times > 0 and path.split("?", 1)[0] == rule.path and rule.method in (None, method):
                    if rule.after > 0:
                        rule.after -= 1
                        return None
                    rule.times -= 1
                    return rule.fault
        return None

    def _has_path_faults(self) -> bool:
        with self._lock:
            return any(rule.times > 0 for rule in self._path_faults)

    def _stalled(self) -> bool:
        return time.monotonic() < self._stall_until

    def _count_down(self, size: int) -> None:
        with self._lock:
            self.bytes_down += size

    def _record_request(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append(SeenRequest(time.monotonic(), method, path))

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _accept_loop(self) -> None:
        try:
            while not self._stopping.is_set():
                if time.monotonic() - self._started_at > self.max_lifetime_s:
                    break
                try:
                    client, _ = self._listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    break
                with self._lock:
                    self.connections += 1
                    now = time.monotonic()
                    outage, bad_gateway = now < self._outage_until, now < self._bad_gateway_until
                    self.resets += outage
                    self.bad_gateway_answers += bad_gateway and not outage
                if outage:
                    _reset(client)
                elif bad_gateway:
                    threading.Thread(target=_answer_bad_gateway, args=(client,), daemon=True).start()
                else:
                    link = _Link(self, client)
                    with self._lock:
                        self._links.add(link)
                    link.start()
        finally:
            self._listener.close()
            self._stopping.set()
            self.cut_all()


def _peek_request(client: socket.socket) -> tuple[str, str]:
    """The method and path of the first request on ``client``, read without consuming it ("" if none comes)."""
    client.settimeout(2)
    deadline = time.monotonic() + 2
    head = b""
    try:
        while b"\r\n" not in head and time.monotonic() < deadline:
            head = client.recv(4096, socket.MSG_PEEK)
            if not head:
                break
            if b"\r\n" not in head:
                time.sleep(0.01)
    except OSError:
        return "", ""
    match = _REQUEST_LINE.match(head.split(b"\r\n", 1)[0])
    return (match.group(1).decode(), match.group(2).decode("latin-1")) if match else ("", "")


def _reset(client: socket.socket) -> None:
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    client.close()


def _answer_bad_gateway(client: socket.socket) -> None:
    # Read the request head first: closing with unread input would reset the connection
    # and the client might never see the 502.
    client.settimeout(2)
    received = b""
    try:
        while b"\r\n\r\n" not in received and len(received) < 65536:
            chunk = client.recv(_BUFFER)
            if not chunk:
                break
            received += chunk
        client.sendall(_BAD_GATEWAY)
        client.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        client.close()
