"""Progress of a job as it runs, on the session cluster: a Ray Train script that knows nothing of rayjobs.

The script (tests/data/scripts/plain_ray_train.py) is written like Ray's own examples: two workers,
``ray.train.report`` each epoch, a checkpoint from rank 0 (how a restart is shown is checked where a
node dies, tests/test_multinode.py). One job is followed as a pipe shows it, then
its finished log is read again, exactly as written, through a pseudo-terminal, and as JSON.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import time

import pytest

from tests.support.cli import REPO_ROOT, cli_env, rayjobs_command, run_rayjobs
from tests.support.waiting import HANG_GUARD_S

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"
EPOCHS = 3


@pytest.fixture(scope="module")
def followed(ray_cluster, ray_cluster_home, tmp_path_factory) -> dict:
    """The script's job, submitted and followed to its end by `rayjobs submit` writing to pipes."""
    directory = tmp_path_factory.mktemp("plain-train")
    code = directory / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    spec = directory / "plain.yaml"
    spec.write_text(f"name: plain-train\nentrypoint: python train.py --storage {directory / 'runs'} "
                    f"--epochs {EPOCHS} --epoch-s 0.2\nruntime_env:\n  working_dir: {code}\n")
    result = run_rayjobs("submit", str(spec), home=ray_cluster_home)
    submitted = re.search(r"submitted plain-train as (\S+)", result.stderr)
    assert submitted, result.stderr
    return {"result": result, "job_id": submitted[1]}


def test_a_plain_ray_train_script_shows_epochs_metrics_and_eta_line_by_line(followed):
    result = followed["result"]
    assert result.returncode == 0, result.stderr[-3000:]
    progress = [line.removeprefix("rayjobs: ") for line in result.stderr.splitlines()
                if line.startswith("rayjobs: ") and ("training" in line or re.match(r"rayjobs: epoch \d", line))]
    assert progress[0] == f"training started: 2 workers, {EPOCHS} epochs, max_failures 1"
    assert progress[1] == "training attempt 1: 2 workers on 1 node"
    epochs = [line for line in progress if line.startswith("epoch ")]
    assert epochs[-1].startswith(f"epoch {EPOCHS}/{EPOCHS} · loss ")
    assert "ETA" in epochs[-1] and "checkpoint saved" in epochs[-1]
    assert [int(re.match(r"epoch (\d+)", line)[1]) for line in epochs] == list(range(1, EPOCHS + 1))
    assert progress[-1] == f"training finished after {EPOCHS} reports"

    # The job's own output stays on stdout, without the events, Ray's chatter or colour codes.
    assert re.search(r"^final loss \d", result.stdout, re.MULTILINE)
    assert "rayjobs-event" not in result.stdout + result.stderr
    assert "Reporting training result" not in result.stdout
    assert "\x1b[" not in result.stdout + result.stderr


def test_the_saved_log_is_printed_exactly_and_following_it_again_replays_the_progress(followed, rj):
    job_id = followed["job_id"]
    raw = rj("logs", job_id)
    assert raw.returncode == 0
    assert raw.stdout.count("rayjobs-event ") >= EPOCHS + 3  # as written: the events are in the log itself

    status = rj("status", job_id)
    assert re.search(rf"^progress: +epoch {EPOCHS}/{EPOCHS} · loss \d", status.stdout, re.MULTILINE), status.stdout
    assert re.search(r"^training attempts: +1, 0 restarts$", status.stdout, re.MULTILINE), status.stdout
    assert "ETA" not in status.stdout  # training has finished

    again = rj("logs", "--follow", job_id, "--raw")
    assert again.returncode == 0
    assert "rayjobs-event " in again.stdout  # --raw: the log as written
    assert f"rayjobs: epoch {EPOCHS}/{EPOCHS}" in again.stderr  # and still read for progress


def test_a_terminal_gets_a_live_block_and_keeps_the_jobs_output(followed, ray_cluster_home):
    """Through a pseudo-terminal, as a user at a terminal sees it: no events, the last progress printed at the end."""
    controller, terminal = pty.openpty()
    env = cli_env(ray_cluster_home, COLUMNS="120", LINES="40", TERM="xterm-256color")
    process = subprocess.Popen([*rayjobs_command(), "logs", "--follow", followed["job_id"]], stdin=terminal,
                               stdout=terminal, stderr=terminal, env=env, close_fds=True)
    os.close(terminal)
    screen = bytearray()
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard, not a measurement
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the other end closed: the command is done
                break
            if not chunk:
                break
            screen += chunk
        elif process.poll() is not None:
            break
    os.close(controller)
    assert process.wait(timeout=HANG_GUARD_S) == 0
    text = screen.decode("utf-8", "replace")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "final loss" in plain
    assert "rayjobs-event" not in plain
    assert f"rayjobs: last progress: epoch {EPOCHS}/{EPOCHS} · loss " in plain



def test_a_failure_with_a_known_cause_is_named_with_what_to_do(rj, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import rayjobs_no_such_module\n")
    spec = tmp_path / "missing.yaml"
    spec.write_text(f"name: missing-module\nentrypoint: python train.py\nruntime_env:\n  working_dir: {code}\n")
    result = rj("submit", str(spec))
    assert result.returncode == 1, result.stderr
    why = [line for line in result.stderr.splitlines() if line.startswith("rayjobs: why: ")]
    assert why == ["rayjobs: why: A module is missing on the cluster: no module named 'rayjobs_no_such_module'. "
                   "Install it in the job's environment (runtime_env.pip, or the cluster's image); if it is your "
                   "own code, it must be inside runtime_env.working_dir or listed in runtime_env.py_modules"]
    job_id = re.search(r"submitted missing-module as (\S+)", result.stderr)[1]
    status = rj("status", job_id)
    assert status.returncode == 1
    assert "why:" in status.stdout and "no module named 'rayjobs_no_such_module'" in status.stdout
