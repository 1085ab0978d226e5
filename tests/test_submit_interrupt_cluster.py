"""Ctrl-C while `rayjobs submit` is still submitting: exit 130, and say whether a job was created."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from tests.support.cli import direct_api, popen_rayjobs
from tests.support.waiting import wait_for_condition


SLOW_JOB = "entrypoint: python -c \"import time; time.sleep(120)\"\n"


def jobs_named(rayjobs_cli, name: str) -> list[dict]:
    listed = rayjobs_cli("list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    return [job for job in json.loads(listed.stdout) if (job.get("metadata") or {}).get("rayjobs.name") == name]


@pytest.fixture
def big_working_dir(tmp_path):
    """A working_dir big enough to be announced, whose packaging stops at a named pipe nobody writes to.

    Ray hashes a working_dir by opening each entry, and opening a named pipe waits for a writer. So
    packaging holds at the pipe and the Ctrl-C always lands in mid-packaging, however loaded the
    machine (with plain files, a busy machine could finish the upload before the signal arrived).
    """
    working_dir = tmp_path / "big-working-dir"
    working_dir.mkdir()
    (working_dir / "blob.bin").write_bytes(os.urandom(17 * 1024**2))
    os.mkfifo(working_dir / "held-open.pipe")
    yield working_dir
    shutil.rmtree(working_dir, ignore_errors=True)


def test_ctrl_c_while_uploading_the_working_dir_submits_nothing(ray_cluster_home, rayjobs_cli, tmp_path,
                                                                big_working_dir):
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
        # A hang guard, not a time limit: under a full suite on 2 cores the interrupted upload once took over
        # 60 s to wind down, while alone it ends in a few seconds.
        stdout, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = "".join(seen) + stderr
    assert process.returncode == 130, stderr
    assert "rayjobs: interrupted: nothing was submitted" in stderr, stderr
    assert "Aborted!" not in stdout + stderr, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert "submitted big-upload as" not in stderr, stderr
    assert jobs_named(rayjobs_cli, "big-upload") == []


# A job request goes out one of two ways: straight to the job API (nothing to upload), or through Ray's
# client (a working_dir to upload). One case detaches, the other stops the job.
@pytest.mark.parametrize("through_ray_client, stop_on_interrupt", [(False, False), (True, True)],
                         ids=["direct-request-detach", "ray-client-stop"])
def test_ctrl_c_once_the_job_request_went_out_names_the_job(ray_cluster, monkeypatch, tmp_path, through_ray_client,
                                                            stop_on_interrupt):
    from ray.job_submission import JobSubmissionClient
    from typer.testing import CliRunner

    from runner.client.jobs_api import JobsApi
    from runner.cli.app import app
    from runner.local import loopback_env

    # Ctrl-C lands just after the job request was answered, before rayjobs saw the answer.
    if through_ray_client:
        real_request = JobSubmissionClient._do_request

        def request_then_interrupt(self, method, endpoint, *args, **kwargs):
            response = real_request(self, method, endpoint, *args, **kwargs)
            if method == "POST" and endpoint.rstrip("/") == "/api/jobs":
                raise KeyboardInterrupt
            return response

        monkeypatch.setattr(JobSubmissionClient, "_do_request", request_then_interrupt)
    else:
        real_create_job = JobsApi.create_job

        def create_then_interrupt(self, request):
            real_create_job(self, request)
            raise KeyboardInterrupt

        monkeypatch.setattr(JobsApi, "create_job", create_then_interrupt)
    name = f"interrupted-{'stop' if stop_on_interrupt else 'detach'}"
    runtime_env = ""
    if through_ray_client:
        (tmp_path / "code").mkdir()
        runtime_env = f"runtime_env:\n  working_dir: {tmp_path / 'code'}\n"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: {name}\n{runtime_env}{SLOW_JOB}")
    flags = ["--stop-on-interrupt"] if stop_on_interrupt else []
    result = CliRunner().invoke(app, ["submit", str(spec), *flags], env=loopback_env())

    assert result.exit_code == 130, result.output
    assert "Aborted!" not in result.output
    job_id = next(word.strip("`;,") for word in result.stderr.split() if word.startswith("raysubmit_"))
    api = direct_api(ray_cluster)
    assert api.get_job(job_id)["metadata"]["rayjobs.name"] == name
    if stop_on_interrupt:
        assert f"interrupted: stopping job {job_id} (--stop-on-interrupt)" in result.stderr
        wait_for_condition(lambda: api.get_job(job_id)["status"] == "STOPPED", timeout_s=60)
    else:
        assert (f"interrupted: job {job_id} was submitted and keeps running; follow it with "
                f"`rayjobs logs --follow {job_id}`") in result.stderr
        assert api.get_job(job_id)["status"] in ("PENDING", "RUNNING")
        api.stop_job(job_id)

