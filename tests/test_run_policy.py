"""The run policy (``runner.run``) called from Python against a scripted client: submit, attach, follow, retry."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rayjobs_agent.vocabulary import EVENT_MARKER
from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_PARENT, METADATA_SPEC_HASH
from jobs.loader import load_spec
from jobs.submission import build_submission
from runner.errors import BadInput, ClusterUnreachable
from runner.errors import ExitCode
from runner.run import retry_policy
from runner.run.lifecycle import RunOptions, RunOutcome, follow_job, run_with_retries, submit_or_attach
from runner.client.submission import SubmitInterrupted
from tests.support.fake_cluster import AN_HOUR_AGO_MS, FAKE_ADDRESS, FakeClient, Script, speed_up_following

HINT = f" --address {FAKE_ADDRESS}"


class FakeClock:
    """Stands in for the wait before a retry: records each wait and moves its own time on instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    speed_up_following(monkeypatch)
    fake = FakeClock()
    monkeypatch.setattr(retry_policy, "sleep", fake.sleep)
    return fake


class Run:
    """One call of ``run_with_retries`` with its two output streams."""

    def __init__(self, tmp_path: Path, client: FakeClient, body: str = "", **options) -> None:
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(f"name: demo\nentrypoint: python job.py\n{body}")
        self.loaded = load_spec(spec_file)
        self.client = client
        self.logs, self.notes = io.StringIO(), io.StringIO()
        self.result = run_with_retries(client, self.loaded,
                                       options=RunOptions(**options), notes=self.notes, logs_out=self.logs)

    @property
    def note_lines(self) -> list[str]:
        return self.notes.getvalue().splitlines()


def test_a_job_that_succeeds(tmp_path):
    client = FakeClient(Script(["RUNNING", "SUCCEEDED"], log=b"hello\nworld\n"))
    run = Run(tmp_path, client)
    assert (run.result.exit_code, run.result.outcome, run.result.attempts) == \
        (ExitCode.SUCCEEDED, RunOutcome.SUCCEEDED, ["raysubmit_fake1"])
    assert run.result.job_id == "raysubmit_fake1" and run.result.info["status"] == "SUCCEEDED"
    assert client.calls[:3] == [("submit", None), ("get_job", "raysubmit_fake1"), ("get_job", "raysubmit_fake1")]
    assert not client.called("stop_job")
    assert run.logs.getvalue() == "hello\nworld\n"
    assert run.note_lines[0] == f"rayjobs: submitted demo as raysubmit_fake1 to {FAKE_ADDRESS} (--address)"
    assert "rayjobs: job raysubmit_fake1 is RUNNING" in run.note_lines
    assert run.note_lines[-1] == "rayjobs: job raysubmit_fake1 SUCCEEDED in 1.5s"
    assert run.result.summary == "job raysubmit_fake1 SUCCEEDED in 1.5s"


def test_a_job_that_fails_shows_its_last_log_lines(tmp_path):
    log = b"".join(b"line %d\n" % i for i in range(15))
    client = FakeClient(Script(["RUNNING", "FAILED"], log=log, error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
                               message="Job entrypoint command failed with exit code 3", driver_exit_code=3))
    run = Run(tmp_path, client, "max_retries: 2\n")  # exit codes are not retried by default
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.FAILED, RunOutcome.FAILED)
    assert len(client.submitted) == 1
    assert ("rayjobs: job raysubmit_fake1 FAILED in 1.5s: JOB_ENTRYPOINT_COMMAND_ERROR Job entrypoint command "
            "failed with exit code 3") in run.note_lines
    tail = run.note_lines[run.note_lines.index("rayjobs: last lines of its log:") + 1:]
    assert tail == [f"  | line {i}" for i in range(5, 15)]


def test_a_job_that_is_stopped(tmp_path):
    run = Run(tmp_path, FakeClient(Script(["RUNNING", "STOPPED"])))
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.STOPPED, RunOutcome.STOPPED)


def test_summaries_can_be_left_to_the_caller(tmp_path):
    run = Run(tmp_path, FakeClient(Script(["RUNNING", "SUCCEEDED"])), summaries=False)
    assert run.result.summary == "job raysubmit_fake1 SUCCEEDED in 1.5s"
    assert not any("SUCCEEDED" in line for line in run.note_lines)


