"""``rayjobs ui``'s pages in Debian's headless Chromium over hand-made records (no cluster): served and exported,
they run under a Content-Security-Policy without ``unsafe-inline`` and the browser refuses nothing; the resource
plot runs forward in time; the log pane shows the job's lines without Ray's colour codes or the agent's event
lines. What the pages show of records real jobs wrote is tests/test_ui_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayjobs_agent.vocabulary import EVENT_MARKER
from tests.support.cli import rayjobs_in_process
from tests.support.ui_browser import CHROMIUM, NO_CHROMIUM, Node, dom_and_console, parsed, served
from tests.test_record_reading import GOOD, GOOD_ATTEMPT, with_changes, write_run

pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM), pytest.mark.processes]

# Sample times as the record keeps them: 1025 was taken while the log was mid-line and went to the record at once,
# ahead of 1020, which waited in the log for the next upload.
SAMPLE_TIMES = [1000.0, 1010.0, 1025.0, 1020.0, 1030.0, 1040.0]
COLOURED = "\x1b[36m(TrainController pid=7)\x1b[0m epoch 1 done \x1b[1m\x1b[32mok\x1b[0m\n"
AGENT_LINE = f'{EVENT_MARKER} {{"event":"resources","time":1020.0,"cpu":1.0,"every_s":10}}\n'


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ui-browser")
    events = [{"event": "resources", "time": at, "cpu": 1 + (at - 1000) / 100, "rss_bytes": 2 ** 30, "every_s": 10}
              for at in SAMPLE_TIMES]
    events += [{"event": "report", "time": 1000.0 + i, "iteration": i, "metrics": {"epoch": i, "val_loss": 1 / i}}
               for i in (1, 2, 3)]
    events += [{"event": "trial", "trial": f"trial_{index}", "state": "running", "epoch": 1, "metric": index / 10}
               for index in (0, 1)]
    log = ("starting\n" + COLOURED + AGENT_LINE + f"(TrainController pid=7) {AGENT_LINE}" + "done\n").encode()
    write_run(root, "sampled", GOOD, events=events, log=log)
    write_run(root, "earlier", with_changes(started=900.0, ended=930.0,
                                            attempts=[{**GOOD_ATTEMPT, "submission_id": "raysubmit_earlier"}]))
    return root


def _loaded(url: str) -> Node:
    dom, console = dom_and_console(url)
    refused = [message for message in console if "Content Security Policy" in message or "Uncaught" in message]
    assert refused == [], refused
    page = parsed(dom)
    assert page.one("body").attrs.get("data-ready") == "1", "the page's script did not finish"
    assert page.all(id="error") == [], page.one(id="error").text()
    return page


def _xs(figure: Node) -> list[float]:
    (line,) = figure.all("polyline")
    return [float(point.split(",")[0]) for point in line.attrs["points"].split()]


def test_the_served_pages_run_under_their_policy_and_the_resource_plot_runs_forward_in_time(records):
    with served(str(records)) as server:
        run = _loaded(server.url + "run/sampled")
        runs = _loaded(server.url)
    cpu = run.one("figure", data_title="CPU cores in use")
    xs = _xs(cpu)
    assert len(xs) == len(SAMPLE_TIMES) and xs == sorted(xs), xs
    assert run.all("figure", data_title="val_loss"), "the curves are drawn"
    swatches = run.all("i", class_="swatch")
    assert len(swatches) == 2 and all("background-color" in swatch.attrs.get("style", "") for swatch in swatches)
    assert {row.attrs["data-run"] for row in runs.all("tr", data_status="SUCCEEDED")} == {"sampled", "earlier"}


def test_the_log_pane_shows_the_job_s_lines_without_colour_codes_or_the_agent_s_event_lines(records):
    with served(str(records)) as server:
        searched = _loaded(server.url + "run/sampled#log=raysubmit_good:0:epoch")
    text = searched.one("pre", id="log-text").text()
    assert text == "starting (TrainController pid=7) epoch 1 done ok done"
    assert "\x1b" not in text and "[36m" not in text and EVENT_MARKER not in text
    matches = searched.one(id="log-matches").text()
    assert "line 2 (page 1): (TrainController pid=7) epoch 1 done ok" in matches and EVENT_MARKER not in matches


def test_the_exported_pages_run_from_disk_under_the_same_policy(records, tmp_path):
    done = rayjobs_in_process("ui", str(records), "--export", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    assert sorted(path.name for path in (site / "static").iterdir()) == ["app.css", "app.js"]
    index = _loaded((site / "index.html").as_uri())
    run = _loaded((site / "run" / "sampled.html").as_uri())
    assert {row.attrs["data-run"] for row in index.all("tr", data_status="SUCCEEDED")} == {"sampled", "earlier"}
    xs = _xs(run.one("figure", data_title="CPU cores in use"))
    assert len(xs) == len(SAMPLE_TIMES) and xs == sorted(xs)
    log = (site / "run" / "sampled" / "log-raysubmit_good-1.txt").read_text()
    assert "\x1b" not in log and EVENT_MARKER not in log and "epoch 1 done ok" in log
    embedded = json.loads((site / "run" / "sampled.html").read_text().split('id="data">')[1].split("</script>")[0])
    assert [sample["time"] for sample in embedded["resources"]] == sorted(SAMPLE_TIMES)
