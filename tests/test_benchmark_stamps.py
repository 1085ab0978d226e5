"""`benchmarks/run_all.py --check`: a table or quoted figure is stale once the code it measured changes.

The checker is tested on a temporary project tree; the last test runs it on the project's own docs, so
a change to measured code fails the fast tier until its benchmarks run again (``--check`` names them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run_all import BENCHMARKS, render
from benchmarks.stamps import (check_docs, check_figures, check_tables, commits_not_in_history, fill_figures,
                               sources_digest, stamped_commits)
from tests.support.cli import REPO_ROOT

MEASURED = ("pkg", "specs/job.yaml")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with a package and a spec that a benchmark measures, and code it does not."""
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "core.py").write_text("RATE = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0compiled")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "job.yaml").write_text("name: job\n")
    (tmp_path / "other.py").write_text("UNRELATED = 1\n")
    (tmp_path / "docs").mkdir()
    return tmp_path


def result(digest: str | None, figures: dict | None = None) -> dict:
    """A benchmark's result as a benchmark script writes it, measured on code of hash ``digest``."""
    measured = {"name": "speed", "columns": ["side", "images/s"], "rows": [["ours", "10.0"]], "notes": [],
                "command": "benchmarks/speed.py", "figures": figures or {},
                "stamp": {"commit": "abc1234", "dirty": False, "date": "2026-11-25 10:00 UTC", "cores": 2,
                          "load_before": 0.5, "load_after": 0.6}}
    if digest is not None:
        measured["sources_sha256"] = digest
    return measured


def write_docs(project: Path, block: str) -> Path:
    docs = project / "docs" / "benchmarks.md"
    docs.write_text(f"# Benchmarks\n\nProse.\n\n<!-- bench:speed -->\n{block}\n<!-- /bench:speed -->\n\nMore prose.\n")
    return docs


def test_a_fresh_stamp_passes_and_a_change_to_measured_code_makes_it_stale(project, capsys):
    docs = write_docs(project, render([result(sources_digest(project, MEASURED))]))
    current = {"speed": sources_digest(project, MEASURED)}
    assert check_docs(docs, project, current, ("docs",)) == 0
    assert "fresh     docs/benchmarks.md: table speed" in capsys.readouterr().out

    (project / "pkg" / "core.py").write_text("RATE = 2\n")
    current = {"speed": sources_digest(project, MEASURED)}
    assert check_docs(docs, project, current, ("docs",)) == 1
    out = capsys.readouterr().out
    assert "stale     docs/benchmarks.md: table speed: measured code sha256:" in out
    assert "benchmarks/run_all.py --only speed" in out


@pytest.mark.parametrize("change", ["edit the spec", "add a module", "remove a module", "remove the spec"])
def test_every_kind_of_change_to_measured_files_changes_the_hash(project, change):
    before = sources_digest(project, MEASURED)
    if change == "edit the spec":
        (project / "specs" / "job.yaml").write_text("name: job2\n")
    elif change == "add a module":
        (project / "pkg" / "extra.py").write_text("")
    elif change == "remove a module":
        (project / "pkg" / "core.py").unlink()
    else:
        (project / "specs" / "job.yaml").unlink()
    assert sources_digest(project, MEASURED) != before


