"""Reading run records that are not what the recorder writes: every reader (``rayjobs runs``, ``show``, ``compare``,
``logs``, the history pages) reads ``run.json`` through one typed model, so a record with a wrong type, or a
submission id that is a path, is one UNREADABLE row with its reason, and the other runs read as usual.

Also here: every path built from a record stays inside the run's folder (local, through links, and in S3), and
a run's resource samples come back in the order they were taken."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rayjobs_agent.record_layout import (ATTEMPT_FIELDS, RUN_FIELDS, RUN_FILE, event_folder, log_folder,
                                         unreadable_version)
from runner.errors import BadInput, ExitCode, JobNotFound
from runner.records.model import name_problem, path_problem, record_problem
from runner.records.report import (compare_table, listed_run, masked_record, run_resource_totals, runs_table,
                                   show_text)
from runner.records.store import UNREADABLE, Folder, attempt_events, attempt_log, list_runs, read_run
from tests.support.cli import rayjobs_in_process
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

GOOD_ATTEMPT = {"submission_id": "raysubmit_good", "attempt": 1, "host": "node-1", "spec_hash": "h", "started": 1000.0,
                "updated": 1030.0, "ended": 1030.0, "status": "SUCCEEDED", "exit_code": 0, "log_bytes": 12,
                "log_parts": 1, "events": 2, "event_parts": 1, "cause": None,
                "resources": {"samples": 2, "seconds": 20.0, "cpu_core_s": 30.0, "cpu_sum": 3.0,
                              "peak_rss_bytes": 2 ** 30}}
GOOD = {"schema_version": "1.2", "format": 1, "name": "study", "run_dir": "/runs/good", "status": "SUCCEEDED",
        "started": 1000.0, "ended": 1030.0,
        "spec": {"name": "study", "entrypoint": "python train.py", "queue": "gpus", "secret_env_vars": ["API_TOKEN"],
                 "runtime_env": {"env_vars": {"API_TOKEN": "plain-secret"}}},
        "spec_hash": "h", "code": {"working_dir": "/src", "git": {"commit": "a" * 40, "dirty": False}},
        "versions": {"ray": "2.9"}, "cluster": {"nodes": 1, "cpus": 2, "gpus": 0}, "metrics": {"val_loss": 0.25},
        "iterations": 2, "epochs": 2, "restarts": 0, "cause": None, "upload_every_s": 30, "notes": [],
        "record_health": {"failed_uploads": 0}, "attempts": [GOOD_ATTEMPT]}
EVENTS = [{"event": "report", "time": 1001.0, "iteration": 1, "metrics": {"epoch": 1, "val_loss": 0.5}},
          {"event": "resources", "time": 1010.0, "cpu": 1.5, "cpus": 2, "rss_bytes": 2 ** 30, "every_s": 10}]


def write_run(root: Path, name: str, document: Any, events: list[Any] | None = None,
              log: bytes = b"step 1\n") -> Path:
    """A run's folder as the keeper leaves it, ``document`` as its run.json whatever it holds."""
    run = root / name
    run.mkdir(parents=True)
    (run / RUN_FILE).write_text(json.dumps(document))
    attempts = document.get("attempts") if isinstance(document, dict) else None
    for attempt in attempts if isinstance(attempts, list) else []:
        submission = attempt.get("submission_id") if isinstance(attempt, dict) else None
        if not isinstance(submission, str) or name_problem(submission) is not None:
            continue
        (run / log_folder(submission)).mkdir(parents=True, exist_ok=True)
        (run / log_folder(submission) / "00000.log").write_bytes(log)
        (run / event_folder(submission)).mkdir(parents=True, exist_ok=True)
        (run / event_folder(submission) / "00000.jsonl").write_text(
            "".join(json.dumps(event) + "\n" for event in (EVENTS if events is None else events)))
    return run