def _failing(exit_code: int = 3) -> Script:
    return Script(["RUNNING", "FAILED"], error_type="JOB_ENTRYPOINT_COMMAND_ERROR", driver_exit_code=exit_code,
                  message=f"Job entrypoint command failed with exit code {exit_code}")


def _lost() -> Script:
    """A job lost whole: its supervisor died, so no agent inside it was left to decide anything."""
    return Script(["RUNNING", "FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED", message="Job supervisor actor died")


def test_a_job_lost_whole_is_submitted_again_by_the_clusters_keeper_and_followed_here(tmp_path):
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    run = Run(tmp_path, client, "max_retries: 2\n")
    assert (run.result.exit_code, run.result.attempts) == \
        (ExitCode.SUCCEEDED, ["raysubmit_fake1", "raysubmit_fake1-attempt2"])
    first, second = client.submitted
    assert first["metadata"][METADATA_ATTEMPT] == "1" and METADATA_PARENT not in first["metadata"]
    assert second["metadata"][METADATA_ATTEMPT] == "2"
    assert second["metadata"][METADATA_PARENT] == "raysubmit_fake1"
    assert second["metadata"][METADATA_SPEC_HASH] == first["metadata"][METADATA_SPEC_HASH]
    assert ("rayjobs: attempt 1 failed with JOB_SUPERVISOR_ACTOR_DIED (in retry_on); the cluster submits attempt 2 "
            "of 3 in 10s (retry_backoff)" in run.note_lines)
    # The cluster must have a keeper for a job it may submit again: one order makes sure, without waiting.
    assert [order["verb"] for order in client.orders] == ["ensure"]
    # The client submits the first attempt alone (after its pre-flight); the keeper submits the second.
    assert [call[1] for call in client.called("submit") if not (call[1] or "").startswith("rayjobs-order-")] == [None]


def test_the_next_attempt_of_a_fixed_submission_id_gets_an_attempt_suffix(tmp_path):
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    run = Run(tmp_path, client, "submission_id: nightly-1\nmax_retries: 1\n")
    assert run.result.attempts == ["nightly-1", "nightly-1-attempt2"]
    assert [request["submission_id"] for request in client.submitted] == ["nightly-1", "nightly-1-attempt2"]


def test_retries_give_up_after_max_retries(tmp_path):
    client = FakeClient(_lost(), _lost(), _lost())
    run = Run(tmp_path, client, "max_retries: 1\n")
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.FAILED, RunOutcome.FAILED)
    assert run.result.attempts == ["raysubmit_fake1", "raysubmit_fake1-attempt2"]
    assert len(client.submitted) == 2
    assert sum("the cluster submits attempt" in line for line in run.note_lines) == 1


def test_a_job_without_retries_asks_nothing_of_the_clusters_keeper(tmp_path):
    client = FakeClient(_lost())
    run = Run(tmp_path, client)
    assert run.result.exit_code == ExitCode.FAILED and client.orders == []


def test_a_failure_outside_retry_on_is_not_retried(tmp_path):
    client = FakeClient(_lost(), Script())
    run = Run(tmp_path, client, "max_retries: 2\nretry_on: ['exit_code:3']\n")
    assert run.result.exit_code == ExitCode.FAILED and run.result.attempts == ["raysubmit_fake1"]


@pytest.mark.parametrize("retry_on", ["['exit_code:3']", "[JOB_ENTRYPOINT_COMMAND_ERROR]", "[collective_timeout]"])
def test_a_failed_entrypoint_is_never_submitted_again_by_the_client(tmp_path, retry_on):
    """The agent beside the entrypoint decided about it (and ran it again in place when it could): a second
    decision here would run it twice as often as the spec says, and only for those who watch."""
    client = FakeClient(_failing_with(COLLECTIVE_TIMEOUT_LOG, exit_code=3), Script(["RUNNING", "SUCCEEDED"]))
    run = Run(tmp_path, client, f"max_retries: 2\nretry_on: {retry_on}\n")
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.FAILED, ["raysubmit_fake1"])
    assert not any("submits attempt" in line for line in run.note_lines)


