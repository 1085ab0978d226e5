"""A pipeline run as its jobs' records draw it, with no cluster: what a job of a pipeline writes in its record, the
graph ``rayjobs runs LOCATION --pipeline RUN`` prints and the history page draws (layers, edges, statuses, links to
each job's run), and hostile ids and records refused. Records are hand-made in tmp folders, as the keeper leaves them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.submission import link_record
from rayjobs_agent.record_layout import PIPELINE_FIELD, RUN_FILE
from rayjobs_agent.recorder import Recorder
from rayjobs_agent.wire import RECORD_ENV_VAR, ray_env_json
from runner.errors import BadInput, ExitCode, JobNotFound
from runner.records.pipeline import UNRECORDED, pipeline_graph
from runner.records.store import UNREADABLE, Folder, list_runs, read_run
from tests.support.cli import rayjobs_in_process
from tests.support.ui_browser import CHROMIUM, NO_CHROMIUM, dom_and_console, parsed, served
from tests.test_record_reading import GOOD, GOOD_ATTEMPT, write_run
from tests.test_record_schema import MemoryStore, schema_errors
from tests.test_ui_security import request, strict_json

RUN = "nightly-0a1b2c3d"
OTHER_RUN = "nightly-99999999"
ELSEWHERE = "s3://other-bucket/runs/report-nightly-0a1b2c3d-report"


def job_record(job: str, status: str, started: float, after: dict[str, str], run: str = RUN) -> dict[str, Any]:
    """A pipeline job's run.json: GOOD's fields, its own status and attempt, and its ``pipeline`` link."""
    submission = f"{run}-{job}"
    return {**GOOD, "schema_version": "1.3", "name": job, "status": status, "started": started, "ended": started + 5,
            PIPELINE_FIELD: {"run": run, "job": job, "after": after},
            "attempts": [{**GOOD_ATTEMPT, "submission_id": submission, "status": status, "started": started,
                          "updated": started + 5, "ended": started + 5}]}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """prep -> train -> eval, eval also after `report` (recorded elsewhere), and `lint` alone: a graph of three
    layers; the same pipeline's other run; a run of no pipeline; a record whose pipeline link is a path."""
    root = tmp_path_factory.mktemp("pipeline-records")
    folder = {job: f"{job}-{RUN}-{job}" for job in ("prep", "train", "eval", "lint")}
    write_run(root, folder["prep"], job_record("prep", "SUCCEEDED", 1000.0, {}))
    write_run(root, folder["lint"], job_record("lint", "SUCCEEDED", 1001.0, {}))
    write_run(root, folder["train"], job_record("train", "FAILED", 1010.0, {"prep": str(root / folder["prep"])}))
    write_run(root, folder["eval"], job_record("eval", "FAILED", 1020.0, {"train": str(root / folder["train"]),
                                                                           "report": ELSEWHERE}))
    write_run(root, f"prep-{OTHER_RUN}-prep", job_record("prep", "RUNNING", time.time(), {}, run=OTHER_RUN))
    write_run(root, "alone", GOOD)
    write_run(root, "hostile", {**job_record("x", "SUCCEEDED", 900.0, {}), PIPELINE_FIELD: {"run": "../../etc",
                                                                                          "job": "x"}})
    return root


# ----------------------------------------------------------------- what a job of a pipeline writes