def with_changes(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


WRONG_TYPES = [
    ({"started": "yesterday"}, 'started holds "yesterday", not a number or null'),
    ({"attempts": 5}, "attempts holds 5, not an array"),
    ({"metrics": [1]}, "metrics holds an array, not an object or null"),
    ({"spec": "x"}, "spec holds a string, not an object or null"),
    ({"attempts": ["raysubmit_x"]}, 'attempts[0] holds "raysubmit_x", not an object'),
    ({"attempts": [{**GOOD_ATTEMPT, "submission_id": 5}]}, "attempts[0].submission_id holds 5, not a string"),
    ({"ended": True}, "ended holds true, not a number or null"),
    ({"started": float("nan")}, "started holds NaN, not a finite number or null"),
    ({"attempts": [{**GOOD_ATTEMPT, "log_bytes": 1.5}]}, "attempts[0].log_bytes holds 1.5, not an integer"),
    ({"notes": ["fine", {"a": 1}]}, "notes[1] holds an object, not a string"),
    ({"spec": {**GOOD["spec"], "runtime_env": {"env_vars": {"API_TOKEN": 12345}}}},
     "spec.runtime_env.env_vars.API_TOKEN holds a number, not a string"),
    ({"attempts": [{"status": "FAILED"}]}, "attempts[0].submission_id is missing"),
]


@pytest.mark.parametrize(("changes", "reason"), WRONG_TYPES, ids=[reason.split(" ")[0] for _, reason in WRONG_TYPES])
def test_a_field_of_the_wrong_type_makes_that_record_unreadable_with_the_field_and_what_it_holds(
        changes, reason, tmp_path):
    write_run(tmp_path, "good", GOOD)
    bad = write_run(tmp_path, "bad", with_changes(**changes))
    listed = {folder.name: document for folder, document in list_runs(Folder(str(tmp_path)))}
    assert listed["good"]["status"] == "SUCCEEDED"
    assert listed["bad"]["status"] == UNREADABLE and reason in listed["bad"]["error"], listed["bad"]["error"]
    assert "plain-secret" not in listed["bad"]["error"] and "12345" not in listed["bad"]["error"]
    with pytest.raises(BadInput, match="cannot be read"):
        read_run(Folder(str(bad)))


def test_runs_show_and_compare_say_an_unreadable_record_in_one_line_and_never_a_traceback(tmp_path):
    write_run(tmp_path, "good", GOOD)
    write_run(tmp_path, "later", with_changes(started=2000.0))
    for index, (changes, _) in enumerate(WRONG_TYPES):
        write_run(tmp_path, f"bad-{index}", with_changes(**changes))
    listed = rayjobs_in_process("runs", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert rows["later"].split()[1] == "SUCCEEDED" and rows["good"].split()[1] == "SUCCEEDED"
    assert all(rows[f"bad-{index}"].split()[1] == UNREADABLE for index in range(len(WRONG_TYPES)))
    as_json = json.loads(rayjobs_in_process("runs", str(tmp_path), "--output", "json").stdout)
    assert {run["run"]: run["status"] for run in as_json}["bad-0"] == UNREADABLE

    for command in (("show", str(tmp_path / "bad-0")), ("logs", str(tmp_path / "bad-1")),
                    ("compare", str(tmp_path / "good"), str(tmp_path / "bad-2"), "--plot", str(tmp_path / "c.png"))):
        done = rayjobs_in_process(*command)
        assert done.returncode == ExitCode.BAD_INPUT, (command, done.stderr)
        assert "Traceback" not in done.stderr and "cannot be read" in done.stderr
    shown = rayjobs_in_process("show", str(tmp_path / "good"))
    assert shown.returncode == 0 and "status:     SUCCEEDED" in shown.stdout and "plain-secret" not in shown.stdout


def test_unknown_fields_are_kept(tmp_path):
    run = write_run(tmp_path, "newer", with_changes(schema_version="1.99", gpu_hours={"total": 1.5},
                                                    attempts=[{**GOOD_ATTEMPT, "preempted": False}]))
    document = read_run(Folder(str(run)))
    assert document["gpu_hours"] == {"total": 1.5} and document["attempts"][0]["preempted"] is False


def test_a_record_or_an_event_nested_past_any_record_s_depth_breaks_no_reader(tmp_path):
    from runner.ui import data

    deep = {"x": json.loads("[" * 900 + "]" * 900)}
    write_run(tmp_path, "deep", with_changes(metrics=deep))
    write_run(tmp_path, "deep-event", GOOD, events=[*EVENTS, {"event": "retry", "text": deep}])
    listed = {folder.name: document for folder, document in list_runs(Folder(str(tmp_path)))}
    assert listed["deep"]["status"] == UNREADABLE and "more than 64 levels deep" in listed["deep"]["error"]
    records = data.Records(Folder(str(tmp_path)))
    assert data.run_detail(records, "deep-event")["decisions"] == []
    assert len(data.runs_table(records)["runs"]) == 2


def test_compare_draws_the_curves_of_reports_whatever_else_their_events_hold(tmp_path):
    odd = [{"event": "report", "iteration": "one", "metrics": [1, 2]}, {"event": "report", "metrics": 7},
           {"event": "report", "iteration": 2, "metrics": {"epoch": "two", "val_loss": float("nan")}},
           {"event": "report", "iteration": 3, "metrics": {"epoch": 3, "val_loss": 0.4, "note": {"a": 1}}},
           {"event": "resources", "time": "now", "cpu": "lots", "rss_bytes": float("inf")}, [1], "text", None]
    for name in ("a", "b"):
        write_run(tmp_path, name, GOOD, events=[*EVENTS, *odd])
    plot = tmp_path / "curves.png"
    compared = rayjobs_in_process("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(plot))
    assert compared.returncode == 0, compared.stderr
    assert plot.read_bytes()[:4] == b"\x89PNG" and "curves of val_loss" in compared.stderr
    shown = rayjobs_in_process("show", str(tmp_path / "a"))
    assert shown.returncode == 0 and "CPU " in shown.stdout, shown.stderr


UNSAFE_IDS = ["../../../../etc", "..", ".", "", "a/b", "/etc", "a\\..\\b", "nul\x00", "line\nbreak", "x" * 256]


@pytest.mark.parametrize("submission_id", UNSAFE_IDS, ids=[repr(value)[:16] for value in UNSAFE_IDS])
def test_a_submission_id_that_is_no_folder_name_makes_the_record_unreadable_before_any_path_is_built(
        submission_id, tmp_path):
    run = write_run(tmp_path, "bad", with_changes(attempts=[{**GOOD_ATTEMPT, "submission_id": submission_id}]))
    ((_, listed),) = list_runs(Folder(str(tmp_path)))
    assert listed["status"] == UNREADABLE and "attempts[0].submission_id holds" in listed["error"]
    assert "no folder's name" in listed["error"] or "missing" in listed["error"]
    with pytest.raises(BadInput):
        read_run(Folder(str(run)))


@pytest.mark.parametrize("path", ["..", "a/../b", "/etc/passwd", "a//b", "a/", "a\\b", "a/\x00", "./a"])
def test_a_path_inside_a_folder_is_checked_before_anything_is_opened_local_or_s3(path, tmp_path):
    assert path_problem(path) is not None
    for folder in (Folder(str(tmp_path)), Folder("s3://no-such-bucket-for-rayjobs/runs/one")):
        with pytest.raises(BadInput, match="is no path inside"):
            folder.read(path)
        with pytest.raises(BadInput, match="is no path inside"):
            folder.files(path)


def test_a_link_inside_a_run_folder_that_leads_out_of_it_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the contents of a file outside the records\n")
    (outside / "run.json").write_text(json.dumps(GOOD))
    records = tmp_path / "records"
    # A log part that is a link to a file outside, a log folder that is a link to a folder outside.
    part = write_run(records, "part-link", GOOD)
    part_file = part / log_folder("raysubmit_good") / "00000.log"
    part_file.unlink()
    part_file.symlink_to(outside / "secret.txt")
    folder_link = write_run(records, "folder-link", GOOD)
    logs = folder_link / log_folder("raysubmit_good")
    for child in logs.iterdir():
        child.unlink()
    logs.rmdir()
    logs.symlink_to(outside)
    # A run.json that is a link to one outside: listed unreadable, never read.
    linked = records / "record-link"
    linked.mkdir()
    (linked / RUN_FILE).symlink_to(outside / "run.json")

    for run in (part, folder_link):
        with pytest.raises(BadInput, match="leads out of"):
            attempt_log(Folder(str(run)), "raysubmit_good")
    listed = {folder.name: document for folder, document in list_runs(Folder(str(records)))}
    assert listed["record-link"]["status"] == UNREADABLE and "leads out of" in listed["record-link"]["error"]
    assert listed["part-link"]["status"] == "SUCCEEDED"


def test_a_run_json_that_is_a_fifo_or_a_folder_is_unreadable_and_blocks_no_reader(tmp_path):
    write_run(tmp_path, "good", GOOD)
    fifo = tmp_path / "fifo" / RUN_FILE
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    (tmp_path / "folder" / RUN_FILE).mkdir(parents=True)
    listing: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: listing.update(runs=list_runs(Folder(str(tmp_path)))), daemon=True)
    reader.start()
    try:
        wait_for_condition(lambda: "runs" in listing, timeout_s=HANG_GUARD_S)
    finally:
        # A reader that opened the FIFO waits for a writer: one that opens and closes it lets that reader go.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(HANG_GUARD_S)
    listed = {folder.name: document for folder, document in listing["runs"]}
    assert listed["good"]["status"] == "SUCCEEDED"
    assert listed["fifo"]["status"] == UNREADABLE and "is not a file" in listed["fifo"]["error"]
    assert listed["folder"]["status"] == UNREADABLE


def test_in_s3_a_record_with_a_path_for_a_submission_id_is_unreadable_and_nothing_outside_its_prefix_is_read(
        aws_env, tmp_path):
    from tests.support.s3_server import create_bucket

    create_bucket(aws_env["AWS_ENDPOINT_URL"], "reading-records")
    secret = Folder("s3://reading-records/private")
    secret.write("run-record/logs/x/00000.log", b"private bytes\n")
    runs = Folder("s3://reading-records/runs")
    runs.write(f"good/{RUN_FILE}", json.dumps(GOOD).encode())
    runs.write(f"bad/{RUN_FILE}", json.dumps(with_changes(
        attempts=[{**GOOD_ATTEMPT, "submission_id": "../../private/run-record/logs/x"}])).encode())
    listed = {folder.name: document for folder, document in list_runs(runs)}
    assert listed["good"]["status"] == "SUCCEEDED"
    assert listed["bad"]["status"] == UNREADABLE and "no folder's name" in listed["bad"]["error"]
    with pytest.raises(BadInput, match="is no path inside"):
        runs.child("bad").read("../../private/run-record/logs/x/00000.log")


def test_resource_samples_read_back_in_the_order_they_were_taken_whichever_way_they_reached_the_record(tmp_path):
    # The sample at 1025 was taken while the log was mid-line: it reached the record at once, before the one at
    # 1020 that waited in the log for the next upload. The report between them stays where it was.
    times = [1000.0, 1010.0, 1025.0, 1020.0, 1030.0]
    events = [{"event": "resources", "time": at, "cpu": at - 1000, "every_s": 10} for at in times]
    events.insert(3, {"event": "report", "time": 1024.0, "iteration": 1, "metrics": {"loss": 1.0}})
    run = write_run(tmp_path, "samples", GOOD, events=events)
    read = attempt_events(Folder(str(run)), "raysubmit_good")
    assert [event["time"] for event in read if event["event"] == "resources"] == sorted(times)
    assert [event["event"] for event in read] == [event["event"] for event in events]


# ----------------------------------------------------------------- any JSON in any field

_NUMBERS = st.integers(min_value=-(10 ** 30), max_value=10 ** 30) | st.floats(allow_nan=True, allow_infinity=True)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | _NUMBERS | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
# Every field of run.json and of an attempt, and (as often) the fields inside them that readers look into.
FIELD_PATHS = [(field.name,) for field in RUN_FIELDS] + [("attempts", 0, field.name) for field in ATTEMPT_FIELDS]
INNER_PATHS = ([("spec", name) for name in ("entrypoint", "queue", "runtime_env", "secret_env_vars", "name")]
               + [("spec", "runtime_env", "env_vars"), ("code", "git"), ("code", "git", "commit"),
                  ("code", "working_dir"), ("code", "working_dir_package"), ("cluster", "nodes"), ("cluster", "cpus"),
                  ("cluster", "gpus"), ("metrics", "val_loss"), ("metrics", "epoch"), ("versions", "ray"),
                  ("cause", "cause"), ("attempts", 0, "cause", "text"), ("attempts", 0, "resources", "samples"),
                  ("attempts", 0, "resources", "cpu_core_s"), ("attempts", 0, "resources", "peak_rss_bytes"),
                  ("attempts", 1), ("record_health", "lost")])
PATHS = st.sampled_from(FIELD_PATHS) | st.sampled_from(INNER_PATHS)


def _set(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Put ``value`` at ``path`` in ``document``, making the objects and attempts on the way (an index into a list
    adds good attempts up to it); a path that runs through a value of another type is left alone."""
    target: Any = document
    for part, following in zip(path, (*path[1:], None)):
        if isinstance(target, list) and isinstance(part, int):
            while len(target) <= part:
                target.append({**GOOD_ATTEMPT, "submission_id": f"raysubmit_{len(target)}"})
        elif not (isinstance(target, dict) and isinstance(part, str)):
            return
        if following is None:
            target[part] = value
            return
        if not isinstance(target[part] if isinstance(target, list) else target.get(part), (dict, list)):
            target[part] = [] if isinstance(following, int) else {}
        target = target[part]


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON a browser parses")

    return json.loads(text, parse_constant=refuse)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(PATHS, JSON_VALUES), min_size=1, max_size=4),
       events=st.lists(JSON_VALUES | st.fixed_dictionaries({"event": st.sampled_from(["report", "resources", "trial",
                                                                                      "retry"])}, optional={
           "time": JSON_VALUES, "metrics": JSON_VALUES, "cpu": JSON_VALUES, "trial": JSON_VALUES,
           "values": JSON_VALUES, "metric": JSON_VALUES, "iteration": JSON_VALUES, "text": JSON_VALUES}),
           max_size=4))
def test_any_json_in_any_field_is_read_or_called_unreadable_and_never_breaks_a_reader(changes, events):
    from runner.ui import data
    from runner.ui.pages import json_text

    document = json.loads(json.dumps(GOOD))
    for path, value in changes:
        _set(document, path, value)
    with tempfile.TemporaryDirectory(prefix="rayjobs-reading-") as root:
        write_run(Path(root), "good", GOOD)
        write_run(Path(root), "odd", document, events=[event for event in events])
        location = Folder(root)
        listed = list_runs(location)
        assert {folder.name for folder, _ in listed} == {"good", "odd"}
        runs_table(listed)
        for folder, read in listed:
            listed_run(folder, read)
        odd = dict(listed)[location.child("odd")]
        problem = unreadable_version(document) or record_problem(document)
        assert (odd["status"] == UNREADABLE) == (problem is not None), odd.get("error")
        event("unreadable" if odd["status"] == UNREADABLE else "read")
        records = data.Records(location)
        _strict_json(json_text(data.runs_table(records)))
        _strict_json(json_text(data.search_runs(records, "step")))
        if odd["status"] == UNREADABLE:
            with pytest.raises(BadInput):
                data.run_detail(records, "odd")
            return
        shown = masked_record(odd)
        show_text(location.child("odd"), shown)
        run_resource_totals(shown, {"cpu_hour": 1.0, "gpu_hour": 2.0})
        compare_table(listed)
        for name in ("odd", "good"):
            _strict_json(json_text(data.run_detail(records, name)))
        _strict_json(json_text(data.compare_data(records, ["odd", "good"])))
        assert "plain-secret" not in json.dumps(data.run_detail(records, "odd"), default=str)


def test_a_run_name_from_a_url_is_one_folder_name_or_no_run(tmp_path):
    from runner.ui.data import Records

    write_run(tmp_path, "good", GOOD)
    records = Records(Folder(str(tmp_path / "good")))
    assert records.folder("good").name == "good"
    for name in ("..", "../good", "a/b", "a\\b", "nul\x00", "", "."):
        with pytest.raises((BadInput, JobNotFound)):
            records.folder(name)


def test_a_hand_written_record_shows_its_specs_secret_nowhere_and_no_url_password_even_in_a_metric_name(tmp_path):
    # Records this version writes are masked by the job; one written by hand or before that is masked as it is read.
    from runner.ui import data

    document = with_changes(cause={"name": "unknown", "text": "failed with plain-secret", "evidence": "plain-secret",
                                   "retryable": False},
                            metrics={"val_loss": 0.25, "postgres://u:KEYPASS@h/db": 1.0, "plain-secret": 2.0})
    write_run(tmp_path, "handmade", document)
    records = data.Records(Folder(str(tmp_path)))
    shown = json.dumps([data.runs_table(records), data.run_detail(records, "handmade")])
    assert "plain-secret" not in shown and "KEYPASS" not in shown
    assert "postgres://u:***@h/db" in shown
