"""A real Redis on a free loopback port, for a local cluster whose head keeps its GCS there (GCS fault tolerance).

Debian's ``redis-server`` runs in a process session of its own, in memory only (``--save ''``,
``--appendonly no``: the cluster's head restarts, Redis does not), and is stopped when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import HANG_GUARD_S

LOOPBACK = "127.0.0.1"


def redis_server_executable() -> str | None:
    """The ``redis-server`` command, or None when it is not installed."""
    return shutil.which("redis-server") or ("/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK)
                                            else None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A Redis on 127.0.0.1, its files in ``directory``; yields its address as ``redis://127.0.0.1:PORT``."""
    executable = redis_server_executable()
    assert executable is not None, "redis-server is not installed (Debian: apt-get install redis-server)"
    directory.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with open(directory / "redis.log", "wb") as log:
        process = subprocess.Popen([executable, "--bind", LOOPBACK, "--port", str(port), "--save", "", "--appendonly",
                                    "no", "--dir", str(directory), "--protected-mode", "yes"],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not _answers(port):
            assert process.poll() is None, (directory / "redis.log").read_text(errors="replace")
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)
        yield f"redis://{LOOPBACK}:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
