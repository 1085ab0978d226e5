"""``run.json`` has one written schema with a version: records of the previous layout and of a newer minor version
read, a newer major version is refused in one line, and what the recorder writes is what the schema says.

``tests/data/records/v0`` is a record as the recorder wrote it before ``schema_version`` existed (kept as it was
written, only its ``run_dir`` made relative), with its log and its events.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from rayjobs_agent.record_layout import SCHEMA_VERSION, SCHEMA_VERSION_FIELD, json_schema
from runner.errors import BadInput, ExitCode
from runner.records.report import listed_run, masked_record, show_text
from runner.records.rerun import link_rerun
from runner.records.store import UNREADABLE, Folder, attempt_events, attempt_log, list_runs, read_run
from tests.support.cli import REPO_ROOT
from rayjobs_agent.record_layout import ATTEMPT_FIELDS, RUN_FIELDS, unreadable_version
from rayjobs_agent.recorder import RUN_FILE, Recorder

PREVIOUS_LAYOUT = Path(__file__).parent / "data" / "records" / "v0" / "rec-raysubmit_one"
SCHEMA_FILE = REPO_ROOT / "docs" / "run-record-schema.json"


def copy_of_previous_record(tmp_path: Path, **changes: Any) -> Path:
    """The previous layout's record copied into ``tmp_path``, with ``changes`` made to its ``run.json``."""
    run_dir = tmp_path / "runs" / PREVIOUS_LAYOUT.name
    shutil.copytree(PREVIOUS_LAYOUT, run_dir)
    document = json.loads((run_dir / RUN_FILE).read_text())
    document.update(changes)
    (run_dir / RUN_FILE).write_text(json.dumps(document, indent=1))
    return run_dir


def schema_errors(document: dict[str, Any]) -> list[str]:
    """What in ``document`` the published schema refuses (jsonschema when installed, else types and required)."""
    schema = json_schema()
    try:
        import jsonschema
    except ImportError:
        return _plain_schema_errors(document, schema)
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(error.path)}: {error.message}" for error in validator.iter_errors(document)]


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "object": dict, "array": list,
               "null": type(None), "boolean": bool}


def _plain_schema_errors(document: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    errors = [f"{name} missing" for name in schema.get("required", []) if name not in document]
    for name, rule in schema.get("properties", {}).items():
        if name in document:
            types = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
            if not isinstance(document[name], tuple(_JSON_TYPES[kind] for kind in types)):
                errors.append(f"{name} is not {rule['type']}")
            for item in document[name] if "items" in rule and isinstance(document[name], list) else []:
                if rule["items"].get("type") == "object":
                    errors += _plain_schema_errors(item, rule["items"])
    return errors


class MemoryStore:
    """A run's folder in a dict."""

    def __init__(self) -> None:
        self.location = "memory://run"
        self.files: dict[str, bytes] = {}

    def write(self, name: str, data: bytes) -> None:
        self.files[name] = bytes(data)

    def read(self, name: str) -> bytes | None:
        return self.files.get(name)


def recorded(tmp_path: Path, store: MemoryStore, log_lines: list[str]) -> dict[str, Any]:
    """The ``run.json`` the recorder writes for one attempt whose log is ``log_lines``."""
    log = tmp_path / "driver.log"
    log.write_text("".join(log_lines))
    job_config = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"},
                  "metadata": {"job_submission_id": "raysubmit_two"}}
    config = {"name": "schema", "every_s": 1, "spec": {"name": "schema", "entrypoint": "python train.py"},
              "spec_hash": "abc", "code": {"working_dir": "/src"}}
    recorder = Recorder(store, config, job_config, open(log, "rb"), environ={}, clock=time.monotonic,
                        sleep=lambda _seconds: None)
    recorder.start()
    recorder.finish("SUCCEEDED", 0, within_s=1)
    return json.loads(store.files[RUN_FILE])


def event_line(kind: str, **fields: Any) -> str:
    return "(TrainController pid=7) rayjobs-event " + json.dumps({"event": kind, "time": 1.0, **fields}) + "\n"


def test_a_record_of_the_previous_layout_reads_whole(tmp_path):
    folder = Folder(str(PREVIOUS_LAYOUT))
    document = read_run(folder)
    assert SCHEMA_VERSION_FIELD not in document, "the fixture is of the layout before schema_version"
    assert document["status"] == "FAILED" and document["iterations"] == 3
    (attempt,) = document["attempts"]
    assert attempt_log(folder, attempt["submission_id"]).startswith(b"Running entrypoint for job raysubmit_one")
    assert [event["iteration"] for event in attempt_events(folder, attempt["submission_id"])] == [1, 2, 3]
    assert "FAILED" in show_text(folder, masked_record(document))
    assert listed_run(folder, document)["attempts"] == 1
    assert schema_errors(document) == [], "the previous layout is valid under the schema too"


