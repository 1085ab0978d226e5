"""``rayjobs ui`` in a real browser over records real jobs wrote: Debian's headless Chromium loads each page from
the real command and the tests read the DOM its scripts built. The jobs run on the session's cluster: one that
succeeds and reports metrics and resource samples, one that fails with a cause the agent names, a sweep's
trials, one still running (stopped at the end), and one whose record is in moto's S3."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.records.report import run_status
from runner.records.store import Folder, attempt_log, read_run
from tests.support.cli import cli_env, rayjobs_command
from tests.support.s3_server import aws_variables, create_bucket
from tests.support.ui_browser import CHROMIUM, NO_CHROMIUM, dom_after_scripts, parsed
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)

SCRIPTS = {
    "report.py": """
import time
from rayjobs_agent.events import emit
for epoch in range(1, 5):
    end = time.time() + 0.6
    while time.time() < end:  # work the agent's sampler sees
        pass
    emit("report", iteration=epoch, epochs=4, checkpoint=False,
         metrics={"epoch": epoch, "val_loss": round(1 / epoch, 4), "val_accuracy": round(0.2 * epoch, 4)})
    print(f"trained epoch {epoch}", flush=True)
""",
    "fail.py": "print('loading the model', flush=True)\nimport no_such_module_for_rayjobs_ui\n",
    "sweep.py": """
from rayjobs_agent.events import emit
for index, lr in enumerate((0.1, 0.01, 0.001)):
    name = f"trial_{index}"
    emit("trial", trial=name, state="started", values={"workload.train.lr": lr})
    for epoch in (1, 2):
        emit("trial", trial=name, state="running", epoch=epoch, metric=round(lr * 10 * epoch, 4))
    emit("trial", trial=name, state="ended")
