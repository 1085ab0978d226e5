"""Progress of a job as it runs, on the session cluster: a Ray Train script that knows nothing of rayjobs.

The script (tests/data/scripts/plain_ray_train.py) is written like Ray's own examples: two workers,
``ray.train.report`` each epoch, a checkpoint from rank 0 (restarts within a job and their reasons are read
where a rank dies in every attempt, tests/test_diagnosis_cluster.py). Rank 1 hangs in the last epoch without
reporting it, so rank 0 waits in ``ray.train.report`` forever: the follower must call it a stall and show both
ranks' stacks, and leave the job running until the test stops it. One job is followed as a pipe shows it, then its
log is read again, exactly as written, through a pseudo-terminal, and by ``status``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import PLAIN_RAY_TRAIN, CliRun, cli_env, plain_train_spec, rayjobs_command, run_rayjobs
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

EPOCHS = 4


STALL_AFTER_S = 8
STALL = "is RUNNING but has printed nothing"


@pytest.fixture(scope="module")
def followed(ray_cluster, ray_cluster_home, tmp_path_factory) -> dict:
    """The script's job, followed by `rayjobs submit` writing to pipes until it stalls; then stopped."""
    directory = tmp_path_factory.mktemp("plain-train")
    spec = plain_train_spec(directory, "plain-train", f"--epochs {EPOCHS} --epoch-s 0.2 --hang-at-epoch {EPOCHS}",
                            policy=f"stall_after_s: {STALL_AFTER_S}\nrecord_path: {directory / 'records'}\n"
                                   "record_every_s: 1\n")
    run = CliRun(["submit", str(spec)], cli_env(ray_cluster_home))
    try:
        # A slow start may be called a stall too; the one this test is about comes after the last report.
        run.wait_for_stderr(f"rayjobs: epoch {EPOCHS - 1}/{EPOCHS}", timeout_s=HANG_GUARD_S * 3)
        wait_for_condition(lambda: STALL in run.stderr.split(f"rayjobs: epoch {EPOCHS - 1}/{EPOCHS}", 1)[1],
                           timeout_s=HANG_GUARD_S)
        job_id = run.job_id()
        stacks = run_rayjobs("stack", job_id, home=ray_cluster_home)
        # The dashboard samples each process's CPU and memory every few seconds: wait for a sample of both ranks.
        status = wait_for_condition(lambda: _with_process_stats(run_rayjobs("status", job_id, "--output", "json",
                                                                            home=ray_cluster_home)),
                                    timeout_s=HANG_GUARD_S, interval_s=1)
        status_text = run_rayjobs("status", job_id, home=ray_cluster_home)
        stopped = run_rayjobs("stop", job_id, "--wait", home=ray_cluster_home)
        assert stopped.returncode == 0, stopped.stderr
        code = run.finish()
    finally:
        if run.process.poll() is None:
            run.process.kill()
    return {"code": code, "stdout": run.stdout, "stderr": run.stderr, "job_id": job_id, "stacks": stacks,
            "records": directory / "records", "status": status, "status_text": status_text}


def _with_process_stats(status: subprocess.CompletedProcess) -> subprocess.CompletedProcess | None:
    """``status`` if its JSON has a CPU figure for every worker of a training run, else None."""
    runs = json.loads(status.stdout).get("train_runs") or [] if status.returncode == 0 else []
    workers = [worker for run in runs for worker in run["workers"]]
    return status if workers and all(worker["cpu_percent"] is not None for worker in workers) else None


def test_a_plain_ray_train_script_shows_epochs_metrics_and_eta_line_by_line(followed):
    assert followed["code"] == 3, followed["stderr"][-3000:]  # STOPPED, by the test, after the stall
    progress = [line.removeprefix("rayjobs: ") for line in followed["stderr"].splitlines()
                if line.startswith("rayjobs: ") and ("training" in line or re.match(r"rayjobs: epoch \d", line))]
    assert progress[0] == f"training started: 2 workers, {EPOCHS} epochs, max_failures 1"
    assert progress[1] == "training attempt 1: 2 workers on 1 node"
    epochs = [line for line in progress if line.startswith("epoch ")]
    assert [int(re.match(r"epoch (\d+)", line)[1]) for line in epochs] == list(range(1, EPOCHS))
    assert epochs[-1].startswith(f"epoch {EPOCHS - 1}/{EPOCHS} · loss ")
    assert "ETA" in epochs[-1] and "checkpoint saved" in epochs[-1]

    # The job's own output stays on stdout, without the events, Ray's chatter or colour codes.
    assert "rayjobs-event" not in followed["stdout"] + followed["stderr"]
    assert "Reporting training result" not in followed["stdout"]
    assert "\x1b[" not in followed["stdout"] + followed["stderr"]