def test_a_record_of_a_newer_minor_version_reads_and_keeps_what_it_does_not_know(tmp_path):
    major = SCHEMA_VERSION.partition(".")[0]
    run_dir = copy_of_previous_record(tmp_path, schema_version=f"{major}.99", gpu_hours={"total": 1.5},
                                      attempts=[{**json.loads((PREVIOUS_LAYOUT / RUN_FILE).read_text())["attempts"][0],
                                                 "preempted": False}])
    folder = Folder(str(run_dir))
    document = read_run(folder)
    assert document["gpu_hours"] == {"total": 1.5} and document["attempts"][0]["preempted"] is False
    assert "FAILED" in show_text(folder, masked_record(document))
    assert [run["status"] for _, run in list_runs(Folder(str(run_dir.parent)))] == ["FAILED"]

    assert link_rerun(folder, "/runs/rec-rerun-1") is None
    written = json.loads((run_dir / RUN_FILE).read_text())
    assert written["gpu_hours"] == {"total": 1.5} and written[SCHEMA_VERSION_FIELD] == f"{major}.99", \
        "writing a link back keeps every field the record had"
    assert written["reruns"] == ["/runs/rec-rerun-1"]


def test_a_record_of_a_newer_major_version_is_refused_in_one_line(tmp_path):
    major = int(SCHEMA_VERSION.partition(".")[0])
    run_dir = copy_of_previous_record(tmp_path, schema_version=f"{major + 1}.0")
    with pytest.raises(BadInput) as raised:
        read_run(Folder(str(run_dir)))
    message = str(raised.value)
    assert "\n" not in message and "upgrade rayjobs" in message and f"{major + 1}.0" in message
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    ((_, listed),) = list_runs(Folder(str(run_dir.parent)))
    assert listed["status"] == UNREADABLE and "upgrade rayjobs" in listed["error"]
    before = (run_dir / RUN_FILE).read_bytes()
    assert "upgrade rayjobs" in (link_rerun(Folder(str(run_dir)), "/runs/other") or "")
    assert (run_dir / RUN_FILE).read_bytes() == before, "a record this version cannot read is never rewritten"


@pytest.mark.parametrize("version", ["2", "two.zero", 2.0])
def test_a_schema_version_that_is_not_major_dot_minor_is_refused(version):
    assert "upgrade rayjobs" in (unreadable_version({SCHEMA_VERSION_FIELD: version}) or "")


def test_what_the_recorder_writes_is_valid_under_the_published_schema(tmp_path):
    store = MemoryStore()
    document = recorded(tmp_path, store, [
        "starting\n",
        event_line("attempt", attempt=1, workers=[], nodes=1, cluster={"nodes": 1, "CPU": 2.0, "GPU": 0.0}),
        event_line("report", iteration=1, epochs=2, metrics={"epoch": 1, "loss": 0.5}),
        event_line("restart", attempt=1, reason="a worker died"),
        event_line("progress_unavailable", reason="a hook failed"),
        event_line("report", iteration=2, epochs=2, metrics={"epoch": 2, "loss": 0.25}),
    ])
    assert document[SCHEMA_VERSION_FIELD] == SCHEMA_VERSION
    assert (document["iterations"], document["restarts"], document["cluster"]["nodes"]) == (2, 1, 1)
    assert schema_errors(document) == []
    assert set(document) <= {field.name for field in RUN_FIELDS}, "every field written is in the schema"
    assert set(document["attempts"][0]) <= {field.name for field in ATTEMPT_FIELDS}


def test_the_recorder_keeps_the_fields_of_a_newer_run_json_it_adds_an_attempt_to(tmp_path):
    store = MemoryStore()
    earlier = json.loads((PREVIOUS_LAYOUT / RUN_FILE).read_text())
    store.files[RUN_FILE] = json.dumps({**earlier, SCHEMA_VERSION_FIELD: "1.99", "gpu_hours": 3,
                                        "reruns": ["/runs/a"]}).encode()
    document = recorded(tmp_path, store, ["working\n"])
    assert [attempt["submission_id"] for attempt in document["attempts"]] == ["raysubmit_one", "raysubmit_two"]
    assert (document["gpu_hours"], document["reruns"]) == (3, ["/runs/a"])
    assert (document[SCHEMA_VERSION_FIELD], document["status"]) == (SCHEMA_VERSION, "SUCCEEDED")


def test_the_published_schema_file_is_the_one_rayjobs_prints():
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema(), \
        "docs/run-record-schema.json is stale: rayjobs schema --record > docs/run-record-schema.json"


def test_rayjobs_schema_record_prints_it():
    from typer.testing import CliRunner

    from runner.cli.app import app

    result = CliRunner().invoke(app, ["schema", "--record"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json_schema()