def test_same_spec_under_a_fixed_id_attaches(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: demo\nentrypoint: python job.py\nsubmission_id: fixed-1\n")
    submission = build_submission(load_spec(spec_file))
    client = FakeClient()
    client.existing("fixed-1", Script(["RUNNING", "SUCCEEDED"], log=b"from before\n"), submission["metadata"])
    notes = io.StringIO()
    assert submit_or_attach(client, submission, name="demo", notes=notes) == "fixed-1"
    assert not client.called("submit")
    assert notes.getvalue().startswith("rayjobs: job fixed-1 was already submitted from this spec (")
    assert notes.getvalue().endswith("); attaching to it\n")


def test_attached_job_is_followed_to_its_end(tmp_path):
    client = FakeClient()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: demo\nentrypoint: python job.py\nsubmission_id: fixed-1\n")
    client.existing("fixed-1", Script(["RUNNING", "RUNNING", "SUCCEEDED"], log=b"from before\n"),
                    build_submission(load_spec(spec_file))["metadata"])
    run = Run(tmp_path, client, "submission_id: fixed-1\n")
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.SUCCEEDED, ["fixed-1"])
    assert run.logs.getvalue() == "from before\n"
    assert not client.called("submit")


def test_different_spec_under_a_fixed_id_is_a_conflict(tmp_path):
    client = FakeClient()
    client.existing("fixed-1", Script(), {METADATA_SPEC_HASH: "0123456789abcdef"})
    with pytest.raises(BadInput, match="submission_id 'fixed-1' is already taken by a job with different content "
                                       r"\(spec hash 0123456789abcdef, this spec [0-9a-f]{16}\)"):
        Run(tmp_path, client, "submission_id: fixed-1\n")
    assert not client.called("submit")


def test_job_timeout_stops_the_job(tmp_path):
    client = FakeClient(Script(["RUNNING"], start_time=AN_HOUR_AGO_MS))
    run = Run(tmp_path, client, "timeout_s: 5\n")
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.TIMEOUT, RunOutcome.TIMED_OUT)
    assert client.called("stop_job") == [("stop_job", "raysubmit_fake1")]
    assert "rayjobs: the job ran past its timeout_s of 5s; stopping the job" in run.note_lines
    assert run.result.summary.startswith("job raysubmit_fake1 STOPPED after ")
    assert run.result.summary.endswith(": the job ran past its timeout_s of 5s")


def test_start_timeout_stops_a_job_left_pending(tmp_path):
    client = FakeClient(Script(["PENDING"], start_time=AN_HOUR_AGO_MS))
    run = Run(tmp_path, client, "start_timeout_s: 3\nentrypoint_num_cpus: 2\n")
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.TIMEOUT, RunOutcome.TIMED_OUT)
    assert client.calls[0] == ("node_resources",)  # the pre-flight: 2 CPUs fit the fake's node
    assert client.called("stop_job") == [("stop_job", "raysubmit_fake1")]
    assert "still PENDING after 3s (start_timeout_s)" in run.result.summary
    assert "which asks for CPU 2" in run.result.summary and "The stop is queued" in run.result.summary


def test_lost_contact_gives_up_and_leaves_the_job_alone(tmp_path):
    client = FakeClient(Script(["RUNNING"], unreachable_from_poll=1))
    run = Run(tmp_path, client, give_up_after_s=0.05)
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.CLUSTER_UNREACHABLE, RunOutcome.STATE_UNKNOWN)
    assert not client.called("stop_job")
    assert any(line.startswith("rayjobs: lost contact with the cluster (cannot reach") for line in run.note_lines)
    assert "may still be running" in run.result.summary


def test_unreachable_cluster_at_submission_raises(tmp_path):
    client = FakeClient()
    client.submit_error = ClusterUnreachable("cannot reach the Ray dashboard at http://127.0.0.1:8265: refused")
    with pytest.raises(ClusterUnreachable, match="cannot reach"):
        Run(tmp_path, client)


