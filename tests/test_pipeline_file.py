"""A pipeline file read and checked before anything is sent: its graph, its names, and every spec it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.pipeline import PipelineError, graph_problems, is_pipeline_file, load_pipeline, topological_order

SPEC = "name: {name}\nentrypoint: echo {name}\n"


def write_pipeline(folder: Path, body: str, specs: dict[str, str] | None = None) -> Path:
    for name, text in (specs or {"step.yaml": SPEC.format(name="step")}).items():
        (folder / name).write_text(text)
    path = folder / "pipeline.yaml"
    path.write_text(body)
    return path


def test_a_pipeline_loads_each_spec_with_its_overrides_and_orders_every_job_after_those_it_runs_after(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: nightly\njobs:\n"
                          "  evaluate:\n    spec: step.yaml\n    after: [train-a, train-b]\n"
                          "  train-b:\n    spec: step.yaml\n    after: [prep]\n    set: [name=train-b]\n"
                          "  train-a:\n    spec: step.yaml\n    after: [prep]\n"
                          "  prep:\n    spec: step.yaml\n")
    loaded = load_pipeline(path)
    assert loaded.name == "nightly"
    assert loaded.order == ["prep", "train-a", "train-b", "evaluate"]
    assert loaded.jobs["train-b"].spec.name == "train-b" and loaded.jobs["train-a"].spec.name == "step"
    assert loaded.after["evaluate"] == ["train-a", "train-b"]


def test_a_job_whose_spec_names_no_queue_waits_in_the_pipelines_and_so_keeps_its_record(tmp_path):
    from jobs.submission import keeps_record

    path = write_pipeline(tmp_path, "pipeline: nightly\njobs:\n  prep:\n    spec: step.yaml\n"
                          "  train:\n    spec: step.yaml\n    after: [prep]\n    set: [queue=gpu]\n")
    loaded = load_pipeline(path)
    assert {name: job.spec.queue for name, job in loaded.jobs.items()} == {"prep": "nightly", "train": "gpu"}
    assert all(keeps_record(job, ships_code=False) for job in loaded.jobs.values())


def test_a_job_after_an_unknown_name_is_named_with_the_file_line_and_field(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: step.yaml\n"
                          "  train:\n    spec: step.yaml\n    after: [perp]\n")
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert str(raised.value) == (f"{path}:7: jobs.train.after[0]: no job 'perp' in this pipeline "
                                 "(did you mean 'prep'?)")


def test_a_cycle_through_three_jobs_is_refused_and_named(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n"
                          "  a:\n    spec: step.yaml\n    after: [c]\n"
                          "  b:\n    spec: step.yaml\n    after: [a]\n"
                          "  c:\n    spec: step.yaml\n    after: [b]\n")
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert "jobs.a.after: runs after itself through a → c → b → a" in str(raised.value)


def test_every_spec_that_fails_is_named_with_its_own_file_and_line_and_the_pipeline_with_its_own(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: bad.yaml\n"
                          "  train:\n    spec: step.yaml\n    set: [timeout_s=-1]\n    after: [prep, prep2]\n",
                          {"step.yaml": SPEC.format(name="step"), "bad.yaml": "name: bad\nentrypoint: x\nretries: 3\n"})
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    text = str(raised.value)
    assert f"{path}:8: jobs.train.after[1]: no job 'prep2'" in text
    assert f"{tmp_path / 'bad.yaml'}:3: retries: unknown field" in text
    assert "timeout_s" in text and "--set timeout_s=-1" in text


@pytest.mark.parametrize("name", ["x; touch /tmp/owned", "$(reboot)", "Prep", "a" * 41, "-x", "", "prep-attempt2",
                                  "train-attempt2-1"])
def test_a_name_a_shell_would_read_or_that_no_job_id_can_hold_is_refused(tmp_path, name):
    path = write_pipeline(tmp_path, f"pipeline: p\njobs:\n  {name!r}:\n    spec: step.yaml\n")
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert "jobs" in str(raised.value) and ("should match pattern" in str(raised.value)
                                            or "like the id of a retried job's next attempt" in str(raised.value))


def test_a_job_whose_spec_fixes_its_id_is_refused_since_the_pipeline_gives_each_run_its_own(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: step.yaml\n",
                          {"step.yaml": SPEC.format(name="step") + "submission_id: fixed-1\n"})
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert "fixes submission_id 'fixed-1'" in str(raised.value)


def test_graphs_of_hundreds_of_jobs_are_ordered_and_a_cycle_through_all_of_them_is_found():
    chain = {f"j{index}": [f"j{index - 1}"] if index else [] for index in range(500)}
    assert topological_order(chain)[:3] == ["j0", "j1", "j2"] and len(topological_order(chain)) == 500
    looped = {**chain, "j0": ["j499"]}
    ((where, message),) = graph_problems(looped)
    assert where == ("jobs", "j0", "after") and message.startswith("runs after itself through j0 → j499 → j498")


def test_a_pipeline_is_told_from_a_spec_by_its_fields():
    assert is_pipeline_file({"pipeline": "p", "jobs": {}})
    assert is_pipeline_file({"pipeline": "p", "job": {}}), "a misspelt `jobs` is the pipeline's error, not a spec's"
    assert not is_pipeline_file({"name": "x", "entrypoint": "y"})


def test_a_pipeline_is_never_exported_to_kuberay_half_way(tmp_path):
    from tests.support.cli import rayjobs_in_process

    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: step.yaml\n"
                          "  train:\n    spec: step.yaml\n    after: [prep]\n")
    result = rayjobs_in_process("export", "kuberay", str(path))
    assert result.returncode == 2
    assert "is a pipeline: KubeRay has no dependencies between RayJobs" in result.stderr
    assert result.stdout == ""


def test_a_pipelines_dry_run_shows_each_job_its_queue_and_what_it_runs_after_and_sends_nothing(tmp_path):
    from tests.support.cli import rayjobs_in_process

    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  train:\n    spec: step.yaml\n    after: [prep]\n"
                          "  prep:\n    spec: step.yaml\n")
    result = rayjobs_in_process("submit", str(path), "--dry-run", "--address", "http://127.0.0.1:9")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"prep: {tmp_path / 'step.yaml'} in queue p",
                                          f"train: {tmp_path / 'step.yaml'} in queue p, after prep"]


def test_the_shipped_pipelines_are_valid():
    shipped = sorted((Path(__file__).resolve().parents[1] / "specs" / "pipelines").glob("*.yaml"))
    pipelines = [path for path in shipped if path.read_text().lstrip("# \n").find("pipeline:") >= 0
                 and "jobs:" in path.read_text()]
    assert pipelines, "the project ships an example pipeline"
    for path in pipelines:
        loaded = load_pipeline(path)
        assert loaded.order[0] == "prep" and loaded.order[-1] == "compare"


def test_a_notify_section_with_one_jobs_event_or_an_unknown_scheme_is_refused_with_the_file_line_and_field(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: step.yaml\nnotify:\n"
                          "  - url: json://127.0.0.1:9/hook\n    on: [failed, stalled]\n"
                          "  - url: slak://T1/B2/C3\n")
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert str(raised.value).splitlines() == [
        (f"{path}:6: notify[0]: on: stalled is an event of one job; a pipeline notifies once, when its run ends "
         "(succeeded, failed, stopped): put it in the notify of the job's spec"),
        (f"{path}:8: notify[1].url: slak:// is not a scheme Apprise sends to (did you mean 'slack'?); see "
         "https://github.com/caronc/apprise/wiki for every service's URL"),
    ]


def test_a_pipelines_notify_section_is_read_as_a_specs_with_the_same_default_events(tmp_path):
    path = write_pipeline(tmp_path, "pipeline: p\njobs:\n  prep:\n    spec: step.yaml\nnotify:\n"
                          "  - url: json://127.0.0.1:9/hook\n")
    [target] = load_pipeline(path).notify
    assert target.url == "json://127.0.0.1:9/hook" and target.on == ["failed", "stopped"]