print("sweep done", flush=True)
""",
    "sleep.py": "import time\nprint('sleeping a while', flush=True)\ntime.sleep(600)\n",
}


def _submit(spec: Path, env: dict[str, str]) -> str:
    done = subprocess.run([*rayjobs_command(), "submit", str(spec), "--no-wait"], capture_output=True, text=True,
                          env=env, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _spec(directory: Path, name: str, script: str, record_path: str, env_vars: dict[str, str] | None = None) -> Path:
    variables = "".join(f"    {key}: '{value}'\n" for key, value in (env_vars or {}).items())
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\nentrypoint: python {script}\nrecord_path: {record_path}\nrecord_every_s: 1\n"
                    f"runtime_env:\n  working_dir: {directory / 'code'}\n"
                    + (f"  env_vars:\n{variables}" if variables else ""))
    return path


@pytest.fixture(scope="module")
def written(ray_cluster, ray_cluster_home, s3_endpoint, tmp_path_factory) -> Iterator[dict]:
    """The runs the jobs recorded: name → run folder; the running job is stopped when the module ends."""
    directory = tmp_path_factory.mktemp("ui-jobs")
    (directory / "code").mkdir()
    for name, text in SCRIPTS.items():
        (directory / "code" / name).write_text(text)
    records = directory / "records"
    create_bucket(s3_endpoint, "ui-records")
    aws = aws_variables(s3_endpoint)
    env = cli_env(ray_cluster_home)
    # The agent samples the jobs' resource use twice a second, so that a short job has samples to draw.
    sampled = {"RAYJOBS_RESOURCES_EVERY_S": "0.5"}
    jobs = {name: _submit(_spec(directory, name, script, str(records), sampled), env)
            for name, script in (("ui-ok", "report.py"), ("ui-fail", "fail.py"), ("ui-sweep", "sweep.py"),
                                 ("ui-running", "sleep.py"))}
    jobs["ui-s3"] = _submit(_spec(directory, "ui-s3", "report.py", "s3://ui-records/runs", {**aws, **sampled}), env)
    folders = {name: Folder(str(records / f"{name}-{job}")) for name, job in jobs.items() if name != "ui-s3"}

    def settled() -> bool:
        for name, folder in folders.items():
            if folder.read("run.json") is None:
                return False
            document = read_run(folder)
            if name == "ui-running":
                if b"sleeping a while" not in attempt_log(folder, jobs[name]):
                    return False
            elif run_status(document) == "RUNNING" or (name == "ui-fail" and not document.get("cause")):
                return False
        return True

    try:
        wait_for_condition(settled, timeout_s=HANG_GUARD_S, interval_s=1)
        with _aws(aws):
            s3_run = Folder(f"s3://ui-records/runs/ui-s3-{jobs['ui-s3']}")
            wait_for_condition(lambda: s3_run.read("run.json") is not None
                               and read_run(s3_run)["status"] == "SUCCEEDED", timeout_s=HANG_GUARD_S, interval_s=1)
        yield {"records": records, "runs": {name: folder.name for name, folder in folders.items()},
               "s3_run": s3_run.name, "aws": aws, "directory": directory}
    finally:
        subprocess.run([*rayjobs_command(), "stop", jobs["ui-running"]], env=env, capture_output=True, timeout=120,
                       check=False)


@contextlib.contextmanager
def _aws(variables: dict[str, str]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("AWS_")]:
            patch.delenv(name)
        for name, value in variables.items():
            patch.setenv(name, value)
        yield


@contextlib.contextmanager
def real_ui(location: str, env: dict[str, str]) -> Iterator[str]:
    """The real ``rayjobs ui`` process on a free port; yields the URL it printed."""
    process = subprocess.Popen([*rayjobs_command(), "ui", location, "--port", "0"], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line = process.stderr.readline()
        found = re.search(r"at (http://\S+)", line)
        assert found, f"rayjobs ui printed {line!r}"
        yield found[1]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_runs_page_shows_each_run_its_status_cause_and_key_metric(written):
    with real_ui(str(written["records"]), cli_env(None)) as url:
        page = parsed(dom_after_scripts(url))
    assert page.one("body").attrs.get("data-ready") == "1", page.text()[:500]
    rows = {row.attrs["data-run"]: row for row in page.all("tr") if "data-run" in row.attrs}
    runs = written["runs"]
    assert set(rows) == set(runs.values())
    assert rows[runs["ui-ok"]].attrs["data-status"] == "SUCCEEDED"
    assert rows[runs["ui-ok"]].one("td", class_="metric").text() == "val_loss 0.25"
    failed = rows[runs["ui-fail"]]
    assert failed.attrs["data-status"] == "FAILED" and failed.one("td", class_="cause-cell").text() == "module_missing"
    assert rows[runs["ui-running"]].attrs["data-status"] == "RUNNING"
    assert "refreshing" in page.one(id="live").text()


def test_a_run_page_draws_its_curves_and_resources_and_pages_its_log(written):
    name = written["runs"]["ui-ok"]
    with real_ui(str(written["records"]), cli_env(None)) as url:
        page = parsed(dom_after_scripts(f"{url}run/{name}"))
    assert page.one("body").attrs.get("data-ready") == "1", page.text()[:500]
    curves = {figure.attrs["data-title"] for figure in page.one(id="curves").all("figure")}
    assert {"val_loss", "val_accuracy"} <= curves
    assert len(page.one(id="curves").all("polyline")) >= 2
    assert {figure.attrs["data-title"] for figure in page.one(id="resources").all("figure")} >= {"CPU cores in use"}
    assert page.one(id="log-where").text().startswith("page 1 of 1")
    assert "trained epoch 4" in page.one(id="log-text").text()
    assert "report.py" in page.one(id="spec-text").text()


def test_a_failed_run_shows_its_cause_and_its_fix(written):
    with real_ui(str(written["records"]), cli_env(None)) as url:
        page = parsed(dom_after_scripts(f"{url}run/{written['runs']['ui-fail']}"))
    (attempt,) = page.one(id="attempts-table").all("tr", data_attempt="1")
    cause = attempt.one("div", class_="cause")
    assert cause.attrs["data-cause"] == "module_missing"
    assert "no_such_module_for_rayjobs_ui" in cause.text() and "Fix:" in cause.text()


def test_a_sweep_shows_its_trials_as_a_table_and_a_plot(written):
    with real_ui(str(written["records"]), cli_env(None)) as url:
        page = parsed(dom_after_scripts(f"{url}run/{written['runs']['ui-sweep']}"))
    trials = page.one(id="trials-table").all("tr")
    assert [row.attrs.get("data-trial") for row in trials[1:]] == ["trial_0", "trial_1", "trial_2"]
    assert "0.001" in trials[3].text() and "ended" in trials[3].text()
    assert len(page.one(id="trials").all("polyline")) == 3


def test_a_running_job_s_page_says_it_refreshes_and_shows_its_log_so_far(written):
    with real_ui(str(written["records"]), cli_env(None)) as url:
        page = parsed(dom_after_scripts(f"{url}run/{written['runs']['ui-running']}", budget_ms=8000))
    assert page.one(id="title").one("span", class_="status").attrs["data-status"] == "RUNNING"
    assert "refreshing" in page.one(id="live").text()
    assert "sleeping a while" in page.one(id="log-text").text()


def test_a_record_in_s3_shows(written):
    with real_ui("s3://ui-records/runs", cli_env(None, **written["aws"])) as url:
        runs = parsed(dom_after_scripts(url))
        page = parsed(dom_after_scripts(f"{url}run/{written['s3_run']}"))
    assert [row.attrs["data-run"] for row in runs.all("tr") if "data-run" in row.attrs] == [written["s3_run"]]
    assert page.one(id="title").one("span", class_="status").attrs["data-status"] == "SUCCEEDED"
    assert "trained epoch 4" in page.one(id="log-text").text()


def test_the_exported_pages_open_from_disk(written, tmp_path):
    done = subprocess.run([*rayjobs_command(), "ui", str(written["records"]), "--export", str(tmp_path / "site")],
                          capture_output=True, text=True, env=cli_env(None), timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    index = parsed(dom_after_scripts((tmp_path / "site" / "index.html").as_uri()))
    assert {row.attrs["data-run"] for row in index.all("tr") if "data-run" in row.attrs} == set(
        written["runs"].values())
    assert "needs the served page" in index.one(id="search-results").text()
    run = parsed(dom_after_scripts((tmp_path / "site" / "run" / f"{written['runs']['ui-ok']}.html").as_uri()))
    assert run.one("body").attrs.get("data-ready") == "1"
    assert len(run.one(id="curves").all("polyline")) >= 2
    assert any(link.attrs["href"].endswith("-1.txt") for link in run.one(id="log").all("a"))
    compare = (tmp_path / "site" / "compare.html").as_uri() + "?" + "&".join(
        f"run={written['runs'][name]}" for name in ("ui-ok", "ui-fail"))
    compared = parsed(dom_after_scripts(compare))
    assert len(compared.one(id="compare-table").all("span", class_="status")) == 2