def test_ctrl_c_while_following_detaches(tmp_path):
    client = FakeClient(Script(["RUNNING"], raise_on_poll={2: KeyboardInterrupt()}))
    run = Run(tmp_path, client)
    assert (run.result.exit_code, run.result.outcome) == (ExitCode.INTERRUPTED, RunOutcome.INTERRUPTED)
    assert run.result.attempts == ["raysubmit_fake1"] and run.result.followed is None
    assert not client.called("stop_job")
    assert run.note_lines[-4:] == [
        "rayjobs: interrupted: detached from job raysubmit_fake1, which keeps running on the cluster",
        f"rayjobs: follow it:  rayjobs logs --follow raysubmit_fake1{HINT}",
        f"rayjobs: its status: rayjobs status raysubmit_fake1{HINT}",
        f"rayjobs: stop it:    rayjobs stop raysubmit_fake1{HINT}",
    ]


def test_ctrl_c_while_following_with_stop_on_interrupt_stops(tmp_path):
    client = FakeClient(Script(["RUNNING"], raise_on_poll={2: KeyboardInterrupt()}))
    run = Run(tmp_path, client, stop_on_interrupt=True)
    assert run.result.exit_code == ExitCode.INTERRUPTED
    assert client.called("stop_job") == [("stop_job", "raysubmit_fake1")]
    assert run.note_lines[-2:] == [
        "rayjobs: interrupted: stopping job raysubmit_fake1 (--stop-on-interrupt)",
        f"rayjobs: stop requested; check with: rayjobs status raysubmit_fake1{HINT}",
    ]


def test_ctrl_c_before_the_job_request_submits_nothing(tmp_path):
    client = FakeClient()
    client.submit_error = SubmitInterrupted(None)
    run = Run(tmp_path, client)
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.INTERRUPTED, [])
    assert run.note_lines == ["rayjobs: interrupted: nothing was submitted"]


def test_ctrl_c_after_the_job_request_asks_the_cluster(tmp_path):
    client = FakeClient()
    client.interrupt_after_request = True
    run = Run(tmp_path, client)
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.INTERRUPTED, ["raysubmit_fake1"])
    assert client.calls[-1] == ("get_job", "raysubmit_fake1")
    assert run.note_lines == [
        f"rayjobs: interrupted: job raysubmit_fake1 was submitted and keeps running; follow it with "
        f"`rayjobs logs --follow raysubmit_fake1{HINT}`, stop it with `rayjobs stop raysubmit_fake1{HINT}`"]


def test_ctrl_c_after_a_job_request_the_cluster_did_not_take(tmp_path):
    client = FakeClient()
    client.submit_error = SubmitInterrupted("raysubmit_never")
    run = Run(tmp_path, client, stop_on_interrupt=True)
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.INTERRUPTED, [])
    assert not client.called("stop_job")
    assert run.note_lines == [
        "rayjobs: interrupted: nothing was submitted (the cluster has no job raysubmit_never; "
        f"`rayjobs status raysubmit_never{HINT}` checks again)"]


def test_without_waiting_it_returns_once_submitted(tmp_path):
    client = FakeClient()
    run = Run(tmp_path, client, "timeout_s: 60\n", wait=False)
    assert (run.result.exit_code, run.result.outcome, run.result.attempts) == \
        (ExitCode.SUCCEEDED, RunOutcome.SUBMITTED, ["raysubmit_fake1"])
    assert client.calls == [("submit", None)]
    assert run.note_lines[-1] == ("rayjobs: note: timeout_s and start_timeout_s are applied only while rayjobs follows "
                                  "the job (max_retries is applied on the cluster, followed or not)")


def test_follow_job_on_its_own(tmp_path):
    client = FakeClient()
    client.existing("raysubmit_other", Script(["RUNNING", "FAILED"], log=b"boom\n", error_type="X"), {})
    logs, notes = io.StringIO(), io.StringIO()
    result = follow_job(client, "raysubmit_other", log_tail_on_failure=False, notes=notes, logs_out=logs)
    assert (result.exit_code, result.attempts) == (ExitCode.FAILED, ["raysubmit_other"])
    assert logs.getvalue() == "boom\n"
    assert "last lines" not in notes.getvalue()