def test_code_the_benchmark_does_not_measure_leaves_the_hash_alone(project):
    before = sources_digest(project, MEASURED)
    (project / "other.py").write_text("UNRELATED = 2\n")
    (project / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0recompiled")
    assert sources_digest(project, MEASURED) == before
    assert sources_digest(project, ["specs/job.yaml", "pkg", "pkg"]) == before  # order and repeats do not count


def test_a_table_without_a_hash_or_without_its_block_fails_the_check(project):
    digest = sources_digest(project, MEASURED)
    unstamped = render([result(None)])
    assert "sha256" not in unstamped
    findings = check_tables(f"<!-- bench:speed -->\n{unstamped}\n<!-- /bench:speed -->", "b.md",
                            {"speed": digest, "latency": digest})
    assert [(f.where, f.state) for f in findings] == [("b.md: table speed", "unstamped"),
                                                      ("b.md: table latency", "missing")]


def test_a_quick_runs_table_is_never_taken_for_fresh(project):
    digest = sources_digest(project, MEASURED)
    quick = render([{**result(digest), "quick": True}])
    assert f"sources sha256:{digest}" in quick
    (finding,) = check_tables(f"<!-- bench:speed -->\n{quick}\n<!-- /bench:speed -->", "b.md", {"speed": digest})
    assert (finding.state, finding.ok) == ("quick", False)


def test_runs_of_one_table_that_measured_different_code_leave_it_unstamped():
    assert "sha256" not in render([result("1111111111111111"), result("2222222222222222")])
    assert render([result("1111111111111111"), result("1111111111111111")]).endswith(
        "<!-- sources sha256:1111111111111111 -->")


def test_a_quoted_figure_is_filled_from_the_results_and_goes_stale_with_its_table(project, capsys):
    digest = sources_digest(project, MEASURED)
    readme = project / "README.md"
    readme.write_text("Training runs at <!-- figure:speed.ratio -->0.5×<!-- /figure --> the baseline.\n")
    filled, unknown = fill_figures(readme.read_text(), {"speed": [result(digest, {"ratio": {
        "unit": "x", "median": 0.964, "low": 0.9, "high": 1.0, "values": [0.9, 0.964, 1.0]}})]})
    assert unknown == []
    assert f"<!-- figure:speed.ratio sha256:{digest} -->0.96×<!-- /figure --> the baseline" in filled
    readme.write_text(filled)
    docs = write_docs(project, render([result(digest)]))
    assert check_docs(docs, project, {"speed": digest}, ("README.md", "docs")) == 0

    (project / "pkg" / "core.py").write_text("RATE = 3\n")
    assert check_docs(docs, project, {"speed": sources_digest(project, MEASURED)}, ("README.md", "docs")) == 1
    out = capsys.readouterr().out
    assert "stale     README.md: figure speed.ratio" in out and "stale     docs/benchmarks.md: table speed" in out


def test_a_figure_the_results_do_not_hold_is_named_and_left_as_it_was():
    text = "<!-- figure:speed.typo -->1.0×<!-- /figure -->"
    filled, unknown = fill_figures(text, {"speed": [result("1111111111111111")]})
    assert (filled, unknown) == (text, ["speed.typo"])


def test_a_marker_quoted_in_a_code_span_is_documentation_not_a_figure():
    text = "Quote a figure between `<!-- figure:NAME.KEY -->` and `<!-- /figure -->`."
    assert fill_figures(text, {"NAME": [result("1111111111111111", {"KEY": {"unit": "x", "median": 2.0}})]}) == \
        (text, [])
    assert check_figures(text, "docs/benchmarks.md", {"NAME": "1111111111111111"}) == []


def test_the_commits_named_by_stamps_are_checked_against_the_history():
    text = "at commit `0000000` with uncommitted changes, …\nat commit `0000000`, …\nat commit `1111111`, …"
    assert stamped_commits(text) == ["0000000", "1111111"]
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    assert commits_not_in_history(REPO_ROOT, [head, "0000000"]) == ["0000000"]


def test_every_benchmark_declares_sources_that_exist_and_has_a_table():
    tables = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for benchmark in BENCHMARKS:
        missing = [path for path in benchmark.sources() if not (REPO_ROOT / path).exists()]
        assert missing == [], f"{benchmark.name} declares paths that do not exist: {missing}"
        assert f"<!-- bench:{benchmark.name} -->" in tables


def test_the_check_command_runs_without_ray_or_torch(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("no tables yet\n")
    probe = ("import runpy, sys\n"
             f"sys.argv = ['run_all.py', '--check', '--docs', {str(docs)!r}]\n"
             "try:\n"
             "    runpy.run_path('benchmarks/run_all.py', run_name='__main__')\n"
             "except SystemExit as done:\n"
             "    print(json.dumps({'code': done.code, 'heavy': sorted({'ray', 'torch'} & set(sys.modules))}))\n")
    ran = subprocess.run([sys.executable, "-c", "import json\n" + probe], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    outcome = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome == {"code": 1, "heavy": []}, ran.stdout + ran.stderr
    assert f"missing   {docs}: table cli_latency" in ran.stdout


def test_every_table_and_quoted_figure_of_the_docs_was_measured_on_the_code_as_it_is():
    ran = subprocess.run([sys.executable, "benchmarks/run_all.py", "--check"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, (
        "the docs quote figures measured on other code; run the benchmarks it names again "
        "(`benchmarks/run_all.py --only …`):\n" + ran.stdout + ran.stderr)
