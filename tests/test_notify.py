"""Notifications sent by the job itself (rayjobs_agent/notify.py), to real servers on loopback, and the
spec's ``notify`` block (jobs/notify.py): what is sent, when, masked, and that a notifier that fails costs the job
nothing but one line."""

from __future__ import annotations

import email
import json
import sys
from pathlib import Path

import pytest

from jobs import notify as client_side
from jobs.errors import SpecError
from rayjobs_agent.wire import RECORD_ENV_VAR
from jobs.loader import load_spec
from jobs.secrets import masked
from jobs.submission import build_submission
from tests.support.notify_receivers import free_port, silent_port, smtp_receiver, webhook_receiver
from rayjobs_agent import notify
from rayjobs_agent.causes import UNKNOWN, Diagnosis, FailureReader
from rayjobs_agent.recorder import Recorder

SECRET = "hunter2-token-value"
ENVIRON = {"API_TOKEN": SECRET}


def _config(url: str, *events: str) -> dict:
    return {"targets": [{"url": url, "on": list(events)}], "attempts": 1}


def test_a_failed_job_tells_a_json_webhook_what_happened():
    with webhook_receiver() as hook:
        results = notify.notify_end(
            _config(hook.url(), "failed"), "FAILED", 1, 3725.0,
            {"name": "nightly", "submission_id": "raysubmit_1", "metrics": {"loss": 0.123456, "epoch": 3},
             "iteration": 3, "cause": f"ValueError: bad token {SECRET}", "record": "s3://runs/nightly-raysubmit_1"},
            environ=ENVIRON)
    assert results == [{"url": f"json://127.0.0.1:{hook.port}/***", "event": "failed", "sent": True}]
    [(path, body)] = hook.received
    assert path == "/hook" and body["title"] == "rayjobs: nightly FAILED"
    assert body["message"].splitlines() == [
        "nightly FAILED after 1h02m05s (exit code 1)",
        "cause: ValueError: bad token ***",
        "metrics: loss=0.1235, epoch=3 (iteration 3)",
        "record: s3://runs/nightly-raysubmit_1",
        "job: raysubmit_1",
    ]


def test_only_the_events_a_target_asks_for_are_sent():
    with webhook_receiver() as hook:
        assert notify.notify_end(_config(hook.url(), "failed", "stopped"), "SUCCEEDED", 0, 5.0, {}) == []
        assert notify.notify_end(_config(hook.url(), "succeeded"), "SUCCEEDED", 0, 5.0, {"name": "n"})[0]["sent"]
    assert [body["message"] for _, body in hook.received] == ["n SUCCEEDED after 5.0s"]


def test_an_email_reaches_an_smtp_server():
    with smtp_receiver() as (port, messages):
        url = f"mailto://127.0.0.1:{port}?from=jobs@example.com&to=team@example.com&mode=insecure"
        results = notify.notify_end(_config(url, "stopped"), "STOPPED", -15, 42.0, {"name": "nightly"})
    assert results == [{"url": f"mailto://127.0.0.1:{port}/***", "event": "stopped", "sent": True}]
    [envelope] = messages
    assert envelope.rcpt_tos == ["team@example.com"]
    message = email.message_from_bytes(envelope.content)
    assert message["Subject"] == "rayjobs: nightly STOPPED"
    text = next(part.get_payload(decode=True).decode() for part in message.walk()
                if part.get_content_type() == "text/plain")
    assert "nightly STOPPED after 42.0s (exit code -15)" in text


def test_a_closed_port_costs_one_line_and_no_url_token(capsys):
    port = free_port()
    url = f"json://user:{SECRET}@127.0.0.1:{port}/hook"
    results = notify.notify_end(_config(url, "failed"), "FAILED", 1, 1.0, {"name": "nightly"}, environ=ENVIRON)
    assert [(result["url"], result["sent"]) for result in results] == [(f"json://***@127.0.0.1:{port}/***", False)]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"rayjobs: notification to json://***@127.0.0.1:{port}/*** failed: ")
    assert lines[0].endswith("; the job's result is unchanged")
    assert SECRET not in lines[0] and "Connection error" in lines[0]


