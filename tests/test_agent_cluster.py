"""One authority for a run's facts, on a real cluster: the agent beside the job decides why it failed, whether it
runs again and whether it waits; the terminal, ``rayjobs status``, the run record and a notification all show that
one decision, whoever follows the job and however."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.cli import direct_api, run_rayjobs
from tests.support.notify_receivers import webhook_receiver
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

# Attempt 1 fails of a collective timeout (retried: it is in retry_on), attempt 2 of a missing module (never
# retried, whatever the spec says). The marker file tells the attempts apart; each way of following has its own.
FLAKY_THEN_BROKEN = """
import pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text("attempt 1")
    print("(RayTrainWorker pid=7) [E ProcessGroupGloo.cpp:143] Timed out waiting 1800000ms for recv operation",
          flush=True)
    sys.exit(1)
import no_such_module_for_rayjobs
"""


def _spec(directory: Path, name: str, hook_url: str, marker: Path) -> Path:
    script = directory / "job.py"
    script.write_text(FLAKY_THEN_BROKEN)
    path = directory / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nentrypoint: python {script} {marker}\nrecord_path: {directory / 'records'}\n"
        "max_retries: 2\nretry_on: [collective_timeout, JOB_ENTRYPOINT_COMMAND_ERROR]\n"
        "retry_backoff: {initial_s: 0}\n"
        f"notify:\n  - url: {hook_url}\n    on: [failed, retry]\n")
    return path


def _ended(cluster, job_id: str) -> bool:
    return direct_api(cluster).get_job(job_id)["status"] in ("SUCCEEDED", "FAILED", "STOPPED")


@pytest.fixture(scope="module")
def three_ways(ray_cluster, ray_cluster_home, tmp_path_factory) -> dict[str, dict]:
    """The same failing spec followed, followed with --quiet, and submitted with --no-wait: what each showed."""
    def rayjobs_cli(*args: str):
        return run_rayjobs(*args, home=ray_cluster_home)

    shown: dict[str, dict] = {}
    with webhook_receiver() as hook:
        for way, flags in (("followed", []), ("quiet", ["--quiet"]), ("no-wait", ["--no-wait"])):
            directory = tmp_path_factory.mktemp(way)
            spec = _spec(directory, f"authority-{way}", hook.url(f"/{way}"), directory / "marker")
            result = rayjobs_cli("submit", str(spec), *flags)
            job_id = re.search(r"as (raysubmit_\w+)", result.stderr)[1]
            wait_for_condition(lambda: _ended(ray_cluster, job_id), timeout_s=HANG_GUARD_S, interval_s=0.5)
            status = rayjobs_cli("status", job_id, "--output", "json")
            [run_file] = (directory / "records").rglob("run.json")
            shown[way] = {"submit": result, "status": json.loads(status.stdout), "status_code": status.returncode,
                          "record": json.loads(run_file.read_text()), "job_id": job_id}
        wait_for_condition(lambda: len(hook.received) >= 6, timeout_s=HANG_GUARD_S)
        for path, body in hook.received:
            shown[path.strip("/").split("?")[0]].setdefault("notified", []).append(body)
    return shown


@pytest.mark.parametrize("way", ["followed", "quiet", "no-wait"])
def test_a_run_ends_with_the_same_attempts_and_cause_however_it_is_followed(three_ways, way):
    seen = three_ways[way]
    record, status = seen["record"], seen["status"]
    assert status["status"] == "FAILED" and seen["status_code"] == 1
    assert [(attempt["attempt"], attempt["status"], attempt["cause"]["cause"]) for attempt in record["attempts"]] == \
        [(1, "FAILED", "collective_timeout"), (2, "FAILED", "module_missing")]
    assert {attempt["submission_id"] for attempt in record["attempts"]} == {seen["job_id"]}, "retried in place"
    assert record["cause"]["cause"] == status["diagnosis"]["cause"] == "module_missing"
    assert status["progress"]["job_attempts"] == 2
    assert [cause["cause"] for cause in status["progress"]["causes"]] == ["collective_timeout", "module_missing"]
    if way != "no-wait":
        assert seen["submit"].returncode == 1
    if way == "followed":
        stderr = seen["submit"].stderr
        assert "rayjobs: why: A module is missing on the cluster: no module named 'no_such_module_for_rayjobs'" in \
            stderr
        assert "submitting attempt" not in stderr, "the client decided nothing of its own"


def test_the_notification_names_the_cause_the_terminal_shows(three_ways):
    followed = three_ways["followed"]
    why = next(line for line in followed["submit"].stderr.splitlines() if line.startswith("rayjobs: why: "))
    ended = [body for body in followed["notified"] if body["title"].endswith("FAILED")]
    [message] = [body["message"] for body in ended]
    cause_line = next(line for line in message.splitlines() if line.startswith("cause: "))
    assert cause_line == f"cause: module_missing: {followed['status']['diagnosis']['text']}"
    assert followed["status"]["diagnosis"]["text"] in why
    retried = [body for body in followed["notified"] if body["title"].endswith("retried")]
    assert len(retried) == 1 and "attempt 1 failed (collective_timeout, exit code 1)" in retried[0]["message"]
    for way in ("quiet", "no-wait"):
        [other] = [body["message"] for body in three_ways[way]["notified"] if body["title"].endswith("FAILED")]
        assert "cause: module_missing: " in other


# A user's script: a Ray Dataset fed to a TorchTrainer whose workers take every CPU of the cluster, so Ray Data's
# tasks never get one. Ray Data warns after RAY_DATA_STARVATION_WARNING_DELAY_S (set low here; 60 s by default).
STARVED_TRAINING = """
import ray, ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