def test_a_hang_is_called_a_stall_with_every_ranks_stack_and_the_job_is_left_running(followed):
    stderr = followed["stderr"].split(f"rayjobs: epoch {EPOCHS - 1}/{EPOCHS}", 1)[1]
    warning = next(line for line in stderr.splitlines() if STALL in line)
    assert f"(stall_after_s {STALL_AFTER_S})" in warning and "it is left running" in warning
    shown = stderr.split(warning, 1)[1]
    # One line per rank, in the script's own code: rank 1 asleep where it hangs, rank 0 further on,
    # waiting for rank 1 in a collective (DDP's gradient all-reduce, or the report); the whole stacks are kept.
    rank0 = next(line for line in shown.splitlines() if line.startswith("rayjobs:   rank 0: "))
    rank1 = next(line for line in shown.splitlines() if line.startswith("rayjobs:   rank 1: "))
    assert "(train.py:" in rank0, shown[-3000:]
    hang_line = next(number for number, line in enumerate(PLAIN_RAY_TRAIN.read_text().splitlines(), start=1)
                     if "time.sleep(3600)" in line)
    assert rank1.startswith(f"rayjobs:   rank 1: train_func (train.py:{hang_line})"), shown[-3000:]
    assert "--- rank" not in shown and "Thread " not in shown
    assert stderr.count(STALL) == 1  # one warning per silence
    # The job was still running when the user (the test) stopped it.
    assert "STOPPED" in stderr

    stacks = followed["stacks"]
    assert stacks.returncode == 0, stacks.stderr
    assert "--- driver (pid" in stacks.stdout and "--- rank 0 (pid" in stacks.stdout
    assert "train_func" in stacks.stdout


def test_the_saved_log_is_printed_exactly_and_following_it_again_replays_the_progress(followed, rayjobs_cli):
    job_id = followed["job_id"]
    raw = rayjobs_cli("logs", job_id)
    assert raw.returncode == 0
    # As written: the events are in the log itself (start, attempt, and the reports of epochs before the hang).
    assert raw.stdout.count("rayjobs-event ") >= (EPOCHS - 1) + 2

    status = rayjobs_cli("status", job_id)
    assert re.search(rf"^progress: +epoch {EPOCHS - 1}/{EPOCHS} · loss \d", status.stdout, re.MULTILINE), \
        status.stdout
    assert re.search(r"^training attempts: +1, 0 restarts$", status.stdout, re.MULTILINE), status.stdout

    again = rayjobs_cli("logs", "--follow", job_id, "--raw")
    assert again.returncode == 3  # the job's outcome: STOPPED
    assert "rayjobs-event " in again.stdout  # --raw: the log as written
    assert f"rayjobs: epoch {EPOCHS - 1}/{EPOCHS}" in again.stderr  # and still read for progress


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
    assert process.wait(timeout=HANG_GUARD_S) == 3  # the job's outcome: STOPPED
    text = screen.decode("utf-8", "replace")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert f"Running entrypoint for job {followed['job_id']}" in plain  # the log's own lines scroll above the block
    assert "rayjobs-event" not in plain
    assert f"rayjobs: last progress: epoch {EPOCHS - 1}/{EPOCHS} · loss " in plain



def test_status_shows_ray_trains_runs_with_each_workers_node_cpu_and_memory(followed):
    """While the job hangs: Ray Train's state API (turned on with the progress channel) has both workers."""
    assert followed["status"].returncode == 0, followed["status"].stderr
    document = json.loads(followed["status"].stdout)
    assert document["train_runs_error"] is None
    (run,) = document["train_runs"]
    assert (run["name"], run["status"], run["attempts"]) == ("plain", "RUNNING", 1)
    assert [worker["rank"] for worker in run["workers"]] == [0, 1]
    for worker in run["workers"]:
        assert worker["node_ip"] == "127.0.0.1" and worker["state"] == "ALIVE" and worker["pid"] > 0
        assert worker["cpu_percent"] >= 0 and worker["memory_rss_bytes"] > 10 * 2**20 and worker["gpus"] == []
    text = followed["status_text"].stdout
    assert "training runs:\n  plain: RUNNING, attempt 1 running" in text, text
    assert re.search(r"^    rank 1 · node 127\.0\.0\.1 \(\w{8}\) · pid \d+ · ALIVE · CPU \d+% · memory \d+ MiB$",
                     text, re.MULTILINE), text


def test_the_job_keeps_its_own_record_log_events_and_stacks(followed, rayjobs_cli):
    """The script keeps its run record with nobody asking (it names no storage of its own: record_path)."""
    job_id = followed["job_id"]
    listed = rayjobs_cli("runs", str(followed["records"]), "--output", "json")
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)
    assert (run["run"], run["status"], run["attempts"]) == (f"plain-train-{job_id}", "STOPPED", 1)
    assert run["iterations"] == EPOCHS - 1 and "loss" in run["metrics"]

    run_dir = run["location"]
    saved, live = rayjobs_cli("logs", run_dir), rayjobs_cli("logs", job_id)
    assert saved.returncode == 0 and saved.stdout == live.stdout, "the record holds the driver log as written"

    shown = json.loads(rayjobs_cli("show", run_dir, "--output", "json").stdout)
    assert shown["cluster"] == {"nodes": 1, "cpus": 2.0, "gpus": 0}
    assert shown["spec"]["entrypoint"].startswith("python train.py --storage")
    assert shown["code"]["working_dir_package"].startswith("_ray_pkg_") and shown["code"]["git"] is None
    assert shown["versions"]["ray"] and shown["versions"]["torch"]
    assert shown["attempts"][0]["submission_id"] == job_id

    # One file per stall warning: the hang's, last (a slow start on a loaded machine may have had one before).
    stacks = sorted((Path(run_dir) / "run-record" / "stacks").iterdir())
    assert stacks and "train_func (train.py:" in stacks[-1].read_text()
    kept = [line for line in followed["stderr"].splitlines() if line.startswith("rayjobs: stacks kept in the run")]
    assert kept == [f"rayjobs: stacks kept in the run record: {path}" for path in stacks]
