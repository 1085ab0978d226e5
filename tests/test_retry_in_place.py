"""Retries in place: the agent beside the job (``rayjobs_agent.supervisor``) decides why an attempt failed and runs
the entrypoint again inside the same job, whoever follows it. Run as Ray runs an entrypoint (a shell command
whose output is the driver log file), with the retry policy in the variable the client sets; no Ray here."""

from __future__ import annotations

import pytest

import json
import signal
from pathlib import Path

from rayjobs_agent.retries import RetryPolicy
from rayjobs_agent.vocabulary import decode
from rayjobs_agent.wire import NOTIFY_ENV_VAR, RETRY_ENV_VAR, WATCH_ENV_VAR
from runner.follow.log_view import diagnosis_of, read_log
from runner.records.store import Folder, read_run
from tests.support.notify_receivers import webhook_receiver
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.test_record import config_for, keeper_env, python_command, run_keeper

# Fails with a Gloo collective timeout on its first run and succeeds on the next (a marker file says which).
FLAKY = """
import pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("failed once")
    print("(RayTrainWorker pid=7) [E ProcessGroupGloo.cpp:143] Timed out waiting 1800000ms for recv operation", flush=True)
    sys.exit(1)
print("second attempt: done", flush=True)
"""
MISSING_MODULE = "import no_such_module_anywhere"


def _policy(max_retries: int, *retry_on: str, initial_s: float = 0.0) -> str:
    return RetryPolicy(max_retries, retry_on, initial_s, max(initial_s, 1.0)).to_variable()


def _run(tmp_path: Path, entrypoint: str, policy: str, **env: str) -> tuple[int, str, dict]:
    log = tmp_path / "log"
    environ = keeper_env(config_for(tmp_path / "run"))
    environ.update({RETRY_ENV_VAR: policy, **env})
    keeper = run_keeper(entrypoint, log, environ)
    keeper.wait(timeout=HANG_GUARD_S)
    return keeper.returncode, log.read_text(), read_run(Folder(str(tmp_path / "run")))


def _events(text: str, kind: str) -> list[dict]:
    return [event for line in text.splitlines() if (event := decode(line)) is not None and event.get("event") == kind]


@pytest.mark.processes
def test_a_cause_in_retry_on_runs_the_entrypoint_again_in_the_same_job_and_the_record_keeps_both_attempts(tmp_path):
    entrypoint = f"{python_command(FLAKY)} {tmp_path / 'marker'}"
    code, text, document = _run(tmp_path, entrypoint, _policy(2, "collective_timeout"))
    assert code == 0, text
    assert "second attempt: done" in text
    assert "attempt 1 failed with collective_timeout (in retry_on); running attempt 2 of 3" in text
    [cause] = _events(text, "cause")
    assert (cause["attempt"], cause["exit_code"], cause["cause"]) == (1, 1, "collective_timeout")
    decided, started = _events(text, "retry")
    assert (decided["attempt"], decided["attempts"], decided["cause"], decided["state"]) == \
        (2, 3, "collective_timeout", "waiting")
    assert (started["attempt"], started["state"]) == (2, "started")
    first, second = document["attempts"]
    assert (first["attempt"], first["status"], first["exit_code"], first["cause"]["cause"]) == \
        (1, "FAILED", 1, "collective_timeout")
    assert (second["attempt"], second["status"], second["cause"]) == (2, "SUCCEEDED", None)
    assert first["submission_id"] == second["submission_id"]  # in place: one Ray job
    assert document["status"] == "SUCCEEDED" and document["cause"] is None


def test_a_missing_module_is_never_run_again_whatever_the_spec_says_and_the_client_shows_the_agents_cause(tmp_path):
    code, text, document = _run(tmp_path, python_command(MISSING_MODULE),
                                _policy(3, "JOB_ENTRYPOINT_COMMAND_ERROR", "exit_code:1"))
    assert code == 1
    assert ("not retried, although max_retries is 3: the failure is module_missing, and a missing module is missing "
            "again in the next attempt") in text
    assert not _events(text, "retry")
    [attempt] = document["attempts"]
    assert attempt["cause"]["cause"] == document["cause"]["cause"] == "module_missing"
    # What `rayjobs status` and the follower show is this decision, read back from the log.
    progress, reader = read_log(text)
    assert progress.decided and diagnosis_of(progress, reader).cause == "module_missing"


def test_retries_stop_at_max_retries_and_the_job_ends_with_the_last_attempts_code(tmp_path):
    code, text, document = _run(tmp_path, python_command("import sys; print('failing', flush=True); sys.exit(3)"),
                                _policy(2, "exit_code:3"))
    assert code == 3
    assert [attempt["status"] for attempt in document["attempts"]] == ["FAILED"] * 3
    assert [(event["attempt"], event["state"]) for event in _events(text, "retry")] == \
        [(2, "waiting"), (2, "started"), (3, "waiting"), (3, "started")]
    assert [event["cause"] for event in _events(text, "cause")] == ["unknown"] * 3
    assert text.count("failing\n") == 3


def test_a_failure_outside_retry_on_runs_once(tmp_path):
    code, text, document = _run(tmp_path, python_command("import sys; sys.exit(4)"), _policy(2, "exit_code:3"))
    assert code == 4 and len(document["attempts"]) == 1 and not _events(text, "retry")