def test_a_pipeline_job_s_record_names_its_run_its_job_and_the_folders_of_the_jobs_it_ran_after(tmp_path):
    settings = {"name": "train", "every_s": 1, "spec": {"name": "train", "entrypoint": "python train.py"}}
    submission = {"entrypoint": "x", "runtime_env": {"env_vars": {RECORD_ENV_VAR: ray_env_json(settings)}}}
    link = {"run": RUN, "job": "train", "after": {"prep": "s3://runs/prep-$HOME"}}
    link_record(submission, {PIPELINE_FIELD: link})
    config = json.loads(submission["runtime_env"]["env_vars"][RECORD_ENV_VAR])
    assert "$" not in submission["runtime_env"]["env_vars"][RECORD_ENV_VAR], "Ray would expand it on the cluster"

    store = MemoryStore()
    log = tmp_path / "driver.log"
    log.write_text("step\n")
    with open(log, "rb") as driver_log:
        recorder = Recorder(store, config, {"metadata": {"job_submission_id": f"{RUN}-train"}}, driver_log,
                            environ={}, clock=time.monotonic, sleep=lambda _seconds: None)
        recorder.start()
        recorder.finish("SUCCEEDED", 0, within_s=1)
    written = json.loads(store.files[RUN_FILE])
    assert written[PIPELINE_FIELD] == link and schema_errors(written) == []
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_FILE).write_bytes(store.files[RUN_FILE])
    assert read_run(Folder(str(tmp_path / "run")))[PIPELINE_FIELD] == link


def test_a_job_that_keeps_no_record_is_left_as_it_is():
    submission = {"entrypoint": "x", "runtime_env": {"env_vars": {"A": "1"}}}
    link_record(submission, {PIPELINE_FIELD: {"run": RUN, "job": "a", "after": {}}})
    assert submission == {"entrypoint": "x", "runtime_env": {"env_vars": {"A": "1"}}}


@pytest.mark.parametrize("link, field", [
    ({"run": "../../etc", "job": "a"}, "pipeline.run"),
    ({"run": RUN, "job": "a/b"}, "pipeline.job"),
    ({"run": RUN, "job": "a", "after": {"..": "/x"}}, "pipeline.after"),
    ({"run": RUN, "job": "a", "after": {"b": "/x\x1b[2J"}}, "pipeline.after.b"),
    ({"job": "a"}, "pipeline.run is missing"),
])
def test_a_record_whose_pipeline_link_is_a_path_or_holds_a_terminal_s_escape_is_unreadable(tmp_path, link, field):
    write_run(tmp_path, "bad", {**job_record("a", "SUCCEEDED", 1.0, {}), PIPELINE_FIELD: link})
    ((_, document),) = list_runs(Folder(str(tmp_path)))
    assert document["status"] == UNREADABLE and field in document["error"]


# ----------------------------------------------------------------- the graph from the records

def test_the_graph_has_each_job_in_its_layer_with_what_it_ran_after_its_status_and_its_run(records):
    graph = pipeline_graph(list_runs(Folder(str(records))), RUN)
    assert graph["layers"] == [["lint", "prep", "report"], ["train"], ["eval"]] and graph["problem"] is None
    jobs = {job["job"]: job for job in graph["jobs"]}
    edges = {(before, job["job"]) for job in graph["jobs"] for before in job["after"]}
    assert edges == {("prep", "train"), ("train", "eval"), ("report", "eval")}
    assert {name: job["status"] for name, job in jobs.items()} == {
        "prep": "SUCCEEDED", "lint": "SUCCEEDED", "train": "FAILED", "eval": "FAILED", "report": UNRECORDED}
    assert jobs["train"]["run"] == f"train-{RUN}-train"
    assert jobs["train"]["location"] == str(records / jobs["train"]["run"])
    assert jobs["report"]["run"] is None and jobs["report"]["location"] == ELSEWHERE
    assert [job["job"] for job in pipeline_graph(list_runs(Folder(str(records))), OTHER_RUN)["jobs"]] == ["prep"]


@pytest.mark.parametrize("link", [{"job": "a"}, {"run": [RUN], "job": "a"}, {"run": RUN, "job": "a", "after": ["b"]},
                                  {"run": RUN, "job": "a", "after": {"b": 3}}, {"run": "../../etc", "job": "a"},
                                  {"run": RUN, "job": "a", "after": {"..": "/x"}},
                                  {"run": RUN, "job": "a", "after": {"b": "/x\x1b[2J"}}])
def test_a_document_whose_link_is_malformed_reads_as_a_run_of_no_pipeline_and_the_graph_is_drawn_without_it(link):
    # Records read through the model never carry such a link; a document from any other reader must not break
    # the graph, the runs table or the export all the same.
    good = job_record("b", "SUCCEEDED", 1.0, {})
    graph = pipeline_graph([(Folder("/r/bad"), {**job_record("a", "SUCCEEDED", 1.0, {}), PIPELINE_FIELD: link}),
                            (Folder("/r/good"), good)], RUN)
    assert [job["job"] for job in graph["jobs"]] == ["b"]


