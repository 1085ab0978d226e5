"""A job that uploads no code keeps a record all the same when its spec says where: the observer's package
travels alone, sent once per cluster without Ray's client."""

from __future__ import annotations

import re

from runner.records.store import Folder, attempt_log, read_run


def test_a_job_with_nothing_to_upload_keeps_its_record_where_the_spec_says(rayjobs_cli, tmp_path):
    spec = tmp_path / "plain.yaml"
    spec.write_text("name: plain\nentrypoint: python -c \"print('hello from a job without code')\"\n"
                    f"record_path: {tmp_path / 'records'}\n")
    first = rayjobs_cli("submit", str(spec))
    assert first.returncode == 0, first.stderr
    assert "hello from a job without code" in first.stdout
    job_id = re.search(r"submitted plain as (\S+) to", first.stderr).group(1)
    run = Folder(str(tmp_path / "records" / f"plain-{job_id}"))
    document = read_run(run)
    assert document["status"] == "SUCCEEDED" and document["attempts"][0]["exit_code"] == 0
    assert b"hello from a job without code" in attempt_log(run, job_id)

    again = rayjobs_cli("submit", str(spec))
    assert again.returncode == 0, again.stderr
    assert len(list((tmp_path / "records").iterdir())) == 2, "each job keeps its own record"
