"""The agent's resource sampler in a real job on the session cluster: the samples kept in the record count the job's
Ray actors (processes that are no children of its entrypoint), each attempt of a retry in place counts the workers
of its own driver, and ``rayjobs show`` prints the totals and the cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import cli_env


@pytest.mark.cluster
def test_a_real_job_keeps_its_samples_in_the_record_and_show_prints_the_totals(rayjobs_cli, ray_cluster_home,
                                                                                tmp_path: Path):
    code = tmp_path / "code"
    code.mkdir()
    # Two Ray actors of the job each hold 300 MiB and spin while the driver waits: the samples must count the actors
    # (found by the job's id, in processes that are no children of the entrypoint) and the driver.
    (code / "spin.py").write_text(
        "import time, ray\nray.init()\n@ray.remote(num_cpus=1)\nclass Spin:\n"
        "    def run(self, s):\n        held = bytearray(300 << 20)\n        end = time.time() + s\n"
        "        while time.time() < end: pass\n        return len(held)\n"
        "ray.get([Spin.remote().run.remote(8) for _ in range(2)])\n")
    records = tmp_path / "records"
    spec = tmp_path / "spin.yaml"
    spec.write_text(f"name: spin\nentrypoint: python spin.py\nrecord_path: {records}\nrecord_every_s: 1\n"
                    f"runtime_env:\n  working_dir: {code}\n  env_vars:\n    RAYJOBS_RESOURCES_EVERY_S: '1'\n")
    submitted = rayjobs_cli("submit", str(spec), "--output", "json")
    assert submitted.returncode == 0, submitted.stderr
    (run,) = records.iterdir()
    (events,) = run.glob("run-record/events/*/*.jsonl")
    samples = [event for event in map(json.loads, events.read_text().splitlines()) if event["event"] == "resources"]
    assert len(samples) >= 3, samples
    assert max(sample["rss_bytes"] for sample in samples) > 600 << 20, samples
    assert max(sample["processes"] for sample in samples) >= 3, samples
    assert max(sample["cpu"] for sample in samples) > 0.5, samples
    shown = rayjobs_cli("show", str(run), env={**cli_env(ray_cluster_home), "RAYJOBS_PRICE_CPU_HOUR": "0.5"})
    assert shown.returncode == 0, shown.stderr
    assert "resources:" in shown.stdout and "core·h" in shown.stdout and "cost: " in shown.stdout
    as_json = json.loads(rayjobs_cli("show", str(run), "--output", "json").stdout)
    assert as_json["resource_totals"]["samples"] == len(samples)
    assert as_json["resource_totals"]["cpu_hours"] > 0
    assert as_json["attempts"][0]["resources"]["samples"] == len(samples)


# Each attempt runs two Ray tasks of its own driver that burn 2 CPU-seconds each in Ray workers (no children of the
# entrypoint), and says what they and the driver itself used; the first attempt then fails with exit code 3.
BURN_IN_WORKERS = """
import os, resource, sys, time, ray
ray.init()
@ray.remote(num_cpus=1)
def burn(seconds):
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass
    return time.process_time() - started
burnt = sum(ray.get([burn.remote(2.0) for _ in range(2)]))
mine = resource.getrusage(resource.RUSAGE_SELF)
print("attempt used", burnt, mine.ru_utime + mine.ru_stime, flush=True)
if not os.path.exists(sys.argv[1]):
    open(sys.argv[1], "w").close()
    sys.exit(3)
"""


@pytest.mark.cluster
def test_each_attempt_of_a_retry_in_place_counts_the_ray_workers_of_its_own_driver(rayjobs_cli, tmp_path: Path):
    # A retry in place starts a new driver, and so a new Ray job whose workers carry its new id: the second
    # attempt's record counts its workers too, not its driver alone.
    code = tmp_path / "code"
    code.mkdir()
    (code / "burn.py").write_text(BURN_IN_WORKERS)
    records = tmp_path / "records"
    spec = tmp_path / "burn.yaml"
    spec.write_text(f"name: burn\nentrypoint: python burn.py {tmp_path / 'failed-once'}\nrecord_path: {records}\n"
                    "record_every_s: 1\nmax_retries: 1\nretry_on: ['exit_code:3']\nretry_backoff: {initial_s: 1}\n"
                    f"runtime_env:\n  working_dir: {code}\n  env_vars:\n    RAYJOBS_RESOURCES_EVERY_S: '1'\n")
    submitted = rayjobs_cli("submit", str(spec), "--output", "json")
    assert submitted.returncode == 0, submitted.stderr
    said = [line.split("attempt used ")[1].split() for line in submitted.stderr.splitlines() if "attempt used " in line]
    assert len(said) == 2, submitted.stderr
    (run,) = records.iterdir()
    attempts = json.loads((run / "run.json").read_text())["attempts"]
    assert [attempt["status"] for attempt in attempts] == ["FAILED", "SUCCEEDED"]
    for attempt, (burnt, driver) in zip(attempts, said):
        # The workers' part is at least what they burnt; what Ray's workers spend starting comes on top.
        assert attempt["resources"]["cpu_core_s"] >= float(burnt) + float(driver) - 0.5, (attempt, burnt, driver)
