"""The agent's resource sampler in a real job on the session cluster: the samples kept in the record count the job's
Ray actors (processes that are no children of its entrypoint), and ``rayjobs show`` prints the totals and the cost."""

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