def test_backoff_doubles_each_retry_up_to_its_cap(tmp_path):
    client = FakeClient(*[_lost() for _ in range(5)])
    run = Run(tmp_path, client, "max_retries: 4\nretry_backoff: {initial_s: 2, max_s: 5}\n")
    assert run.result.exit_code == ExitCode.FAILED and len(run.result.attempts) == 5
    decided = [client.decisions[job_id] for job_id in run.result.attempts[:4]]
    assert [round(decision["due"] - decision["at"]) for decision in decided] == [2, 4, 5, 5]
    assert "rayjobs: attempt 3 failed with JOB_SUPERVISOR_ACTOR_DIED (in retry_on); the cluster submits attempt 4 of " \
        "5 in 5s (retry_backoff)" in run.note_lines


def test_backoff_schedule_and_its_defaults():
    from jobs.retry import RetryBackoff
    from rayjobs_agent.retries import RetryPolicy

    def schedule(backoff: RetryBackoff, retries: range) -> list[float]:
        return [RetryPolicy(7, (), backoff.initial_s, backoff.max_s).delay_s(retry) for retry in retries]

    assert schedule(RetryBackoff(), range(1, 8)) == [10, 20, 40, 80, 160, 300, 300]
    assert schedule(RetryBackoff(initial_s=0), range(1, 3)) == [0, 0]
    with pytest.raises(ValueError, match=r"max_s \(1\) is shorter than initial_s \(2\)"):
        RetryBackoff(initial_s=2, max_s=1)


def test_no_backoff_retries_at_once(tmp_path):
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    run = Run(tmp_path, client, "max_retries: 1\nretry_backoff: {initial_s: 0}\n")
    assert run.result.exit_code == ExitCode.SUCCEEDED
    assert "rayjobs: attempt 1 failed with JOB_SUPERVISOR_ACTOR_DIED (in retry_on); the cluster submits attempt 2 of 2" \
        in run.note_lines


def test_ctrl_c_while_waiting_for_the_next_attempt_detaches_and_the_cluster_goes_on(tmp_path, monkeypatch):
    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(retry_policy, "sleep", interrupted)
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    client.decisions_hidden_for_looks = 1  # the keeper has not published its decision yet
    run = Run(tmp_path, client, "max_retries: 1\n")
    assert (run.result.exit_code, run.result.attempts) == (ExitCode.INTERRUPTED, ["raysubmit_fake1"])
    assert "rayjobs: interrupted: detached from job raysubmit_fake1, which keeps running on the cluster" \
        in run.note_lines


def test_ctrl_c_with_stop_on_interrupt_while_waiting_for_the_next_attempt_submits_none(tmp_path, monkeypatch):
    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(retry_policy, "sleep", interrupted)
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    client.decisions_hidden_for_looks = 1
    client.in_backoff = True  # the keeper submits the next attempt after its backoff, not at once
    run = Run(tmp_path, client, "max_retries: 1\n", stop_on_interrupt=True)
    assert run.result.exit_code == ExitCode.INTERRUPTED
    assert [order["verb"] for order in client.orders] == ["ensure", "stop"]
    assert client.decisions["raysubmit_fake1"]["retry"] is False and len(client.submitted) == 1


def _failing_with(log: bytes, exit_code: int = 1) -> Script:
    return Script(["RUNNING", "FAILED"], log=log, error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
                  driver_exit_code=exit_code, message=f"Job entrypoint command failed with exit code {exit_code}")


COLLECTIVE_TIMEOUT_LOG = (b"(RayTrainWorker pid=7) [E ProcessGroupGloo.cpp:143] Timed out waiting 1800000ms for recv "
                          b"operation to complete\n")
MISSING_MODULE_LOG = b"Traceback (most recent call last):\nModuleNotFoundError: No module named 'no_such_module'\n"


