"""Real servers on loopback for notifications: a JSON webhook, an SMTP server, a port that never answers."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator


class Webhook:
    """An HTTP server that keeps the JSON body of every POST it is sent, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.arrived = threading.Event()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                webhook.received.append((self.path, json.loads(body or b"{}")))
                self.send_response(200)
                self.end_headers()
                webhook.arrived.set()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def url(self, path: str = "/hook") -> str:
        """The Apprise URL of this receiver."""
        return f"json://127.0.0.1:{self.port}{path}"


@contextmanager
def webhook_receiver() -> Iterator[Webhook]:
    """A running :class:`Webhook`, shut down afterwards."""
    webhook = Webhook()
    thread = threading.Thread(target=webhook.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield webhook
    finally:
        webhook.server.shutdown()
        webhook.server.server_close()


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections and never answers: a service that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@contextmanager
def smtp_receiver() -> Iterator[tuple[int, list[Any]]]:
    """An SMTP server (aiosmtpd) on loopback: its port, and the envelopes it has taken."""
    from aiosmtpd.controller import Controller

    messages: list[Any] = []

    class Keep:
        async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
            messages.append(envelope)
            return "250 OK"

    controller = Controller(Keep(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port, messages
    finally:
        controller.stop()
