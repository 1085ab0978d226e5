"""Ctrl-C while `rayjobs submit` is still submitting: exit 130, and say whether a job was created."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from tests.support.cli import popen_rayjobs
from tests.support.waiting import wait_for_condition


SLOW_JOB = "entrypoint: python -c \"import time; time.sleep(120)\"\n"


def jobs_named(rj, name: str) -> list[dict]:
    listed = rj("list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    return [job for job in json.loads(listed.stdout) if (job.get("metadata") or {}).get("rayjobs.name") == name]


@pytest.fixture
def big_working_dir(tmp_path):
    """48 MiB of incompressible files, so that hashing, zipping and uploading take seconds; removed afterwards."""
    working_dir = tmp_path / "big-working-dir"
    working_dir.mkdir()
    for index in range(24):
        (working_dir / f"blob-{index}.bin").write_bytes(os.urandom(2 * 1024**2))
    yield working_dir
    shutil.rmtree(working_dir, ignore_errors=True)


def test_ctrl_c_while_uploading_the_working_dir_submits_nothing(ray_cluster_home, rj, tmp_path, big_working_dir):
    spec = tmp_path / "big-upload.yaml"
    spec.write_text(f"name: big-upload\nruntime_env:\n  working_dir: {big_working_dir}\nentrypoint: echo never\n")

    process = popen_rayjobs("submit", str(spec), home=ray_cluster_home)
    try:
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "packaging and uploading working_dir" in line:
                process.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"it never said it was uploading; its stderr:\n{''.join(seen)}")
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = "".join(seen) + stderr
    assert process.returncode == 130, stderr
    assert "rayjobs: interrupted: nothing was submitted" in stderr
    assert "Aborted!" not in stdout + stderr
    assert "Traceback" not in stderr
    assert "submitted big-upload as" not in stderr
    assert jobs_named(rj, "big-upload") == []


# Through Ray's client, which a job with a working_dir to upload takes; the direct request of a job with
# nothing to upload is interrupted the same way in tests/test_submit_direct.py.
@pytest.mark.parametrize("stop_on_interrupt", [False, True], ids=["detach", "stop"])
def test_ctrl_c_once_the_job_request_went_out_names_the_job(ray_cluster, monkeypatch, tmp_path, stop_on_interrupt):
    from ray.job_submission import JobSubmissionClient
    from typer.testing import CliRunner

    from runner.cli import app
    from runner.local import loopback_env

    # Ctrl-C lands just after the job request was answered, before rayjobs saw the answer.
    real_request = JobSubmissionClient._do_request

    def request_then_interrupt(self, method, endpoint, *args, **kwargs):
        response = real_request(self, method, endpoint, *args, **kwargs)
        if method == "POST" and endpoint.rstrip("/") == "/api/jobs":
            raise KeyboardInterrupt
        return response

    monkeypatch.setattr(JobSubmissionClient, "_do_request", request_then_interrupt)
    name = f"interrupted-{'stop' if stop_on_interrupt else 'detach'}"
    (tmp_path / "code").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: {name}\nruntime_env:\n  working_dir: {tmp_path / 'code'}\n{SLOW_JOB}")
    flags = ["--stop-on-interrupt"] if stop_on_interrupt else []
    result = CliRunner().invoke(app, ["submit", str(spec), *flags], env=loopback_env())

    assert result.exit_code == 130, result.output
    assert "Aborted!" not in result.output
    job_id = next(word.strip("`;,") for word in result.stderr.split() if word.startswith("raysubmit_"))
    api = _api_of(ray_cluster)
    if stop_on_interrupt:
        assert f"interrupted: stopping job {job_id} (--stop-on-interrupt)" in result.stderr
        wait_for_condition(lambda: api.get_job(job_id)["status"] == "STOPPED", timeout_s=60)
    else:
        assert (f"interrupted: job {job_id} was submitted and keeps running; follow it with "
                f"`rayjobs logs --follow {job_id}`") in result.stderr
        assert api.get_job(job_id)["status"] in ("PENDING", "RUNNING")
        api.stop_job(job_id)


def _api_of(cluster):
    from runner.api import JobsApi
    from runner.connection import Connection

    return JobsApi(Connection(address=cluster.dashboard_url, source="test", headers=cluster.auth_headers()))
