"""A job that keeps no run record says so once when it is submitted, with the field that gives it one.

The command runs in-process (typer's CliRunner) against the scripted client of tests/test_cli.py;
whether a spec keeps a record is read from the real submission ``jobs.submission.build_submission`` builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.client import jobs_api
from typer.testing import CliRunner

from jobs.loader import validate_spec_data
from jobs.submission import build_submission
from runner.cli import app as cli
from runner.client.connection import Connection
from runner.run.record_note import no_record_note
from tests.support.fake_cluster import FAKE_ADDRESS, FakeClient, Script, speed_up_following

NOTE_START = "rayjobs: note: job demo keeps no run record and shows no training progress"


@pytest.fixture
def client(monkeypatch) -> FakeClient:
    speed_up_following(monkeypatch)
    fake = FakeClient()

    def make_client(connection: Connection, retry_for_s: float = 0.0) -> FakeClient:
        fake.connection = connection
        return fake

    monkeypatch.setattr(jobs_api, "open_client", make_client)
    return fake


def _spec_file(tmp_path: Path, body: str = "") -> str:
    path = tmp_path / "demo.yaml"
    path.write_text(f"name: demo\nentrypoint: python job.py\n{body}")
    return str(path)


def test_a_job_without_code_is_told_once_after_it_is_submitted_even_when_retried(client, tmp_path):
    failing = Script(["RUNNING", "FAILED"], error_type="JOB_SUPERVISOR_ACTOR_DIED")
    client.scripts = [failing, Script(["RUNNING", "SUCCEEDED"])]
    result = CliRunner().invoke(cli.app, ["submit", _spec_file(tmp_path, "max_retries: 1\n"),
                                          "--address", FAKE_ADDRESS], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("rayjobs: submitted demo as raysubmit_fake1 ")
    notes = [line for line in lines if line.startswith(NOTE_START)]
    assert notes == [lines[1]]
    assert "add `record_path: ~/rayjobs-results` (or s3://BUCKET/PREFIX)" in notes[0]
    assert "the cluster submits attempt 2 of 2" in result.stderr


def _note_for(tmp_path: Path, body: str) -> str | None:
    data = {"name": "demo", "entrypoint": "python job.py", **body}
    loaded = validate_spec_data(data, tmp_path / "demo.yaml")
    return no_record_note(loaded, build_submission(loaded))


@pytest.mark.parametrize("body", [{}, {"record": True}, {"runtime_env": {"working_dir": "s3://bucket/code.zip"}}],
                         ids=["plain", "record-asked-for", "remote-code"])
def test_a_spec_that_keeps_no_record_gets_the_note(tmp_path, body):
    assert _note_for(tmp_path, body) is not None


@pytest.mark.parametrize("body", [{"record_path": "~/rayjobs-results"}, {"runtime_env": {"working_dir": "."}},
                                  {"record": False}],
                         ids=["record-path", "local-code", "turned-off"])
def test_no_note_when_a_record_is_kept_or_turned_off(tmp_path, body):
    assert _note_for(tmp_path, body) is None
