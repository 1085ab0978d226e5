"""Running the real ``rayjobs`` command in a subprocess, as a user would, and loopback HTTP servers to point it at."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_for_condition

REPO_ROOT = Path(__file__).resolve().parents[2]


def rayjobs_command() -> list[str]:
    script = Path(sys.executable).parent / "rayjobs"
    if script.exists():
        return [str(script)]
    found = shutil.which("rayjobs")
    return [found] if found else [sys.executable, "-m", "runner.cli.app"]


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


def rayjobs_in_process(*args: str, home: Path | None = None, env: dict[str, str] | None = None,
                       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The command run inside this test process (typer's runner), with the environment ``run_rayjobs`` would give it.

    For commands whose process start is not what a test checks: a ``rayjobs`` process costs about half a
    CPU-second to start (Python, pydantic, typer), many times over in a suite on 2 cores. The result is
    shaped like ``run_rayjobs``'s, so a test can use either.
    """
    from typer.testing import CliRunner

    from runner.cli.app import app

    wanted = env or cli_env(home)
    # The runner sets what it is given and restores it after; variables the real process would not see go too.
    changes: dict[str, str | None] = {key: None for key in os.environ if key not in wanted}
    changes.update(wanted)
    previous = os.getcwd()
    os.chdir(cwd or REPO_ROOT)
    try:
        result = CliRunner().invoke(app, list(args), env=changes)
    finally:
        os.chdir(previous)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["rayjobs", *args], result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def own_cluster(name: str, home: Path, env: dict[str, str]) -> Iterator[Any]:
    """``rayjobs cluster up --name NAME --num-cpus 1`` with ``env`` (its nodes inherit it, credentials included);
    yields its ``LocalCluster`` and takes it down afterwards, whatever happened."""
    from runner.local.state import LocalCluster

    up = run_rayjobs("cluster", "up", "--name", name, "--num-cpus", "1", home=home, timeout=400, env=env)
    assert up.returncode == 0, up.stderr
    try:
        yield LocalCluster.from_json((home / "clusters" / name / "cluster.json").read_text())
    finally:
        run_rayjobs("cluster", "down", "--name", name, home=home, timeout=120, env=env)


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


PLAIN_RAY_TRAIN = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"


def plain_train_spec(directory: Path, name: str, arguments: str, policy: str = "", runtime_env: str = "",
                     after: str = "") -> Path:
    """A spec whose job runs tests/data/scripts/plain_ray_train.py, a Ray Train script that knows nothing of rayjobs.

    The script is ``train.py`` in ``directory/code`` (the job's working_dir; a test may put more files there) and
    saves under ``directory/runs``; ``arguments`` are its flags. ``policy`` holds spec lines before
    ``runtime_env``, ``runtime_env`` lines of that block after its working_dir (indented), ``after`` lines after it.
    """
    code = directory / "code"
    code.mkdir(exist_ok=True)
    shutil.copy(PLAIN_RAY_TRAIN, code / "train.py")
    spec = directory / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python train.py --storage {directory / 'runs'} {arguments}\n{policy}"
                    f"runtime_env:\n  working_dir: {code}\n{runtime_env}{after}")
    return spec


def submit_spec(home: Path, spec: str, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``rayjobs submit SPEC --set O …`` on the cluster of ``home``, followed to the end."""
    return run_rayjobs("submit", spec, *[arg for override in overrides for arg in ("--set", override)],
                       home=home, timeout=timeout)


def read_metrics_csv(run_dir: Path) -> list[dict[str, float]]:
    """A training run's metrics.csv, every field as a number."""
    from workloads.ray_train.metrics import METRICS_CSV, read_metrics_csv as read_rows

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



class CliRun:
    """A ``rayjobs`` subprocess whose output is read line by line as it comes.

    With ``raw_stdout`` its stdout lines are kept as bytes, carriage returns and all.
    """

    def __init__(self, args: list[str], env: dict[str, str], raw_stdout: bool = False) -> None:
        self.started = time.monotonic()
        self.elapsed_s: float | None = None
        self.process = subprocess.Popen([*rayjobs_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)
        self.raw_stdout = raw_stdout
        self.stdout_lines: list = []
        self.stderr_lines: list[str] = []
        stdout = self.process.stdout if raw_stdout else io.TextIOWrapper(self.process.stdout)
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((stdout, self.stdout_lines),
                                              (io.TextIOWrapper(self.process.stderr, errors="replace"),
                                               self.stderr_lines))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list) -> None:
        for line in stream:
            into.append(line)

    @property
    def stdout(self) -> Any:
        return (b"" if self.raw_stdout else "").join(self.stdout_lines)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def wait_for_stdout(self, text: str, timeout_s: float = 120) -> None:
        """Block until a stdout line equals ``text`` (the job is running and its log streams)."""
        wait_for_condition(lambda: any(line.rstrip("\n") == text for line in self.stdout_lines)
                           or self.process.poll() is not None, timeout_s=timeout_s, interval_s=0.05)
        assert any(line.rstrip("\n") == text for line in self.stdout_lines), \
            f"never printed {text!r}; exit code {self.process.poll()}, stderr:\n{self.stderr}"

    def wait_for_stderr(self, text: str, timeout_s: float = 120) -> None:
        """Block until a stderr line holds ``text`` (a hang guard, not a measurement)."""
        wait_for_condition(lambda: any(text in line for line in self.stderr_lines) or self.process.poll() is not None,
                           timeout_s=timeout_s, interval_s=0.1)
        assert any(text in line for line in self.stderr_lines), \
            f"never printed {text!r}; exit code {self.process.poll()}, stderr:\n{self.stderr}"

    def finish(self, timeout_s: float = 180) -> int:
        """Wait for the command to end (killing it after the hang guard ``timeout_s``); its exit code."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        if self.elapsed_s is None:
            self.elapsed_s = time.monotonic() - self.started
        return self.process.returncode

    def job_id(self) -> str:
        """The submission id the command printed on stderr."""
        for word in self.stderr.split():
            if word.startswith("raysubmit_"):
                return word
        raise AssertionError(f"no submission id in stderr:\n{self.stderr}")


# --------------------------------------------------------------------------- a cluster seen directly


def dashboard_port(cluster) -> int:
    """The dashboard port of a local cluster (a ``runner.local.LocalCluster``)."""
    return urllib.parse.urlsplit(cluster.dashboard_url).port


def direct_api(cluster):
    """The cluster's job API without any proxy in between, to see what really happened to a job."""
    from runner.client.jobs_api import JobsApi
    from runner.client.connection import Connection

    headers = {"Authorization": f"Bearer {cluster.auth_token()}"} if cluster.token_file else {}
    return JobsApi(Connection(address=cluster.dashboard_url, source="test", headers=headers))


def proxied_env(cluster, home: Path) -> dict[str, str]:
    """The environment of a ``rayjobs`` that reaches ``cluster`` through a proxy's address."""
    from runner.local import loopback_env

    # Through the proxy's address the CLI cannot know the token belongs to the local cluster,
    # so it goes in explicitly, as it would for any remote cluster.
    return cli_env(home, **loopback_env(cluster))
