"""The ``rayjobs`` command in-process (typer's CliRunner) against a scripted client: messages and exit codes.

The client comes from one factory, ``runner.client.jobs_api.open_client``; these tests replace it, so
everything before it (flags, spec loading, address precedence) and after it (the run policy,
rendering, exit codes) is the real code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.client import jobs_api
from typer.testing import CliRunner

from runner.cli import app as cli
from runner.client.connection import Connection
from runner.errors import ClusterUnreachable
from runner.client.submission import SubmitInterrupted
from tests.support.fake_cluster import AN_HOUR_AGO_MS, FAKE_ADDRESS, FakeClient, Script, speed_up_following

ADDRESS = ["--address", FAKE_ADDRESS]
HINT = f" --address {FAKE_ADDRESS}"


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    speed_up_following(monkeypatch)


@pytest.fixture
def client(monkeypatch) -> FakeClient:
    """The fake every command gets; ``client.connections`` holds what the command resolved."""
    fake = FakeClient()
    fake.connections = []

    def make_client(connection: Connection, retry_for_s: float = 0.0) -> FakeClient:
        fake.connections.append(connection)
        fake.connection = connection
        return fake

    monkeypatch.setattr(jobs_api, "open_client", make_client)
    return fake


def rayjobs(*args: str):
    return CliRunner().invoke(cli.app, list(args), catch_exceptions=False)


def spec(tmp_path: Path, body: str = "") -> str:
    path = tmp_path / "demo.yaml"
    path.write_text(f"name: demo\nentrypoint: python job.py\n{body}")
    return str(path)


def test_submit_follows_to_success(client, tmp_path):
    client.scripts = [Script(["RUNNING", "SUCCEEDED"], log=b"hello from the job\n")]
    result = rayjobs("submit", spec(tmp_path), *ADDRESS)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello from the job\n"
    assert result.stderr.splitlines()[0] == f"rayjobs: submitted demo as raysubmit_fake1 to {FAKE_ADDRESS} (--address)"
    assert result.stderr.splitlines()[-1] == "rayjobs: job raysubmit_fake1 SUCCEEDED in 1.5s"
    connection = client.connections[0]
    assert (connection.address, connection.source) == (FAKE_ADDRESS, "--address")


@pytest.mark.parametrize(("final", "code"), [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 3)])
def test_submit_exit_code_is_the_outcome(client, tmp_path, final, code):
    client.scripts = [Script(["RUNNING", final], log=b"last words\n", error_type="X" if final == "FAILED" else None)]
    result = rayjobs("submit", spec(tmp_path), *ADDRESS)
    assert result.exit_code == code, result.stderr
    assert f"rayjobs: job raysubmit_fake1 {final} in 1.5s" in result.stderr
    assert ("rayjobs: last lines of its log:\n  | last words" in result.stderr) == (final == "FAILED")


def test_submit_json_output_is_one_document_and_logs_go_to_stderr(client, tmp_path):
    client.scripts = [Script(["RUNNING", "SUCCEEDED"], log=b"job output\n")]
    result = rayjobs("submit", spec(tmp_path), *ADDRESS, "--output", "json")
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert {key: summary[key] for key in ("submission_id", "status", "exit_code", "address", "attempts")} == {
        "submission_id": "raysubmit_fake1", "status": "SUCCEEDED", "exit_code": 0, "address": FAKE_ADDRESS,
        "attempts": ["raysubmit_fake1"]}
    assert summary["summary"] == "job raysubmit_fake1 SUCCEEDED in 1.5s"
    assert "job output" in result.stderr and "SUCCEEDED in" not in result.stderr


def test_submit_follows_the_attempt_the_cluster_submits_after_a_job_lost_whole(client, tmp_path):
    lost = Script(["RUNNING", "FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED", message="Job supervisor actor died")
    client.scripts = [lost, Script(["RUNNING", "SUCCEEDED"])]
    result = rayjobs("submit", spec(tmp_path, "max_retries: 2\n"), *ADDRESS,
                     "--output", "json")
    assert result.exit_code == 0, result.stderr
    assert "the cluster submits attempt 2 of 3" in result.stderr
    summary = json.loads(result.stdout)
    assert (summary["submission_id"], summary["attempts"]) == \
        ("raysubmit_fake1-attempt2", ["raysubmit_fake1", "raysubmit_fake1-attempt2"])
    assert client.submitted[1]["metadata"]["rayjobs.parent"] == "raysubmit_fake1"
    assert client.submitted[1]["metadata"]["rayjobs.attempt"] == "2"


def test_submit_gives_up_after_max_retries(client, tmp_path):
    failing = Script(["RUNNING", "FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED")
    client.scripts = [failing, Script(["RUNNING", "FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED")]
    result = rayjobs("submit", spec(tmp_path, "max_retries: 1\n"), *ADDRESS)
    assert result.exit_code == 1
    assert "the cluster submits attempt 2 of 2" in result.stderr and "attempt 3" not in result.stderr
    assert len(client.submitted) == 2


def test_submit_attaches_to_the_same_spec_and_refuses_another(client, tmp_path):
    first = rayjobs("submit", spec(tmp_path, "submission_id: fixed-1\n"), *ADDRESS)
    assert first.exit_code == 0, first.stderr
    again = rayjobs("submit", spec(tmp_path, "submission_id: fixed-1\n"), *ADDRESS)
    assert again.exit_code == 0, again.stderr
    assert "rayjobs: job fixed-1 was already submitted from this spec (SUCCEEDED); attaching to it" in again.stderr
    assert len(client.submitted) == 1
    changed = rayjobs("submit", spec(tmp_path, "submission_id: fixed-1\nmetadata: {team: other}\n"
                                               "entrypoint_num_cpus: 1\n"), *ADDRESS)
    assert changed.exit_code == 2
    assert "rayjobs: error: submission_id 'fixed-1' is already taken by a job with different content" in changed.stderr
    assert len(client.submitted) == 1


def test_submit_timeout_stops_the_job_and_exits_5(client, tmp_path):
    client.scripts = [Script(["RUNNING"], start_time=AN_HOUR_AGO_MS)]
    result = rayjobs("submit", spec(tmp_path, "timeout_s: 5\n"), *ADDRESS)
    assert result.exit_code == 5, result.stderr
    assert client.called("stop_job") == [("stop_job", "raysubmit_fake1")]
    assert "rayjobs: the job ran past its timeout_s of 5s; stopping the job" in result.stderr


def test_submit_start_timeout_exits_5(client, tmp_path):
    client.scripts = [Script(["PENDING"], start_time=AN_HOUR_AGO_MS)]
    result = rayjobs("submit", spec(tmp_path, "start_timeout_s: 3\n"), *ADDRESS)
    assert result.exit_code == 5, result.stderr
    assert "still PENDING after 3s (start_timeout_s)" in result.stderr and "The stop is queued" in result.stderr


def test_submit_refuses_an_entrypoint_no_node_can_host(client, tmp_path):
    result = rayjobs("submit", spec(tmp_path, "entrypoint_num_gpus: 1\n"), *ADDRESS)
    assert result.exit_code == 2
    assert "the entrypoint asks for GPU 1, but the largest of the cluster's 1 node(s) offers GPU 0" in result.stderr
    assert not client.called("submit")
    assert rayjobs("submit", spec(tmp_path, "entrypoint_num_gpus: 1\n"), *ADDRESS, "--no-preflight").exit_code == 0


def test_submit_to_an_unreachable_cluster_exits_4(client, tmp_path):
    client.submit_error = ClusterUnreachable(f"cannot reach the Ray dashboard at {FAKE_ADDRESS}: Connection refused")
    result = rayjobs("submit", spec(tmp_path), *ADDRESS)
    assert result.exit_code == 4
    assert result.stderr == f"rayjobs: error: cannot reach the Ray dashboard at {FAKE_ADDRESS}: Connection refused\n"


def test_following_gives_up_when_the_cluster_stops_answering(client, tmp_path):
    client.scripts = [Script(["RUNNING"], unreachable_from_poll=1)]
    result = rayjobs("submit", spec(tmp_path), *ADDRESS, "--give-up-after", "1")
    assert result.exit_code == 4
    assert "rayjobs: lost contact with the cluster" in result.stderr and "may still be running" in result.stderr
    assert not client.called("stop_job")


@pytest.mark.parametrize("stop", [False, True], ids=["detach", "stop"])
def test_ctrl_c_while_following(client, tmp_path, stop):
    client.scripts = [Script(["RUNNING"], raise_on_poll={2: KeyboardInterrupt()})]
    flags = ["--stop-on-interrupt"] if stop else []
    result = rayjobs("submit", spec(tmp_path), *ADDRESS, *flags)
    assert result.exit_code == 130
    assert "Aborted!" not in result.output
    if stop:
        assert client.called("stop_job") == [("stop_job", "raysubmit_fake1")]
        assert "rayjobs: interrupted: stopping job raysubmit_fake1 (--stop-on-interrupt)" in result.stderr
    else:
        assert not client.called("stop_job")
        assert "rayjobs: interrupted: detached from job raysubmit_fake1, which keeps running" in result.stderr
        assert f"rayjobs: follow it:  rayjobs logs --follow raysubmit_fake1{HINT}" in result.stderr


def test_ctrl_c_while_submitting(client, tmp_path):
    client.submit_error = SubmitInterrupted(None)
    result = rayjobs("submit", spec(tmp_path), *ADDRESS)
    assert (result.exit_code, result.stderr) == (130, "rayjobs: interrupted: nothing was submitted\n")
    client.submit_error = None
    client.interrupt_after_request = True
    result = rayjobs("submit", spec(tmp_path), *ADDRESS)
    assert result.exit_code == 130
    assert "rayjobs: interrupted: job raysubmit_fake1 was submitted and keeps running" in result.stderr


def test_submit_no_wait_prints_the_id_and_how_to_follow(client, tmp_path):
    result = rayjobs("submit", spec(tmp_path), *ADDRESS, "--no-wait")
    assert result.exit_code == 0
    assert result.stdout == "raysubmit_fake1\n"
    assert result.stderr.splitlines()[-3:] == [f"rayjobs: follow it:  rayjobs logs --follow raysubmit_fake1{HINT}",
                                               f"rayjobs: its status: rayjobs status raysubmit_fake1{HINT}",
                                               f"rayjobs: stop it:    rayjobs stop raysubmit_fake1{HINT}"]
    assert client.calls == [("submit", None)]


def test_submit_dry_run_makes_no_client(client, tmp_path):
    result = rayjobs("submit", spec(tmp_path), *ADDRESS, "--dry-run")
    assert result.exit_code == 0 and result.stdout.startswith(f"# would submit to {FAKE_ADDRESS}\n")
    assert client.connections == []


@pytest.mark.parametrize(("final", "code"), [("RUNNING", 0), ("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 3)])
def test_status_exit_codes(client, final, code):
    client.existing("raysubmit_x", Script([final]), {})
    result = rayjobs("status", "raysubmit_x", *ADDRESS)
    assert result.exit_code == code
    assert "status:" in result.stdout and final in result.stdout


def test_status_of_an_unknown_job_exits_6(client):
    result = rayjobs("status", "raysubmit_nope", *ADDRESS)
    assert result.exit_code == 6
    assert result.stderr.startswith("rayjobs: error: no job 'raysubmit_nope'")


def test_logs_follow_exits_with_the_outcome(client):
    client.existing("raysubmit_x", Script(["RUNNING", "FAILED"], log=b"a\nb\n", error_type="X"), {})
    result = rayjobs("logs", "raysubmit_x", "--follow", *ADDRESS)
    assert result.exit_code == 1
    assert result.stdout == "a\nb\n"
    assert "last lines" not in result.stderr


@pytest.mark.parametrize(("found", "words"), [
    ("queued", "job raysubmit_x was lost whole; stop requested for job raysubmit_x-attempt2 (waiting in its queue: "
               "it never starts)"),
    ("stopped", "job raysubmit_x was lost whole; stop requested for job raysubmit_x-attempt2"),
])
def test_a_stop_that_acted_on_a_lost_jobs_next_attempt_names_it_and_waits_for_it(client, monkeypatch, found, words):
    # The job named had run and was lost whole: what the stop found is true of its next attempt, which --wait follows.
    from runner.client import queue as client_queue

    client.existing("raysubmit_x", Script(["FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED"), {})
    client.existing("raysubmit_x-attempt2", Script(["STOPPED"]), {})
    monkeypatch.setattr(client_queue, "stop_job",
                        lambda api, job_id: client_queue.StopFound(found, f"{job_id}-attempt2"))
    stopped = rayjobs("stop", "raysubmit_x", "--wait", *ADDRESS)
    assert stopped.exit_code == 0, stopped.stderr
    assert stopped.stderr == f"rayjobs: {words}\nrayjobs: job raysubmit_x-attempt2 is STOPPED\n"


def test_stop_wait_and_delete(client):
    client.existing("raysubmit_x", Script(["RUNNING"]), {})
    stopped = rayjobs("stop", "raysubmit_x", "--wait", *ADDRESS)
    assert stopped.exit_code == 0
    assert stopped.stderr == "rayjobs: stop requested for job raysubmit_x\nrayjobs: job raysubmit_x is STOPPED\n"
    again = rayjobs("stop", "raysubmit_x", *ADDRESS)
    assert again.stderr == "rayjobs: job raysubmit_x had already ended: STOPPED\n"
    client.records["raysubmit_x"]["end_time"] = AN_HOUR_AGO_MS
    client.delete_finished_job = lambda job_id, end_time_ms: client.calls.append(("delete", job_id, end_time_ms))
    deleted = rayjobs("delete", "raysubmit_x", *ADDRESS)
    assert deleted.exit_code == 0 and deleted.stderr == "rayjobs: deleted job raysubmit_x\n"
    assert client.calls[-1] == ("delete", "raysubmit_x", AN_HOUR_AGO_MS)


def test_list_filters_by_status(client):
    client.existing("raysubmit_a", Script(["RUNNING"]), {})
    client.existing("raysubmit_b", Script(["SUCCEEDED"]), {})
    for job_id in ("raysubmit_a", "raysubmit_b"):
        client.get_job(job_id)
    result = rayjobs("list", "--status", "succeeded", "--output", "json", *ADDRESS)
    assert result.exit_code == 0
    assert [job["submission_id"] for job in json.loads(result.stdout)] == ["raysubmit_b"]


@pytest.mark.parametrize("command", [["submit", "SPEC"], ["status", "x"], ["logs", "x"], ["stop", "x"], ["list"],
                                     ["delete", "x"]])
def test_every_cluster_command_takes_the_connection_options(client, tmp_path, command):
    args = [spec(tmp_path) if arg == "SPEC" else arg for arg in command]
    result = rayjobs(*args, *ADDRESS, "--header", "X-Team: vision", "--no-verify", "--ca-cert", str(tmp_path / "none"))
    assert result.exit_code == 2
    assert f"rayjobs: error: --ca-cert '{tmp_path / 'none'}' is not a file" in result.stderr
    client_made = rayjobs(*args, *ADDRESS, "--header", "X-Team: vision", "--no-verify")
    connection = client.connections[-1]
    assert connection.headers["X-Team"] == "vision" and connection.verify is False, client_made.stderr


def test_logs_prints_the_last_lines(client):
    client.existing("raysubmit_x", Script(["SUCCEEDED"], log=b"1\n2\n3\n"), {})
    result = rayjobs("logs", "raysubmit_x", "--tail", "2", *ADDRESS)
    assert (result.exit_code, result.stdout) == (0, "2\n3\n")
    assert client.called("job_log") == [("job_log", "raysubmit_x", 2)]


def test_a_cluster_name_that_runs_nowhere_makes_no_client(client):
    result = rayjobs("status", "x", "--cluster", "elsewhere")
    assert result.exit_code == 4
    assert "no local cluster 'elsewhere' is running (named by --cluster)" in result.stderr
    assert client.connections == []


@pytest.mark.parametrize("name", ["x; touch FILE", "$(touch FILE)", "team`id`", "Team-A"])
def test_a_queue_name_that_is_a_shell_command_is_refused(client, tmp_path, name, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for words in (["queue", name], ["queue", "set", name, "--max-running", "1"]):
        result = rayjobs(*words, *ADDRESS)
        assert result.exit_code == 2, result.stderr
        assert "cannot name a queue" in result.stderr
    assert not (tmp_path / "FILE").exists() and client.calls == []
    refused = rayjobs("validate", spec(tmp_path, f"queue: '{name}'\n"))
    assert refused.exit_code == 2 and "queue" in refused.stderr