def test_the_diagnosis_a_failed_job_ends_with_is_the_agents_or_read_from_a_log_it_never_wrote_in(tmp_path):
    """A job run beside the agent says its cause in a ``cause`` event; one that was not (an older job, one
    exported without the agent) has its log read with the same table."""
    decided = (b'(rayjobs) ' + EVENT_MARKER.encode() + b' {"event": "cause", "attempt": 1, "exit_code": 1, '
               b'"cause": "collective_timeout", "text": "said by the agent", "advice": "", "evidence": "", '
               b'"retryable": true}\n')
    for log, said in ((MISSING_MODULE_LOG, "module_missing"), (MISSING_MODULE_LOG + decided, "collective_timeout")):
        for stream_logs in (True, False):
            run = Run(tmp_path, FakeClient(_failing_with(log)), stream_logs=stream_logs)
            assert run.result.diagnosis is not None and run.result.diagnosis.cause == said, (log, stream_logs)


def test_a_retry_never_attaches_to_an_attempt_an_earlier_invocation_left_ended(tmp_path, clock):
    body = "submission_id: nightly-1\nmax_retries: 1\n"
    (tmp_path / "spec.yaml").write_text(f"name: demo\nentrypoint: python job.py\n{body}")
    spec_hash = build_submission(load_spec(tmp_path / "spec.yaml"))["metadata"]["rayjobs.spec_hash"]
    client = FakeClient(_lost(), Script(["RUNNING", "SUCCEEDED"]))
    # An earlier `rayjobs submit` of this same spec failed twice and left its second attempt behind.
    client.existing("nightly-1-attempt2", _lost(), {"rayjobs.spec_hash": spec_hash})
    client.get_job("nightly-1-attempt2")
    client.get_job("nightly-1-attempt2")  # it has ended
    run = Run(tmp_path, client, body)
    assert run.result.attempts == ["nightly-1", "nightly-1-attempt2-2"]
    assert run.result.exit_code == ExitCode.SUCCEEDED


@pytest.mark.parametrize("named, message", [
    ("module_missing", "'module_missing' is never retried: a missing module is missing again in the next attempt"),
    ("storage_credentials", "'storage_credentials' is never retried: refused credentials are refused again"),
    ("host_out_of_memry", "(did you mean 'host_out_of_memory'?)"),
])
def test_retry_on_refuses_what_no_retry_can_fix_and_misspelled_causes(tmp_path, named, message):
    from jobs.errors import SpecError

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"name: demo\nentrypoint: python job.py\nmax_retries: 2\nretry_on: [{named}]\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec_file)
    assert message in str(refused.value) and "retry_on" in str(refused.value)


def test_every_cause_the_diagnosis_names_is_classified_for_retries():
    from jobs.retry import PERMANENT_CAUSES, RETRYABLE_CAUSES
    from rayjobs_agent.causes import CAUSES

    diagnosed = {cause.name for cause in CAUSES} | {"max_failures_used_up"}
    classified = set(RETRYABLE_CAUSES) | set(PERMANENT_CAUSES)
    assert not set(RETRYABLE_CAUSES) & set(PERMANENT_CAUSES)
    assert diagnosed == classified, "classify each cause in jobs/spec.py: RETRYABLE_CAUSES or PERMANENT_CAUSES"


def test_a_follower_waiting_for_its_turn_keeps_waiting_through_an_outage_shorter_than_its_give_up(monkeypatch):
    """A head restarting while a followed job waits in its queue: the follower keeps the job's place and goes on
    once the cluster answers again, as it does for a running job."""
    from runner.errors import ClusterUnreachable
    from runner.follow import queued

    answers = iter([ClusterUnreachable("cannot reach the Ray dashboard"), ClusterUnreachable("still not"), "back"])

    class Api:
        address = FAKE_ADDRESS

        def get_job(self, job_id):
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return {"status": "RUNNING"}

    said: list[str] = []
    queued.wait_for_turn(Api(), "job-1", said.append, sleep=lambda _s: None, give_up_after_s=60)
    assert len(said) == 1  # said once, however long the outage lasts
    assert said[0].startswith(f"lost contact with the cluster at {FAKE_ADDRESS}; job job-1 keeps its place")
    with pytest.raises(ClusterUnreachable):
        answers = iter([ClusterUnreachable("down")] * 3)
        queued.wait_for_turn(Api(), "job-1", said.append, sleep=lambda _s: None, give_up_after_s=None)