def test_a_job_recorded_twice_shows_its_latest_record_and_a_cycle_is_shown_not_refused(tmp_path):
    write_run(tmp_path, "a-old", job_record("a", "FAILED", 1.0, {"b": "/b"}))
    write_run(tmp_path, "a-new", job_record("a", "SUCCEEDED", 2.0, {"b": "/b"}))
    write_run(tmp_path, "b", job_record("b", "SUCCEEDED", 3.0, {"a": "/a"}))
    graph = pipeline_graph(list_runs(Folder(str(tmp_path))), RUN)
    assert {job["job"]: (job["status"], job["run"]) for job in graph["jobs"]} == {
        "a": ("SUCCEEDED", "a-new"), "b": ("SUCCEEDED", "b")}
    assert graph["layers"] == [["a", "b"]] and "cycle" in graph["problem"]


def test_a_folder_told_by_url_keeps_its_password_out_of_the_graph_and_the_runs_row(tmp_path):
    write_run(tmp_path, "b", job_record("b", "SUCCEEDED", 3.0, {"a": "s3://reader:hunter2@bucket/runs/a"}))
    graph = pipeline_graph(list_runs(Folder(str(tmp_path))), RUN)
    assert "hunter2" not in json.dumps(graph)
    assert {job["job"]: job["location"] for job in graph["jobs"]}["a"].startswith("s3://")


@pytest.mark.parametrize("run_id", ["../etc", "a/b", "", "x\x00"])
def test_an_id_that_is_a_path_is_refused_and_an_unknown_one_is_not_found(records, run_id):
    runs = list_runs(Folder(str(records)))
    with pytest.raises(BadInput, match="no pipeline run's id"):
        pipeline_graph(runs, run_id)
    with pytest.raises(JobNotFound):
        pipeline_graph(runs, "nightly-ffffffff")


# ----------------------------------------------------------------- the commands

def test_runs_shows_each_run_s_pipeline_and_the_pipeline_s_graph_layer_by_layer(records):
    listed = rayjobs_in_process("runs", str(records))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert rows["RUN"][:3] == ["RUN", "PIPELINE", "STATUS"]
    assert rows[f"train-{RUN}-train"][1] == f"{RUN}/train" and rows["alone"][1] == "-"

    shown = rayjobs_in_process("runs", str(records), "--pipeline", RUN)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"pipeline run {RUN}: 5 jobs in 3 layers (2 FAILED, 2 SUCCEEDED, 1 {UNRECORDED})"
    table = [line.split(None, 4) for line in lines[2:]]
    assert [row[:4] for row in table] == [["1", "lint", "-", "SUCCEEDED"], ["1", "prep", "-", "SUCCEEDED"],
                                          ["1", "report", "-", UNRECORDED], ["2", "train", "prep", "FAILED"],
                                          ["3", "eval", "report,", "train"]]
    assert table[3][4] == str(records / f"train-{RUN}-train")

    as_json = json.loads(rayjobs_in_process("runs", str(records), "--pipeline", RUN, "--output", "json").stdout)
    assert as_json["layers"] == [["lint", "prep", "report"], ["train"], ["eval"]]
    assert json.loads(rayjobs_in_process("runs", str(records), "--output", "json").stdout)[0][PIPELINE_FIELD] \
        == {"run": OTHER_RUN, "job": "prep", "after": {}}


def test_runs_of_a_hostile_or_unknown_pipeline_id_exit_with_their_codes(records):
    hostile = rayjobs_in_process("runs", str(records), "--pipeline", "../../etc")
    unknown = rayjobs_in_process("runs", str(records), "--pipeline", "nightly-ffffffff")
    assert hostile.returncode == ExitCode.BAD_INPUT and "no pipeline run's id" in hostile.stderr
    assert unknown.returncode == ExitCode.NOT_FOUND and "no record of pipeline run" in unknown.stderr


