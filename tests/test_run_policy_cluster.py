"""Spec policies that need a cluster: retries, idempotent submission ids, masked secrets."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.cli import popen_rayjobs, run_rayjobs, write_spec
from tests.support.waiting import HANG_GUARD_S

# Three submitters at once already race for one id; each is a `rayjobs` process following the job to its end.
SUBMITTERS = 3


def test_retry_on_exit_code_runs_the_entrypoint_again_in_the_same_job(rayjobs_cli, tmp_path):
    marker = tmp_path / "first-attempt-done"
    # Fails with exit code 3 the first time, succeeds the second.
    entrypoint = (f"python -c \"import os, sys; m='{marker}'; first = not os.path.exists(m); "
                  f"open(m, 'w').close(); print('attempt', 'first' if first else 'again'); sys.exit(3 if first else 0)\"")
    spec = write_spec(tmp_path, "flaky", f"entrypoint: {entrypoint}\nmax_retries: 2\nretry_on: ['exit_code:3']\n"
                                         "retry_backoff: {initial_s: 1}\n")
    result = rayjobs_cli("submit", str(spec), "--output", "json")
    assert result.returncode == 0, result.stderr
    assert "rayjobs: attempt 1 failed with exit_code:3 (in retry_on); running attempt 2 of 3 in 1s (retry_backoff)" \
        in result.stderr
    assert "attempt first" in result.stderr and "attempt again" in result.stderr  # the job's log, one Ray job
    summary = json.loads(result.stdout)
    assert len(summary["attempts"]) == 1 and summary["progress"]["job_attempts"] == 2
    status = rayjobs_cli("status", summary["submission_id"])
    assert "attempts: 2 in this job (attempt 1 failed with exit_code:3, and it ran again)" in \
        " ".join(status.stdout.split()), status.stdout


def test_a_missing_module_is_never_retried(rayjobs_cli, tmp_path):
    # retry_on takes any failure of the entrypoint, and max_retries allows three more attempts: a module that
    # is missing now is missing then too, so it fails once. (Exit codes outside retry_on: tests/test_run_policy.py.)
    spec = write_spec(tmp_path, "no-retry", "entrypoint: python -c \"import rayjobs_no_such_module\"\n"
                                            "max_retries: 3\nretry_on: [JOB_ENTRYPOINT_COMMAND_ERROR]\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 1
    assert "submitting attempt" not in result.stderr
    assert ("not retried, although max_retries is 3: the failure is module_missing, and a missing module is "
            "missing again in the next attempt") in result.stderr


@pytest.fixture(scope="module")
def fixed_job(ray_cluster_home, tmp_path_factory) -> dict:
    """One job with a fixed submission id and secrets in its environment, submitted with `--output json`.

    Each job costs the cluster a driver and a worker process: this one serves both the attach-or-conflict test
    and the masking test."""
    directory = tmp_path_factory.mktemp("fixed")
    job_id = f"fixed-{uuid.uuid4().hex[:8]}"
    spec = directory / "fixed.yaml"
    spec.write_text(f"name: fixed\nentrypoint: echo fixed-id-job\nsubmission_id: {job_id}\n"
                    "runtime_env:\n  env_vars:\n    DB_PASSWORD: hunter2\n    PLAIN_BUT_PRIVATE: swordfish\n"
                    "    VISIBLE: shown\nsecret_env_vars: [PLAIN_BUT_PRIVATE]\n")
    first = run_rayjobs("submit", str(spec), "--output", "json", home=ray_cluster_home)
    return {"job_id": job_id, "spec": spec, "first": first}


def test_fixed_submission_id_attaches_or_conflicts(fixed_job, rayjobs_cli):
    job_id, spec = fixed_job["job_id"], fixed_job["spec"]
    first = fixed_job["first"]
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["submission_id"] == job_id
    again = rayjobs_cli("submit", str(spec))
    assert again.returncode == 0, again.stderr
    assert f"job {job_id} was already submitted from this spec" in again.stderr
    assert "fixed-id-job" in again.stdout
    changed = spec.with_name("changed.yaml")
    changed.write_text(spec.read_text().replace("echo fixed-id-job", "echo something else"))
    conflict = rayjobs_cli("submit", str(changed))
    assert conflict.returncode == 2
    assert f"submission_id '{job_id}' is already taken by a job with different content" in conflict.stderr


def test_submitters_of_one_spec_started_at_once_share_one_job(rayjobs_cli, ray_cluster_home, tmp_path):
    # As CI retries and parallel pipelines start them: every submitter finds the id free at first.
    job_id = f"race-{uuid.uuid4().hex[:8]}"
    spec = tmp_path / "race.yaml"
    spec.write_text(f"name: race\nentrypoint: python -c \"print('race-job-ran')\"\nsubmission_id: {job_id}\n")
    submitters = [popen_rayjobs("submit", str(spec), home=ray_cluster_home) for _ in range(SUBMITTERS)]
    outputs = [process.communicate(timeout=HANG_GUARD_S) for process in submitters]
    finished = [(process.returncode, out, err) for process, (out, err) in zip(submitters, outputs)]
    assert [code for code, _, _ in finished] == [0] * SUBMITTERS, [err for _, _, err in finished]
    assert sum(f"submitted race as {job_id}" in err for _, _, err in finished) == 1, [err for _, _, err in finished]
    assert sum("was already submitted from this spec" in err for _, _, err in finished) == SUBMITTERS - 1
    assert all("race-job-ran" in out for _, out, _ in finished)
    jobs = json.loads(rayjobs_cli("list", "--output", "json").stdout)
    assert [job["submission_id"] for job in jobs].count(job_id) == 1

    other = tmp_path / "other.yaml"
    other.write_text(f"name: other\nentrypoint: echo another spec\nsubmission_id: {job_id}\n")
    conflict = rayjobs_cli("submit", str(other))
    assert conflict.returncode == 2
    assert f"submission_id '{job_id}' is already taken by a job with different content" in conflict.stderr


def test_secrets_masked_in_status_and_list(fixed_job, rayjobs_cli):
    result = fixed_job["first"]
    assert result.returncode == 0, result.stderr
    job_id = json.loads(result.stdout)["submission_id"]
    for output in (rayjobs_cli("status", job_id, "--output", "json").stdout,
                   rayjobs_cli("list", "--output", "json").stdout):
        assert "hunter2" not in output and "swordfish" not in output
    env = json.loads(rayjobs_cli("status", job_id, "--output", "json").stdout)["runtime_env"]["env_vars"]
    assert env == {"DB_PASSWORD": "***", "PLAIN_BUT_PRIVATE": "***", "VISIBLE": "shown"}
    assert "hunter2" not in result.stdout + result.stderr


def test_entrypoint_no_node_can_host_is_refused_before_submission(rayjobs_cli, tmp_path):
    before = {job.get("submission_id") for job in json.loads(rayjobs_cli("list", "--output", "json").stdout)}
    spec = write_spec(tmp_path, "needs-gpu", "entrypoint: echo never\nentrypoint_num_gpus: 1\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 2, result.stderr
    assert "the entrypoint asks for GPU 1, but the largest of the cluster's 1 node(s) offers GPU 0" in result.stderr
    after = {job.get("submission_id") for job in json.loads(rayjobs_cli("list", "--output", "json").stdout)}
    assert after == before


def test_start_timeout_stops_a_job_left_pending(rayjobs_cli, tmp_path):
    # The blocker holds both of the cluster's CPUs, so the second job cannot start.
    blocker = write_spec(tmp_path, "blocker", "entrypoint: python -c \"import time; time.sleep(120)\"\n"
                                              "entrypoint_num_cpus: 2\n")
    blocker_id = rayjobs_cli("submit", str(blocker), "--no-wait").stdout.strip()
    try:
        waiting = write_spec(tmp_path, "waiting", "entrypoint: echo never\nentrypoint_num_cpus: 2\n"
                                                  "start_timeout_s: 3\n")
        result = rayjobs_cli("submit", str(waiting))
        assert result.returncode == 5, result.stderr
        assert "still PENDING after 3s (start_timeout_s)" in result.stderr
        assert "which asks for CPU 2" in result.stderr and "The stop is queued" in result.stderr
    finally:
        rayjobs_cli("stop", blocker_id, "--wait")
