"""The wrapper around every job at its edges: a kill, a stop that lands as the entrypoint starts, storage that never answers.

Each runs the real keeper (``python -m rayjobs_agent.supervisor``) as Ray's job supervisor does, in a session of
its own, on a real process tree.
"""

from __future__ import annotations

import pytest

import json
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from runner.follow.messages import summary_line
from runner.errors import ExitCode
from runner.records.store import Folder, read_run
from rayjobs_agent.retries import ENTRYPOINT_FAILED, Failure, matches
from tests.support.notify_receivers import webhook_receiver
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.test_record import config_for, keeper_env, python_command, run_keeper


def _kill_self(signum: int) -> str:
    return f"import os\nprint('about to be killed', flush=True)\nos.kill(os.getpid(), {signum})"


def test_an_entrypoint_killed_by_sigkill_is_named_and_the_keeper_dies_of_the_same_signal(tmp_path):
    log = tmp_path / "log"
    # `exec`: the shell gives way to the script, so the keeper's own child is the process killed.
    keeper = run_keeper(f"exec {python_command(_kill_self(signal.SIGKILL))}", log, keeper_env(config_for(tmp_path / "run")))
    keeper.wait(timeout=HANG_GUARD_S)
    text = log.read_text()
    assert keeper.returncode == -signal.SIGKILL, text
    assert "Traceback" not in text
    assert "the entrypoint was killed by signal 9 (SIGKILL), often the kernel's out-of-memory killer" in text
    document = read_run(Folder(str(tmp_path / "run")))
    assert (document["status"], document["attempts"][0]["exit_code"]) == ("FAILED", -9)


def test_a_command_killed_under_a_shell_that_survives_is_named_from_its_exit_code(tmp_path):
    log = tmp_path / "log"
    keeper = run_keeper(f"{python_command(_kill_self(signal.SIGKILL))}; exit $?", log,
                        keeper_env(config_for(tmp_path / "run")))
    keeper.wait(timeout=HANG_GUARD_S)
    assert keeper.returncode == 137
    assert ("the entrypoint ended with exit code 137, which a shell gives a command killed by signal 9 (SIGKILL)"
            in log.read_text())


def test_retry_on_an_exit_code_matches_both_spellings_of_a_kill():
    def failed(code: int) -> Failure:
        return Failure(ENTRYPOINT_FAILED, code)

    assert matches(failed(-9), ["exit_code:137"]) == "exit_code:137"
    assert matches(failed(137), ["exit_code:-9"]) == "exit_code:-9"
    assert matches(failed(-15), ["exit_code:137"]) is None
    assert matches(failed(1), ["exit_code:137"]) is None


def test_the_summary_of_a_killed_job_says_by_what():
    info = {"status": "FAILED", "start_time": 1000, "end_time": 4000, "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
            "message": "Job entrypoint command failed with exit code -9, last available logs ...", "driver_exit_code": -9}
    assert summary_line("raysubmit_x", ExitCode.FAILED, info).endswith(
        "failed with exit code -9: the entrypoint was killed by signal 9 (SIGKILL), often the kernel's out-of-memory "
        "killer")


