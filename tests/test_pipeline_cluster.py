"""A pipeline run on the session cluster, through the real `rayjobs` command: its jobs run in the graph's order, each
knowing where the jobs it ran after kept their runs; a job that fails ends the jobs after it without running; the run
is the cluster's, so a client may leave and `status`/`stop` find it by its id."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

from tests.support.cli import direct_api
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

READS_PREP = ("python -c \"import json, os, pathlib; folder = pathlib.Path(os.environ['RAYJOBS_AFTER_PREP']); "
              "print('prep was', json.loads((folder / 'run.json').read_text())['status'])\"")


def _pipeline(folder: Path, prep_entrypoint: str) -> Path:
    records = folder / "records"
    for name, entrypoint in (("prep", prep_entrypoint), ("train", READS_PREP),
                             ("evaluate", "python -c \"print('evaluated')\"")):
        (folder / f"{name}.yaml").write_text(f"name: {name}\nentrypoint: {json.dumps(entrypoint)}\n"
                                             f"record_path: {records}\n")
    path = folder / "pipeline.yaml"
    path.write_text("pipeline: chain\njobs:\n"
                    "  evaluate:\n    spec: evaluate.yaml\n    after: [train]\n"
                    "  train:\n    spec: train.yaml\n    after: [prep]\n"
                    "  prep:\n    spec: prep.yaml\n")
    return path


def test_a_pipeline_runs_its_jobs_in_order_each_reading_where_the_one_before_kept_its_run(rayjobs_cli, ray_cluster,
                                                                                        tmp_path):
    result = rayjobs_cli("submit", str(_pipeline(tmp_path, "python -c \"print('prepared')\"")))
    assert result.returncode == 0, result.stderr
    run_id = result.stderr.split("submitted pipeline chain as ", 1)[1].split(":", 1)[0]
    api = direct_api(ray_cluster)
    started = {name: float(api.get_job(f"{run_id}-{name}")["start_time"]) for name in ("prep", "train", "evaluate")}
    ended = {name: float(api.get_job(f"{run_id}-{name}")["end_time"]) for name in ("prep", "train", "evaluate")}
    assert ended["prep"] <= started["train"] and ended["train"] <= started["evaluate"]
    assert "prep was SUCCEEDED" in api.job_log(f"{run_id}-train")
    for name in ("prep", "train", "evaluate"):
        assert f"{run_id}: {name} SUCCEEDED" in result.stderr, result.stderr
    status = rayjobs_cli("status", run_id, "--output", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["states"] == {"prep": "SUCCEEDED", "train": "SUCCEEDED", "evaluate": "SUCCEEDED"}


def test_a_job_that_fails_ends_every_job_after_it_without_running_and_the_run_exits_failed(rayjobs_cli, ray_cluster,
                                                                                          tmp_path):
    submitted = rayjobs_cli("submit", str(_pipeline(tmp_path, "python -c \"raise SystemExit(3)\"")), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    api = direct_api(ray_cluster)

    def ended() -> dict | None:
        shown = rayjobs_cli("status", run_id, "--output", "json")
        states = json.loads(shown.stdout)["states"] if shown.stdout.strip() else {}
        return states if states and all(state in ("SUCCEEDED", "FAILED", "STOPPED") or state.startswith("not run")
                                        for state in states.values()) else None

    states = wait_for_condition(ended, timeout_s=HANG_GUARD_S, interval_s=1)
    assert states["prep"] == "FAILED"
    assert states["train"] == f"not run ({run_id}-prep failed: Job entrypoint command failed with exit code 3)", states
    assert states["evaluate"].startswith(f"not run ({run_id}-train was not run"), states
    for name in ("train", "evaluate"):
        printed = api.job_log(f"{run_id}-{name}").splitlines()
        assert not [line for line in printed if line.startswith("prep was") or line == "evaluated"], printed
    assert rayjobs_cli("status", run_id).returncode == 1


def test_the_worked_example_trains_two_settings_on_what_prep_wrote_and_names_the_better(rayjobs_cli, ray_cluster,
                                                                                       tmp_path):
    # specs/pipelines/quickstart-lr.yaml at tiny sizes: the same graph, jobs and specs, with overrides for a test.
    repo = Path(__file__).resolve().parents[1]
    tiny = [f"workload.data.output_dir={tmp_path / 'data'}", f"workload.storage_path={tmp_path / 'runs'}",
            "workload.data.synthetic_per_class=6", "workload.data.image_size=16", "workload.train.epochs=1",
            "workload.train.batch_size=8"]
    example = (repo / "specs" / "pipelines" / "quickstart-lr.yaml").read_text()
    assert "set: [\"workload.stages=[preprocess]\"]" in example
    jobs = {"prep": ("quickstart.yaml", [], ["workload.stages=[preprocess]"]),
            "train-fast": ("quickstart.yaml", ["prep"], ["workload.stages=[train]", "workload.train.lr=0.003"]),
            "train-slow": ("quickstart.yaml", ["prep"], ["workload.stages=[train]", "workload.train.lr=0.0005"]),
            "compare": ("pipelines/compare.yaml", ["train-fast", "train-slow"], [])}
    lines = ["pipeline: quickstart-lr", "jobs:"]
    for name, (spec, after, overrides) in jobs.items():
        overrides = overrides + (tiny if spec == "quickstart.yaml" else [])
        lines += [f"  {name}:", f"    spec: {repo / 'specs' / spec}", f"    after: {json.dumps(after)}",
                  f"    set: {json.dumps(overrides)}"]
    path = tmp_path / "pipeline.yaml"
    path.write_text("\n".join(lines) + "\n")

    result = rayjobs_cli("submit", str(path))
    assert result.returncode == 0, result.stderr
    run_id = result.stderr.split("submitted pipeline quickstart-lr as ", 1)[1].split(":", 1)[0]
    compared = direct_api(ray_cluster).job_log(f"{run_id}-compare")
    best = [line for line in compared.splitlines() if line.startswith("best: ")]
    assert best and best[0].split()[1] in ("train-fast", "train-slow"), compared
    # Each training is a run of its own, named after its job: the two settings never share a folder.
    runs = sorted(folder.name for folder in (tmp_path / "runs").iterdir())
    assert runs == sorted(f"quickstart-{run_id}-{name}" for name in ("prep", "train-fast", "train-slow")), runs


def _keeper_process(api):
    """The queue keeper's live process on the session cluster, from Ray's state API."""
    import psutil

    query = urllib.parse.urlencode({"filter_keys": "name", "filter_predicates": "=",
                                    "filter_values": "rayjobs-queue-keeper", "detail": "true"})
    alive = [actor for actor in api.get_json(f"/api/v0/actors?{query}")["data"]["result"]["result"]
             if actor.get("state") == "ALIVE"]
    return psutil.Process(int(alive[0]["pid"])) if alive else None


def test_the_keeper_sigkilled_twice_while_a_pipeline_is_half_done_runs_each_job_once_in_order(rayjobs_cli,
                                                                                            ray_cluster, tmp_path):
    flag = tmp_path / "release-prep"
    held_prep = ("python -c \"import pathlib, time; print('prep started', flush=True); "
                 f"[time.sleep(0.1) for _ in iter(lambda: pathlib.Path({str(flag)!r}).exists(), True)]; "
                 "print('prepared')\"")
    submitted = rayjobs_cli("submit", str(_pipeline(tmp_path, held_prep)), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    api = direct_api(ray_cluster)

    def status_of(name: str) -> str | None:
        try:
            return api.get_job(f"{run_id}-{name}")["status"]
        except Exception:  # noqa: BLE001 - not in Ray's table yet
            return None

    wait_for_condition(lambda: status_of("prep") == "RUNNING", timeout_s=HANG_GUARD_S)
    # Once while prep runs and the rest wait on the graph, once the moment prep has succeeded.
    first = wait_for_condition(lambda: _keeper_process(api), timeout_s=HANG_GUARD_S)
    first.kill()
    flag.touch()
    wait_for_condition(lambda: status_of("prep") == "SUCCEEDED", timeout_s=HANG_GUARD_S, interval_s=0.05)
    second = wait_for_condition(lambda: (found := _keeper_process(api)) and found.pid != first.pid and found,
                                timeout_s=HANG_GUARD_S, interval_s=0.05)
    second.kill()
    wait_for_condition(lambda: status_of("evaluate") in ("SUCCEEDED", "FAILED", "STOPPED"), timeout_s=HANG_GUARD_S,
                       interval_s=1)

    ours = sorted(info["submission_id"] for info in api.list_jobs()
                  if str(info.get("submission_id", "")).startswith(run_id))
    assert ours == sorted(f"{run_id}-{name}" for name in ("prep", "train", "evaluate")), ours  # no job ran twice
    jobs = {name: api.get_job(f"{run_id}-{name}") for name in ("prep", "train", "evaluate")}
    assert {name: info["status"] for name, info in jobs.items()} == dict.fromkeys(jobs, "SUCCEEDED")
    assert jobs["prep"]["end_time"] <= jobs["train"]["start_time"] <= jobs["train"]["end_time"] <= \
        jobs["evaluate"]["start_time"]
    assert api.job_log(f"{run_id}-prep").splitlines().count("prep started") == 1
    assert api.job_log(f"{run_id}-train").splitlines().count("prep was SUCCEEDED") == 1
    status = rayjobs_cli("status", run_id, "--output", "json")
    assert json.loads(status.stdout)["states"] == {"prep": "SUCCEEDED", "train": "SUCCEEDED", "evaluate": "SUCCEEDED"}