def test_show_names_the_pipeline_run_the_job_and_the_command_that_draws_the_graph(records):
    shown = rayjobs_in_process("show", str(records / f"eval-{RUN}-eval"))
    assert shown.returncode == 0, shown.stderr
    assert (f"pipeline:   job eval of run {RUN}, after report, train (the graph: rayjobs runs {records} "
            f"--pipeline {RUN})") in shown.stdout


# ----------------------------------------------------------------- the history page

def test_the_pipeline_api_serves_the_graph_with_each_job_s_run_page_and_refuses_paths(records):
    with served(str(records)) as server:
        status, _, body = request(server, f"/api/pipeline/{RUN}")
        graph = strict_json(body)
        linked = [request(server, f"/api/run/{job['run']}")[0] for job in graph["jobs"] if job["run"]]
        hostile = [request(server, f"/api/pipeline/{name}") for name in ("..", "..%2F..%2Fetc", "a%5Cb", "%00")]
        unknown = request(server, "/api/pipeline/nightly-ffffffff")
        page = request(server, f"/pipeline/{RUN}")
        _, _, runs = request(server, "/api/runs")
    assert status == 200 and not graph["live"] and graph["location"] == str(records)
    assert {(before, job["job"]) for job in graph["jobs"] for before in job["after"]} == {
        ("prep", "train"), ("train", "eval"), ("report", "eval")}
    assert linked == [200, 200, 200, 200], "every node with a record links to a run page the server has"
    assert [answer[0] for answer in hostile] == [400, 400, 400, 400]
    assert all("no pipeline run's id" in strict_json(answer[2])["error"] for answer in hostile)
    assert unknown[0] == 404
    assert page[0] == 200 and b'data-page="pipeline"' in page[2] and b"<script>" not in page[2]
    rows = {row["run"]: row for row in strict_json(runs)["runs"]}
    assert rows[f"eval-{RUN}-eval"][PIPELINE_FIELD]["run"] == RUN and rows["alone"][PIPELINE_FIELD] is None
    assert rows["hostile"]["status"] == UNREADABLE and rows["hostile"][PIPELINE_FIELD] is None


def test_export_writes_a_page_for_each_pipeline_run_with_its_graph_inside(records, tmp_path):
    done = rayjobs_in_process("ui", str(records), "--export", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in (tmp_path / "site" / "pipeline").iterdir()) == [f"{RUN}.html",
                                                                                      f"{OTHER_RUN}.html"]
    page = (tmp_path / "site" / "pipeline" / f"{RUN}.html").read_text()
    embedded = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    assert embedded["pipeline"] == RUN and len(embedded["jobs"]) == 5


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_page_draws_each_job_coloured_by_status_linked_to_its_run_with_an_arrow_per_edge(records):
    with served(str(records)) as server:
        dom, console = dom_and_console(server.url + f"pipeline/{RUN}")
    assert [message for message in console if "Content Security Policy" in message or "Uncaught" in message] == []
    page = parsed(dom)
    assert page.one("body").attrs.get("data-ready") == "1" and page.all(id="error") == []
    nodes = {node.attrs["data-job"]: node for node in page.all("g", class_="node")}
    assert {name: node.attrs["data-status"] for name, node in nodes.items()} == {
        "prep": "SUCCEEDED", "lint": "SUCCEEDED", "train": "FAILED", "eval": "FAILED", "report": UNRECORDED}
    assert "s-FAILED" in nodes["train"].attrs["class"]
    links = {link.attrs["data-run"]: link.attrs["href"] for link in page.all("a") if "data-run" in link.attrs}
    assert links == {f"{job}-{RUN}-{job}": f"/run/{job}-{RUN}-{job}" for job in ("prep", "lint", "train", "eval")}
    edges = {(edge.attrs["data-from"], edge.attrs["data-to"]) for edge in page.all("path") if "data-from" in edge.attrs}
    assert edges == {("prep", "train"), ("train", "eval"), ("report", "eval")}