@pytest.mark.processes
def test_a_stop_during_the_backoff_starts_no_further_attempt_and_leaves_no_attempt_that_never_ran(tmp_path):
    """The retry is decided and said before the wait; the attempt it announces exists only once it starts."""
    log, run = tmp_path / "log", Folder(str(tmp_path / "run"))
    with webhook_receiver() as hook:
        environ = keeper_env(config_for(tmp_path / "run"))
        environ[RETRY_ENV_VAR] = _policy(2, "exit_code:3", initial_s=600.0)
        environ[NOTIFY_ENV_VAR] = json.dumps({"targets": [{"url": hook.url(), "on": ["retry", "stopped"]}]})
        keeper = run_keeper(python_command("import sys; sys.exit(3)"), log, environ)
        [decided] = wait_for_condition(lambda: _events(log.read_text(), "retry"), timeout_s=HANG_GUARD_S)
        assert "attempt 1 failed with exit_code:3 (in retry_on); running attempt 2 of 3 in 600s" in log.read_text()
        # The record as it is written during the wait: the failed attempt is the last one, and alive.
        waiting = wait_for_condition(lambda: (document := read_run(run)) and
                                     document["attempts"][-1]["updated"] > decided["time"] and document,
                                     timeout_s=HANG_GUARD_S)
        assert (waiting["status"], [(a["attempt"], a["status"]) for a in waiting["attempts"]]) == \
            ("RUNNING", [(1, "FAILED")])
        keeper.send_signal(signal.SIGTERM)  # as Ray's stop reaches the process group
        keeper.wait(timeout=HANG_GUARD_S)
        titles = [body["title"] for _, body in hook.received]
    text = log.read_text()
    document = read_run(run)
    assert document["status"] == "STOPPED", text
    [attempt] = document["attempts"]
    assert (attempt["attempt"], attempt["status"], attempt["exit_code"]) == (1, "FAILED", 3)
    assert "stopped during the wait before attempt 2, which never started" in document["notes"]
    assert "rayjobs: stopped during the wait before attempt 2, which never started" in text
    assert [event["state"] for event in _events(text, "retry")] == ["waiting"]
    assert titles == ["rayjobs: rec STOPPED"], "no word of an attempt that never started"
    # What `rayjobs status` counts from the log: no attempt ran in place.
    progress, _ = read_log(text)
    assert progress.retries == [] and progress.retry_waiting["attempt"] == 2


@pytest.mark.processes
def test_no_stall_is_said_while_the_job_waits_out_its_retry_backoff(tmp_path):
    """A backoff longer than the stall limit is silence by design, not a stall (a stall during an attempt is)."""
    entrypoint = f"{python_command(FLAKY)} {tmp_path / 'marker'}"
    code, text, document = _run(tmp_path, entrypoint, _policy(1, "collective_timeout", initial_s=6.0),
                                **{WATCH_ENV_VAR: json.dumps({"stall_after_s": 2})})
    assert code == 0, text
    decided, started = _events(text, "retry")
    assert not [stall for stall in _events(text, "stall") if decided["time"] <= stall["time"] <= started["time"]], text
    assert "attempt 2 of 2 starts" in text
    assert [attempt["status"] for attempt in document["attempts"]] == ["FAILED", "SUCCEEDED"]


@pytest.mark.processes
def test_the_notification_names_the_cause_the_agent_decided(tmp_path):
    with webhook_receiver() as hook:
        notify = json.dumps({"targets": [{"url": f"json://127.0.0.1:{hook.port}/hook", "on": ["failed", "retry"]}]})
        code, text, _ = _run(tmp_path, python_command(MISSING_MODULE), _policy(0), **{NOTIFY_ENV_VAR: notify})
        wait_for_condition(lambda: hook.received)
    assert code == 1
    [(_, body)] = hook.received
    [cause] = _events(text, "cause")
    assert f"cause: module_missing: {cause['text']}" in body["message"]
    assert "no module named 'no_such_module_anywhere'" in cause["text"]


@pytest.mark.processes
def test_each_retry_in_place_is_notified(tmp_path):
    with webhook_receiver() as hook:
        notify = json.dumps({"targets": [{"url": f"json://127.0.0.1:{hook.port}/hook", "on": ["retry", "succeeded"]}]})
        entrypoint = f"{python_command(FLAKY)} {tmp_path / 'marker'}"
        code, _, _ = _run(tmp_path, entrypoint, _policy(1, "collective_timeout"), **{NOTIFY_ENV_VAR: notify})
        wait_for_condition(lambda: len(hook.received) >= 2)
    assert code == 0
    titles = [body["title"] for _, body in hook.received]
    assert titles == ["rayjobs: rec retried", "rayjobs: rec SUCCEEDED"]
    assert hook.received[0][1]["message"].startswith("rec: attempt 1 failed (collective_timeout, exit code 1); "
                                                      "attempt 2 has started")


def test_a_backoff_without_end_that_reaches_the_agent_runs_the_job_once_instead_of_holding_it_forever(tmp_path):
    """The spec refuses it; a job given one by hand (a RayJob written without rayjobs) must not wait forever."""
    endless = json.dumps({"max_retries": 2, "retry_on": ["exit_code:3"], "initial_s": float("inf"),
                          "max_s": float("inf")})
    code, text, document = _run(tmp_path, python_command("import sys; sys.exit(3)"), endless)
    assert code == 3 and len(document["attempts"]) == 1 and not _events(text, "retry"), text
    assert "the retry policy could not be read (retry_backoff.initial_s must be a number of seconds " \
           "from 0 to 86400, not inf); a failed attempt is not run again" in text