def test_a_service_that_never_answers_is_given_up_at_the_bound(capsys):
    with silent_port() as port:
        results = notify.notify_end(_config(f"json://127.0.0.1:{port}/hook", "failed"), "FAILED", 1, 1.0, {},
                                    bound_s=0.5)
    assert results[0]["sent"] is False and results[0]["error"] == "no answer within 0.5s"
    assert "failed: no answer within 0.5s; the job's result is unchanged" in capsys.readouterr().err


def test_apprise_missing_on_the_cluster_is_said_not_raised(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "apprise", None)
    results = notify.notify_end(_config("json://127.0.0.1:9/hook", "failed"), "FAILED", 1, 1.0, {})
    assert results[0]["sent"] is False
    assert ("failed: Apprise is not installed on the cluster (add apprise to runtime_env.pip, or to the image); "
            "the job's result is unchanged") in capsys.readouterr().err


def _recorder(tmp_path: Path, attempt: int, environ: dict[str, str]) -> Recorder:
    job_config = {"metadata": {"job_submission_id": f"raysubmit_{attempt}", "rayjobs.attempt": str(attempt)}}
    return Recorder.from_environment({**environ, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job_config)},
                                     {"name": "nightly", "run_dir": str(tmp_path / "run")})


def test_a_retried_attempt_says_so_as_it_starts_and_its_end_with_the_record(tmp_path):
    first = _recorder(tmp_path, 1, {})
    first.start()
    first.upload("FAILED", exit_code=3)
    with webhook_receiver() as hook:
        settings = {"targets": [{"url": hook.url(), "on": ["retry", "succeeded"]}], "attempts": 3}
        environ = {notify.NOTIFY_ENV_VAR: json.dumps(settings)}
        second = _recorder(tmp_path, 2, environ)
        second.start()
        notifier = notify.JobNotifier.from_environment(environ, second)
        notifier.ended("SUCCEEDED", 0)
    retry, end = [body for _, body in hook.received]
    assert retry["title"] == "rayjobs: nightly retried"
    assert retry["message"].splitlines()[0] == ("nightly: attempt 1 failed (FAILED, exit code 3); attempt 2 of up "
                                                "to 3 has started")
    assert f"record: {tmp_path / 'run'}" in retry["message"]
    assert end["message"].splitlines()[0].startswith("nightly SUCCEEDED after ")
    assert end["message"].splitlines()[0].endswith(", attempt 2 of up to 3")


def test_a_failed_send_is_kept_in_the_record_notes(tmp_path):
    environ = {notify.NOTIFY_ENV_VAR: json.dumps(_config(f"json://127.0.0.1:{free_port()}/hook", "failed"))}
    recorder = _recorder(tmp_path, 1, environ)
    recorder.start()
    notify.JobNotifier.from_environment(environ, recorder).ended("FAILED", 1)
    recorder.upload("FAILED", exit_code=1)
    notes = json.loads((tmp_path / "run" / "run.json").read_text())["notes"]
    assert any(note.startswith("notification (failed) to json://127.0.0.1:") for note in notes), notes


def test_a_stall_the_agent_decided_is_told(tmp_path):
    with webhook_receiver() as hook:
        settings = {"targets": [{"url": hook.url(), "on": ["stalled"]}]}
        notifier = notify.JobNotifier(settings, _recorder(tmp_path, 1, {}), {})
        notifier.stalled(61.0)
    [(_, body)] = hook.received
    assert body["title"] == "rayjobs: nightly stalled"
    assert body["message"].startswith("nightly has printed nothing and reported no progress for 1m01s")


