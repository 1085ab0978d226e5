"""``rayjobs ui``'s server and export over hand-made records (no cluster, no browser): the API's data, a big log
served a page at a time and masked, searches, the token off loopback, an old record, and the exported files.
What a browser shows of records real jobs wrote is tests/test_ui_cluster.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rayjobs_agent.record_layout import RUN_FILE, event_folder, log_folder
from rayjobs_agent.wording import format_bytes, local_time
from runner.errors import ExitCode
from runner.ui.log_pages import PAGE_BYTES
from tests.support.cli import rayjobs_in_process
from tests.support.ui_browser import get, served

SECRET = "hunter2-not-shown"
# A log of about 700 KiB in two parts (as the keeper cuts them, at 8 MiB in real records): three pages.
LINES = [f"step {i:06d} loss {1 / (i + 1):.6f} " + "x" * 40 + "\n" for i in range(10_000)]
LINES[5_000] = f"downloading https://bob:{SECRET}@example.com/data.tar needle-in-the-log\n"


def write_run(root: Path, name: str, document: dict, log: bytes = b"", events: list[dict] | None = None,
              part_bytes: int = 400_000) -> Path:
    """A run's folder as the keeper leaves it: run.json, the log in numbered parts, the events."""
    run = root / name
    run.mkdir(parents=True)
    (run / RUN_FILE).write_text(json.dumps(document))
    for attempt in document.get("attempts") or []:
        submission = attempt["submission_id"]
        logs = run / log_folder(submission)
        logs.mkdir(parents=True, exist_ok=True)
        for index in range(max(1, math.ceil(len(log) / part_bytes))):
            (logs / f"{index:05d}.log").write_bytes(log[index * part_bytes:(index + 1) * part_bytes])
        parts = run / event_folder(submission)
        parts.mkdir(parents=True, exist_ok=True)
        (parts / "00000.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events or []))
    return run


def attempt(submission: str, status: str, started: float, **extra) -> dict:
    return {"submission_id": submission, "attempt": 1, "status": status, "started": started, "updated": started + 30,
            "ended": started + 30, "host": "node-1", "exit_code": 0 if status == "SUCCEEDED" else 1, **extra}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ui-records")
    reports = [{"event": "report", "time": 1000.0 + i, "iteration": i + 1,
                "metrics": {"epoch": i + 1, "val_loss": 1 / (i + 1), "val_accuracy": i / 4}} for i in range(4)]
    samples = [{"event": "resources", "time": 1000.0 + 10 * i, "cpu": 1.5 + i / 10, "cpus": 2, "rss_bytes": 2 ** 30 + i,
                "processes": 3, "nodes": 1, "every_s": 10} for i in range(5)]
    spec = {"name": "study", "entrypoint": "python train.py --lr 0.1", "queue": "gpus",
            "runtime_env": {"env_vars": {"API_TOKEN": "plain-secret"}}, "secret_env_vars": ["API_TOKEN"]}
    write_run(root, "study-1", {"schema_version": "1.1", "name": "study", "status": "SUCCEEDED", "started": 1000.0,
                                "ended": 1030.0, "spec": spec, "metrics": {"val_loss": 0.25, "val_accuracy": 0.75},
                                "versions": {"ray": "2.9"}, "code": {"git": {"commit": "a" * 40}},
                                "attempts": [attempt("raysubmit_one", "SUCCEEDED", 1000.0)]},
              "".join(LINES).encode(), reports + samples)
    cause = {"cause": "module_missing", "text": "A module is missing on the cluster", "advice": "Add it to pip",
             "evidence": "ModuleNotFoundError: No module named 'x'", "retryable": False}
    write_run(root, "study-2", {"schema_version": "1.1", "name": "study", "status": "FAILED", "started": 2000.0,
                                "ended": 2010.0, "spec": {**spec, "entrypoint": "python train.py --lr 0.2"},
                                "versions": {"ray": "2.10"}, "cause": cause,
                                "attempts": [attempt("raysubmit_two", "FAILED", 2000.0, cause=cause)]},
              b"Traceback\nModuleNotFoundError: No module named 'x'\n")
    # Written before schema_version and causes existed: no cause, no log_parts, events in one file.
    old = write_run(root, "old-run", {"format": 1, "name": "old", "status": "SUCCEEDED", "started": 500.0,
                                      "ended": 560.0, "metrics": {"loss": 0.5},
                                      "attempts": [{"submission_id": "raysubmit_old", "status": "SUCCEEDED",
                                                    "started": 500.0, "ended": 560.0}]}, b"old log line\n")
    (old / event_folder("raysubmit_old") / "00000.jsonl").unlink()
    (old / f"{event_folder('raysubmit_old')}.jsonl").write_text(json.dumps(reports[0]) + "\n")
    (root / "future").mkdir()
    (root / "future" / RUN_FILE).write_text(json.dumps({"schema_version": "2.0", "status": "SUCCEEDED",
                                                        "attempts": []}))
    return root


def api(server, path: str) -> tuple[int, dict]:
    status, _, body = get(server.url.rstrip("/") + path)
    return status, json.loads(body)


def test_the_runs_api_lists_each_run_with_its_cause_key_metric_queue_and_where_it_ran(records):
    with served(str(records)) as server:
        status, table = api(server, "/api/runs")
    assert status == 200 and not table["live"]
    rows = {row["run"]: row for row in table["runs"]}
    assert [row["run"] for row in table["runs"]] == ["study-2", "study-1", "old-run", "future"]
    assert rows["study-2"]["status"] == "FAILED" and rows["study-2"]["cause"]["cause"] == "module_missing"
    assert rows["study-1"]["key_metric"] == {"name": "val_loss", "value": 0.25, "text": "0.25"}
    assert rows["study-1"]["queue"] == "gpus" and rows["study-1"]["host"] == "node-1"
    assert rows["study-1"]["cause"] is None and rows["study-1"]["duration"] == "30.0s"
    assert rows["future"]["status"] == "UNREADABLE" and "newer rayjobs" in rows["future"]["error"]


def test_a_run_has_its_curves_resources_spec_masked_and_its_difference_from_the_previous_run(records):
    with served(str(records)) as server:
        status, run = api(server, "/api/run/study-2")
        _, first = api(server, "/api/run/study-1")
        missing, _ = api(server, "/api/run/nothing")
        unreadable, why = api(server, "/api/run/future")
    assert status == 200 and run["attempts"][0]["cause"]["advice"] == "Add it to pip"
    assert run["previous"]["run"] == "study-1"
    changed = {difference["field"]: (difference["before"], difference["after"]) for difference in
               run["previous"]["differences"]}
    assert changed["spec.entrypoint"] == ("python train.py --lr 0.1", "python train.py --lr 0.2")
    assert changed["versions.ray"] == ("2.9", "2.10")
    assert "plain-secret" not in json.dumps(first) and first["spec"]["runtime_env"]["env_vars"]["API_TOKEN"] != ""
    assert [report["metrics"]["val_loss"] for report in first["reports"]] == [1.0, 0.5, 1 / 3, 0.25]
    assert [sample["cpu"] for sample in first["resources"]] == [1.5, 1.6, 1.7, 1.8, 1.9]
    assert first["resource_totals"]["samples"] == 5
    # What the page shows comes worded: its script formats nothing again.
    assert ["samples", "5"] in first["resource_facts"] and first["ended_text"] == local_time(first["ended"], zone=True)
    assert first["logs"] == [{"submission_id": "raysubmit_one", "pages": math.ceil(len("".join(LINES)) / PAGE_BYTES),
                              "bytes": len("".join(LINES)), "bytes_text": format_bytes(len("".join(LINES))),
                              "attempts": [1]}]
    assert missing == 404 and unreadable == 400 and "newer rayjobs" in why["error"]


def test_a_big_log_is_served_a_page_at_a_time_in_whole_lines_and_masked(records):
    whole = "".join(LINES).replace(SECRET, "***")
    with served(str(records)) as server:
        _, first = api(server, "/api/run/study-1/log?attempt=raysubmit_one&page=0")
        pages = [first] + [api(server, f"/api/run/study-1/log?attempt=raysubmit_one&page={page}")[1]
                           for page in range(1, first["pages"])]
    assert first["pages"] == 3 and first["bytes"] == len("".join(LINES))
    assert "".join(page["text"] for page in pages) == whole, "the pages are the log, each line once"
    for page in pages:
        assert len(page["text"].encode()) <= PAGE_BYTES + 1024 and page["text"].endswith("\n")
    assert SECRET not in whole and "bob:***@example.com" in whole


def test_searching_one_log_or_every_run_finds_masked_lines_with_their_page_and_never_the_secret(records):
    with served(str(records)) as server:
        _, one = api(server, "/api/run/study-1/log?attempt=raysubmit_one&q=NEEDLE-in")
        _, secret = api(server, f"/api/run/study-1/log?q={SECRET}")
        _, every = api(server, "/api/search?q=modulenotfounderror")
        _, empty = api(server, "/api/search?q=")
    (match,) = one["matches"]
    assert match["line"] == 5_001 and match["page"] == match["offset"] // PAGE_BYTES == 1
    assert match["text"] == "downloading https://bob:***@example.com/data.tar needle-in-the-log"
    assert secret["matches"] == []
    assert [(hit["run"], hit["line"]) for hit in every["matches"]] == [("study-2", 2)]
    assert empty["matches"] == []


def test_an_old_record_without_schema_version_shows(records):
    with served(str(records)) as server:
        status, run = api(server, "/api/run/old-run")
    assert status == 200 and run["schema_version"] == "1.0" and run["status"] == "SUCCEEDED"
    assert run["attempts"][0]["cause"] is None and run["reports"][0]["metrics"]["val_loss"] == 1.0
    assert run["resources"] == [] and run["resource_totals"] is None


def test_off_loopback_the_server_asks_for_its_token_and_takes_it_in_the_url_a_cookie_or_a_header(records):
    with served(str(records)) as local:
        assert local.token is None and "token" not in local.url
    with served(str(records), host="0.0.0.0") as server:
        assert server.token and server.url.endswith(f"/?token={server.token}")
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert get(base + "/api/runs")[0] == 401
        assert get(base + "/")[0] == 401
        assert get(base + "/?token=wrong")[0] == 401
        status, headers, _ = get(f"{base}/?token={server.token}")
        assert status == 200 and "HttpOnly" in headers["Set-Cookie"]
        cookie = headers["Set-Cookie"].split(";")[0]
        assert get(base + "/api/runs", {"Cookie": cookie})[0] == 200
        assert get(base + "/api/runs", {"Authorization": f"Bearer {server.token}"})[0] == 200
        assert get(base + "/api/runs", {"Authorization": "Bearer nope"})[0] == 401


def test_pages_load_nothing_from_elsewhere_and_run_no_inline_script_or_style(records):
    with served(str(records)) as server:
        status, headers, body = get(server.url + "run/study-1")
        assets = [get(server.url + f"static/{name}") for name in ("app.js", "app.css")]
    policy = headers["Content-Security-Policy"]
    assert status == 200 and "default-src 'none'" in policy and "unsafe" not in policy
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert [asset[0] for asset in assets] == [200, 200]
    for text in (body, *(asset[2] for asset in assets)):
        # SVG's namespace names no place to load from (the charts' markup and the graph's elements are made in it).
        assert b"http://" not in text.replace(b'"http://www.w3.org/2000/svg"', b"")
        assert b"https://" not in text
    assert b"<style" not in body and b" style=" not in body and b"<script>" not in body


def test_export_writes_every_page_with_its_data_and_the_logs_as_text_pages(records, tmp_path):
    done = rayjobs_in_process("ui", str(records), "--export", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    assert "wrote 3 run page(s) of 4 run(s)" in done.stderr
    site = tmp_path / "site"
    index = (site / "index.html").read_text()
    assert 'data-mode="export"' in index and '"study-1"' in index
    run = (site / "run" / "study-1.html").read_text()
    assert '<script type="application/json" id="data">' in run and "plain-secret" not in run
    texts = sorted((site / "run" / "study-1").glob("log-raysubmit_one-*.txt"))
    assert len(texts) == 3 and "".join(path.read_text() for path in sorted(
        texts, key=lambda path: int(path.stem.rsplit("-", 1)[1]))) == "".join(LINES).replace(SECRET, "***")
    assert json.loads(run.split('id="data">')[1].split("</script>")[0])["run"] == "study-1"
    assert (site / "compare.html").exists()


def test_a_port_in_use_is_a_clear_error(records):
    with served(str(records)) as server:
        taken = rayjobs_in_process("ui", str(records), "--port", str(server.server_address[1]))
    assert taken.returncode == ExitCode.BAD_INPUT and "cannot serve on 127.0.0.1" in taken.stderr


@pytest.mark.processes
def test_a_wheel_of_rayjobs_ships_the_pages_templates_script_and_style(tmp_path):
    """An editable install reads them from the source tree; an installed wheel has only what setuptools packed."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from runner.ui import pages
    from tests.support.cli import REPO_ROOT

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in ("rayjobs_agent", "jobs", "runner", "workloads"):
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("rayjobs-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"runner/ui/{pages.STATIC_FOLDER}/{name}" for name in pages.static_files()}
    wanted |= {f"runner/ui/templates/{name}.html" for name in ("page", "runs", "run", "compare")}
    assert wanted - packed == set(), "add them to [tool.setuptools.package-data] in pyproject.toml"


def test_bytes_and_times_are_worded_once_for_the_terminal_and_the_page():
    assert [format_bytes(size) for size in (0, 512, 1536, 3 * 2 ** 30, 5 * 2 ** 40, None, "x", -1)] == [
        "0 B", "512 B", "1.5 KiB", "3.0 GiB", "5.0 TiB", "-", "-", "-"]
    assert local_time(None) == "-" and local_time(10 ** 20) == f"{10 ** 20} (Unix seconds)"