STARTS = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("started")
time.sleep(30)
pathlib.Path(sys.argv[1]).write_text("ran to its end")
"""


def _keeper_stopped_at(moment: str, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """The keeper with a stop (SIGTERM to its process group, as Ray sends it) landing at ``moment`` of its start:
    ``before`` it looks whether it was stopped (as it reads its queue's admission), or ``during`` the entrypoint's
    start (after that look)."""
    marker, log = tmp_path / "marker", tmp_path / "log"
    entrypoint = f"{shlex.quote(sys.executable)} -c {shlex.quote(STARTS)} {shlex.quote(str(marker))}"
    driver = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        from rayjobs_agent import supervisor
        real = {'supervisor.queue_admission' if moment == 'before' else 'subprocess.Popen'}
        def stopped_now(*args, **kwargs):
            os.killpg(os.getpgrp(), signal.SIGTERM)  # Ray's stop, to the whole process group
            return real(*args, **kwargs)
        {'supervisor.queue_admission' if moment == 'before' else 'supervisor.subprocess.Popen'} = stopped_now
        sys.exit(supervisor.main(["--", {entrypoint!r}]))
    """)
    env = keeper_env(config_for(tmp_path / "run"))
    with open(log, "ab") as out:
        keeper = subprocess.Popen([sys.executable, "-c", driver], stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    return keeper, marker, log


def test_a_stop_that_lands_before_the_entrypoint_starts_means_it_never_starts(tmp_path):
    keeper, marker, log = _keeper_stopped_at("before", tmp_path)
    keeper.wait(timeout=HANG_GUARD_S)
    assert not marker.exists(), log.read_text()
    assert keeper.returncode == 128 + signal.SIGTERM
    assert read_run(Folder(str(tmp_path / "run")))["status"] == "STOPPED"


def test_a_stop_that_lands_while_the_entrypoint_starts_reaches_the_entrypoint(tmp_path):
    keeper, marker, log = _keeper_stopped_at("during", tmp_path)
    keeper.wait(timeout=HANG_GUARD_S)
    assert not marker.exists() or marker.read_text() != "ran to its end", log.read_text()
    assert read_run(Folder(str(tmp_path / "run")))["status"] == "STOPPED"


@pytest.mark.processes
def test_storage_that_never_answers_delays_neither_the_notification_nor_the_jobs_end(tmp_path, aws_env, s3_endpoint):
    """The end of a job with its record in an S3 endpoint that takes connections and never answers (a black hole)."""
    from tests.support.fault_proxy import FaultProxy
    from tests.support.s3_server import create_bucket
    from rayjobs_agent import notify, supervisor

    create_bucket(s3_endpoint, "blackhole")
    flag = tmp_path / "go-on"
    job = python_command(f"""
        import pathlib, time
        print("running", flush=True)
        while not pathlib.Path({str(flag)!r}).exists():
            time.sleep(0.05)
        print("done", flush=True)
    """)
    with webhook_receiver() as hook, FaultProxy(int(s3_endpoint.rsplit(":", 1)[1])) as proxy:
        env = keeper_env(config_for("s3://blackhole/runs/one"))
        env.update(aws_env, AWS_ENDPOINT_URL=proxy.address)
        env[notify.NOTIFY_ENV_VAR] = json.dumps({"targets": [{"url": hook.url(), "on": ["succeeded"]}],
                                                 "attempts": 1})
        log = tmp_path / "log"
        keeper = run_keeper(job, log, env)
        wait_for_condition(lambda: b"running" in log.read_bytes(), timeout_s=HANG_GUARD_S)
        proxy.stall(3600)  # from now on, storage takes every connection and answers none
        flag.touch()
        keeper.wait(timeout=HANG_GUARD_S)
        text = log.read_text()
        assert keeper.returncode == 0, text
        assert [body["title"] for _, body in hook.received] == ["rayjobs: rec SUCCEEDED"]
        assert f"did not finish within {supervisor.END_DEADLINE_S:g}s" in text


def test_a_secret_of_the_nodes_own_environment_never_reaches_the_record(tmp_path):
    from runner.records.store import attempt_log

    log = tmp_path / "log"
    env = keeper_env(config_for(tmp_path / "run"))
    env["AWS_SECRET_ACCESS_KEY"] = "node-secret-value-1234"  # the node's, as `cluster up` passes it on
    keeper = run_keeper(python_command("import os\nprint('key:', os.environ['AWS_SECRET_ACCESS_KEY'], flush=True)"),
                        log, env)
    keeper.wait(timeout=HANG_GUARD_S)
    kept = attempt_log(Folder(str(tmp_path / "run")), "raysubmit_one")
    assert b"key: ***" in kept and b"node-secret-value-1234" not in kept