def test_a_message_names_the_cause_the_agent_decided_or_else_the_last_exception_in_the_log():
    reader = FailureReader()
    for line in ("Traceback (most recent call last):", "  File 'a.py'", "KeyError: 'x'", "during handling…",
                 "(RayTrainWorker pid=1) ValueError: bad shape", "exiting"):
        reader.line(line)
    assert reader.diagnose() is None
    unexplained = Diagnosis(UNKNOWN, "the entrypoint exited with code 1", "", reader.last_raised or "")
    assert notify.cause_words(unexplained) == "ValueError: bad shape"
    assert notify.cause_words(Diagnosis(UNKNOWN, "the entrypoint exited with code 1", "", "")) == \
        "the entrypoint exited with code 1"
    reader.line("(RayTrainWorker pid=1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    explained = reader.diagnose()
    assert explained is not None and notify.cause_words(explained).startswith("cuda_out_of_memory: ")


@pytest.mark.parametrize("url, shown", [
    ("json://user:pass@host:8080/hook?x=1", "json://***@host:8080/***"),
    ("jsons://host", "jsons://host"),
    ("mailto://me:pw@gmail.com?to=a@b.c", "mailto://***@gmail.com/***"),
    ("slack://TokenA/TokenB/TokenC/#ops", "slack://***"),
    ("ntfy://my-secret-topic", "ntfy://***"),
    ("not a url", "***"),
])
def test_a_notify_url_is_shown_masked_alike_on_both_sides(url, shown):
    assert client_side.masked_notify_url(url) == notify.masked_url(url) == shown


def _spec(tmp_path: Path, body: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: nightly\nentrypoint: python job.py\nruntime_env: {{working_dir: code}}\n{body}")
    return spec


def test_the_spec_keeps_notify_urls_out_of_every_output(tmp_path):
    loaded = load_spec(_spec(tmp_path, "max_retries: 2\nnotify:\n  - url: slack://TA/TB/TC\n    on: [failed, retry]\n"
                                       "  - url: json://u:pw@hooks.example.com/in\n"))
    assert [target.on for target in loaded.spec.notify] == [["failed", "retry"], ["failed", "stopped"]]
    submission = build_submission(loaded)
    sent = json.loads(submission["runtime_env"]["env_vars"][notify.NOTIFY_ENV_VAR])
    assert sent["targets"][0] == {"url": "slack://TA/TB/TC", "on": ["failed", "retry"]} and sent["attempts"] == 3
    shown = json.dumps(masked(submission))
    assert "TA/TB/TC" not in shown and "pw@" not in shown
    record = json.loads(submission["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert record["spec"]["notify"] == record["notify"] == [
        {"url": "slack://***", "on": ["failed", "retry"]},
        {"url": "json://***@hooks.example.com/***", "on": ["failed", "stopped"]}]


@pytest.mark.parametrize("body, message", [
    ("notify: [{url: 'slak://T/B/C'}]", "notify[0].url: slak:// is not a scheme Apprise sends to (did you mean "
                                        "'slack'?)"),
    ("notify: [{url: 'slack://***'}]", "notify[0].url: holds a masked value (***)"),
    ("notify: [{url: 'json://h/p', on: [done]}]", "notify[0].on[0]"),
    ("record: false\nnotify: [{url: 'json://h/p'}]", "notify needs the run record"),
])
def test_a_notify_block_that_cannot_work_is_refused(tmp_path, body, message):
    with pytest.raises(SpecError) as refused:
        load_spec(_spec(tmp_path, body))
    assert message in str(refused.value)


def test_notify_without_uploaded_code_or_a_record_path_is_refused(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: nightly\nentrypoint: echo hi\nnotify: [{url: 'json://h/p'}]\n")
    with pytest.raises(SpecError, match="notify needs the run record's keeper"):
        load_spec(spec)
    # Naming where its record goes gives a job without code the keeper, which sends the notifications.
    spec.write_text(f"name: nightly\nentrypoint: echo hi\nrecord_path: {tmp_path}\nnotify: [{{url: 'json://h/p'}}]\n")
    assert load_spec(spec).spec.notify


def test_a_dollar_in_a_notification_url_or_any_spec_value_reaches_the_job_unexpanded(tmp_path):
    """Ray expands $NAME in every variable it sets on the cluster (os.path.expandvars, as on a node)."""
    import os

    url = "json://hooks.example.com/in?token=ab$HOME$cd"
    loaded = load_spec(_spec(tmp_path, f"record_path: {tmp_path}/runs\nnotify:\n  - url: '{url}'\n"
                                       "tracking: {mlflow: {tracking_uri: 'http://127.0.0.1:5000', "
                                       "experiment: 'cost$PATH'}}\n"))
    env_vars = build_submission(loaded)["runtime_env"]["env_vars"]
    for name, value in env_vars.items():
        assert os.path.expandvars(value) == value, name
    assert json.loads(os.path.expandvars(env_vars[notify.NOTIFY_ENV_VAR]))["targets"][0]["url"] == url
