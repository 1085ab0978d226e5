"""A real MLflow tracking server on loopback, with a SQLite store, for the tracking tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.support.waiting import HANG_GUARD_S, wait_for_condition


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class MlflowServer:
    """One ``mlflow server`` process; :meth:`stop` and :meth:`start` again keep its store and port."""

    folder: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it answers."""
        command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                   str(self.port), "--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
                   "--default-artifact-root", str(self.folder / "artifacts")]
        log = open(self.folder / "server.log", "ab")
        # Without the job runner and its eight queue consumers (MLflow's GenAI jobs): nothing here uses them,
        # and each is a Python process that imports MLflow on a 2-core machine.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.folder, start_new_session=True, env=env)
        log.close()
        wait_for_condition(self._answers, timeout_s=HANG_GUARD_S, interval_s=0.2)

    def stop(self) -> None:
        """Stop every process of the server (its own session) and wait for them."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        wait_for_condition(lambda: not self._answers(), timeout_s=HANG_GUARD_S)

    def client(self):
        """An ``MlflowClient`` of this server, to inspect what the job recorded."""
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"mlflow server exited {self.process.returncode}; see {self.folder / 'server.log'}")
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever HTTP_PROXY says
        try:
            with direct.open(f"{self.uri}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[MlflowServer]:
    """A started MLflow server with its store in ``folder`` for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(folder, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
