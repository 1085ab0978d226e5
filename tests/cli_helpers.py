"""Running the real ``rayjobs`` command in a subprocess, as a user would."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real Food-101 photos kept beside the project for development; absent on a user's machine.
FOOD101_SAMPLE = REPO_ROOT.parent / "shared" / "data" / "food101-sample"


def rayjobs_command() -> list[str]:
    script = Path(sys.executable).parent / "rayjobs"
    if script.exists():
        return [str(script)]
    found = shutil.which("rayjobs")
    return [found] if found else [sys.executable, "-m", "runner.cli"]


def cli_env(home: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_HEADERS", "RAY_AUTH_TOKEN",
                        "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAYJOBS_CLUSTER")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if home is not None:
        env["RAYJOBS_HOME"] = str(home)
    env.update(extra)
    return env


def run_rayjobs(*args: str, home: Path | None = None, timeout: float = 180, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*rayjobs_command(), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or REPO_ROOT, env=env or cli_env(home), stdin=subprocess.DEVNULL)


def _interruptible() -> None:
    # A test suite started in the background inherits an ignored SIGINT, and Python keeps it
    # ignored; the command must see Ctrl-C the way it does in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_rayjobs(*args: str, home: Path | None = None, **extra_env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*rayjobs_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env=cli_env(home, **extra_env), stdin=subprocess.DEVNULL,
                            preexec_fn=_interruptible)


def write_spec(directory: Path, name: str, body: str) -> Path:
    """A spec whose working_dir is the project (so `python -m workloads.…` works on the cluster)."""
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\nruntime_env:\n  working_dir: {REPO_ROOT}\n{body}")
    return path


def submit_spec(home: Path, spec: str, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``rayjobs submit SPEC --set O …`` on the cluster of ``home``, followed to the end."""
    return run_rayjobs("submit", spec, *[arg for override in overrides for arg in ("--set", override)],
                       home=home, timeout=timeout)


def read_metrics_csv(run_dir: Path) -> list[dict[str, float]]:
    """A training run's metrics.csv, every field as a number."""
    from workloads.training.metrics import METRICS_CSV, read_metrics_csv as read_rows

    return read_rows(run_dir / METRICS_CSV)


@contextlib.contextmanager
def loopback_http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port for the duration; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def send_body(handler: http.server.BaseHTTPRequestHandler, code: int, body: bytes,
              content_type: str = "application/json") -> None:
    """Answer a request with ``code`` and ``body`` (from inside a handler's ``do_*``)."""
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

