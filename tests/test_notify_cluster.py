"""A job's notification sent by the job itself on a real cluster: submitted with --no-wait, nobody follows it."""

from __future__ import annotations

import json

from tests.support.cli import write_spec
from tests.support.notify_receivers import webhook_receiver
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

TOKEN = "notify-token-31337"


def test_a_job_nobody_follows_tells_a_webhook_it_succeeded(rayjobs_cli, tmp_path):
    records = tmp_path / "records"
    with webhook_receiver() as hook:
        url = f"json://ci:{TOKEN}@127.0.0.1:{hook.port}/hook"
        spec = write_spec(tmp_path, "notified", f"entrypoint: python -c \"print('notified job ran')\"\n"
                                                f"record_path: {records}\n"
                                                f"notify: [{{url: '{url}', on: [succeeded]}}]\n")
        submitted = rayjobs_cli("submit", str(spec), "--no-wait")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        assert hook.arrived.wait(HANG_GUARD_S), rayjobs_cli("logs", job_id).stdout
    [(path, body)] = hook.received
    assert path == "/hook" and body["title"] == "rayjobs: notified SUCCEEDED"
    lines = body["message"].splitlines()
    assert lines[0].startswith("notified SUCCEEDED after ")
    assert f"job: {job_id}" in lines and f"record: {records / f'notified-{job_id}'}" in lines

    run_file = records / f"notified-{job_id}" / "run.json"
    wait_for_condition(lambda: run_file.exists() and json.loads(run_file.read_text())["status"] == "SUCCEEDED",
                       timeout_s=HANG_GUARD_S)
    record = run_file.read_text()
    assert json.loads(record)["spec"]["notify"] == [{"url": f"json://***@127.0.0.1:{hook.port}/***",
                                                      "on": ["succeeded"]}]
    shown = rayjobs_cli("status", job_id, "--output", "json").stdout + submitted.stdout + submitted.stderr
    assert TOKEN not in record and TOKEN not in shown