def loop(config):
    for batch in ray.train.get_dataset_shard("train").iter_batches(batch_size=8):
        pass
    ray.train.report({"done": 1})

ray.init()
workers = int(ray.cluster_resources()["CPU"])
TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=workers),
             datasets={"train": ray.data.range(100).map_batches(lambda batch: batch)}).fit()
"""


def test_ray_data_starved_by_the_training_workers_is_named_by_the_agent_with_nobody_following(
        ray_cluster, rayjobs_cli, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(STARVED_TRAINING)
    spec = tmp_path / "starved.yaml"
    spec.write_text("name: starved\nentrypoint: python train.py\nruntime_env:\n  working_dir: code\n"
                    "  env_vars:\n    RAY_DATA_STARVATION_WARNING_DELAY_S: '3'\n")
    submitted = rayjobs_cli("submit", str(spec), "--no-wait")
    job_id = re.search(r"as (raysubmit_\w+)", submitted.stderr)[1]
    try:
        def named() -> dict | None:
            status = json.loads(rayjobs_cli("status", job_id, "--output", "json").stdout)
            return status if status["progress"].get("waiting") else None

        status = wait_for_condition(named, timeout_s=HANG_GUARD_S, interval_s=2)
        text = rayjobs_cli("status", job_id).stdout
    except AssertionError:
        print(rayjobs_cli("logs", job_id).stdout[-6000:])
        raise
    finally:
        rayjobs_cli("stop", job_id)
        wait_for_condition(lambda: _ended(ray_cluster, job_id), timeout_s=HANG_GUARD_S, interval_s=0.5)
    waiting = status["progress"]["waiting"]
    assert re.fullmatch(r"waiting for resources: Ray Data's tasks of ReadRange->MapBatches\(<lambda>\) cannot start "
                        r"\(each needs a CPU by default\), and the (\d+) training workers hold all \1 CPUs", waiting), \
        waiting
    assert re.search(rf"^waiting: +{re.escape(waiting)}$", text, re.MULTILINE), text
    log = rayjobs_cli("logs", job_id).stdout
    assert f"rayjobs: {waiting}. Leave a CPU to Ray Data" in log
    assert '"event":"stall"' not in log, "a wait is not a stall"
