"""A run record that outlives its cluster: a job submitted with ``--no-wait`` keeps its record in S3 (the
moto server) while it runs; the head node is SIGKILLed mid-run and the cluster taken down; then the record
is read with no cluster at all. What a followed job keeps, and its stacks, is checked in
tests/test_progress_cluster.py; the keeper itself in tests/test_record.py."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from runner.local.state import LocalCluster
from runner.records.report import LOST, run_status
from runner.records.store import Folder, attempt_log, read_run
from tests.support.cli import cli_env, own_cluster, run_rayjobs
from tests.support.ray_instances import kill_processes
from tests.support.s3_server import aws_variables, create_bucket
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

COUNTING = """
import itertools, time
for i in itertools.count():
    print(f"line {i} at {time.time():.3f}", flush=True)
    time.sleep(0.05)
"""


def _cluster_processes(cluster: LocalCluster) -> list[psutil.Process]:
    """Every process of the cluster, the job's driver among them: they all carry its token file's path."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if process.environ().get("RAY_AUTH_TOKEN_PATH") == cluster.token_file:
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.cluster  # its own cluster, started through the CLI: its head node dies
def test_a_record_in_s3_survives_the_head_nodes_death_complete_to_its_last_upload(tmp_path, s3_endpoint):
    create_bucket(s3_endpoint, "records")
    aws = aws_variables(s3_endpoint)
    home = tmp_path / "home"
    env = cli_env(home, **aws)
    code = tmp_path / "code"
    code.mkdir()
    (code / "count.py").write_text(COUNTING)
    env_vars = "".join(f"    {name}: '{value}'\n" for name, value in aws.items())
    spec = tmp_path / "counting.yaml"
    spec.write_text(f"name: counting\nentrypoint: python count.py\nrecord_path: s3://records/runs\n"
                    f"record_every_s: 1\nruntime_env:\n  working_dir: {code}\n  env_vars:\n{env_vars}")

    with own_cluster("doomed", home, env) as cluster:
        submitted = run_rayjobs("submit", str(spec), "--no-wait", "--cluster", "doomed", home=home, env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        with pytest.MonkeyPatch.context() as patch:
            for name, value in aws.items():
                patch.setenv(name, value)
            run = Folder(f"s3://records/runs/counting-{job_id}")
            # Nobody follows the job: what is in S3 was put there by the job itself, once a second
            # (record_every_s), so looking more often would only add reads.
            wait_for_condition(lambda: attempt_log(run, job_id).count(b"\nline ") >= 30, timeout_s=HANG_GUARD_S,
                               interval_s=1)
            # session_latest links to the session's folder: one file, found under two names.
            (driver_log,) = {path.resolve() for path in
                             Path(cluster.temp_dir).glob(f"session_*/logs/job-driver-{job_id}.log")}

            victims = _cluster_processes(cluster)
            assert any("rayjobs_agent.supervisor" in " ".join(p.cmdline()) for p in victims), "the keeper dies too"
            kill_processes(victims)
            psutil.wait_procs(victims, timeout=HANG_GUARD_S)
            written = driver_log.read_bytes()
            document, saved = read_run(run), attempt_log(run, job_id)

    (attempt,) = document["attempts"]
    assert document["status"] == "RUNNING", "nobody was left to say how it ended"
    assert run_status(document, now=attempt["updated"] + 3600) == LOST
    # Complete to the last upload: the bytes it counted then are the driver log's first bytes, exactly.
    # (The kill may land between an upload's log part and its run.json: the part may then hold more.)
    assert len(saved) >= attempt["log_bytes"] and written.startswith(saved)
    numbers = [int(line.split()[1]) for line in saved.decode().splitlines() if line.startswith("line ")]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 30

    # With no cluster left: the commands read the record alone.
    listed = run_rayjobs("runs", "s3://records/runs", "--output", "json", home=home, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [entry["run"] for entry in json.loads(listed.stdout)] == [f"counting-{job_id}"]
    logs = run_rayjobs("logs", f"s3://records/runs/counting-{job_id}", home=home, env=env)
    assert logs.returncode == 0 and logs.stdout.encode() == saved
    shown = json.loads(run_rayjobs("show", f"s3://records/runs/counting-{job_id}", "--output", "json",
                                   home=home, env=env).stdout)
    shown_secret = shown["spec"]["runtime_env"]["env_vars"]["AWS_SECRET_ACCESS_KEY"]
    assert shown_secret and set(shown_secret) == {"*"}, "secrets stay masked"
