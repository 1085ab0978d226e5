"""The documentation site builds strictly, its spec reference covers every field, and the README stays a front door.

One ``mkdocs build --strict`` serves the module: a broken link or anchor, a page missing from the nav,
or a spec field without a description fails it. The fields expected in the reference are found by
walking the pydantic models here, independently of the JSON Schema the build hook reads.
"""

from __future__ import annotations

import collections.abc
import html
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from jobs.spec import JobSpec
from jobs.workload_kinds import BUILTIN_WORKLOADS, workload_model
from runner.errors import ExitCode
from tests.support.cli import REPO_ROOT

README = REPO_ROOT / "README.md"
INSTALL_AND_RUN = ("python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[dev,hf]' "
                   "&& .venv/bin/rayjobs submit --local specs/quickstart.yaml")
RUN_TESTS = ".venv/bin/python -m pytest"

# One test process builds the site for every test here, rather than each process building its own.
pytestmark = [pytest.mark.xdist_group("docs-site"), pytest.mark.processes]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for the module exactly as a maintainer would: ``mkdocs build --strict``."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    site_dir = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    return site_dir


def field_paths(model: type[BaseModel], prefix: str, seen: tuple[type, ...] = ()) -> list[str]:
    """Dotted paths of a model's fields and of the fields of every model nested in it, as a spec writes them.

    A model inside a list is written ``field[].sub``, one inside a mapping's values ``field.*.sub``.
    """
    if model in seen:
        return []
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        paths.append(path)
        paths += _nested_paths(field.annotation, path, (*seen, model))
    return paths


def _nested_paths(annotation: typing.Any, path: str, seen: tuple[type, ...]) -> list[str]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return field_paths(annotation, f"{path}.", seen)
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        return [found for argument in arguments for found in _nested_paths(argument, f"{path}[]", seen)]
    if origin in (dict, collections.abc.Mapping):
        return _nested_paths(arguments[-1], f"{path}.*", seen)
    return [found for argument in arguments for found in _nested_paths(argument, path, seen)]


def every_spec_field() -> list[str]:
    """Every field of the spec and of each built-in workload's parameters (under ``workload.``)."""
    paths = field_paths(JobSpec, "")
    for kind in BUILTIN_WORKLOADS:
        paths += field_paths(workload_model(kind), "workload.")
    return paths


def test_the_site_builds_strictly_and_has_every_page_of_the_nav(site):
    for page in ("index.html", "spec-reference/index.html", "troubleshooting/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    assert (site / "live-view.png").is_file()


def test_the_spec_reference_lists_every_field_of_every_spec_model(site):
    reference = (site / "spec-reference" / "index.html").read_text()
    missing = [path for path in every_spec_field() if f"<code>{html.escape(path)}</code>" not in reference]
    assert missing == []
    assert len(every_spec_field()) > 100  # the walk reached the nested models and every workload


def test_the_model_walk_names_nested_fields_as_a_spec_writes_them():
    paths = set(field_paths(JobSpec, ""))
    assert {"runtime_env.working_dir", "runtime_env.pip.packages", "sweep.parameters.*.choice"} <= paths
    assert any(path.startswith("tracking.mlflow.") for path in paths)


def test_a_field_without_a_description_fails_the_strict_build(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    import runner.cli.specs

    real_schema = runner.cli.specs.schema_document

    def schema_with_an_undescribed_field(workload=None):
        document = real_schema(workload)
        if workload is None:
            del document["$defs"]["RuntimeEnv"]["properties"]["working_dir"]["description"]
        return document

    monkeypatch.setattr(runner.cli.specs, "schema_document", schema_with_an_undescribed_field)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# A site\n\n[The reference](spec-reference.md)\n")
    (tmp_path / "docs" / "specs.md").write_text("# Writing a spec\n")  # the reference links to these two
    (tmp_path / "docs" / "pipelines.md").write_text("# Pipelines and quotas\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\ndocs_dir: docs\nsite_dir: {tmp_path / 'site'}\n"
        f"hooks:\n  - {REPO_ROOT / 'docs' / 'hooks' / 'spec_reference.py'}\n")
    with pytest.raises(Abort, match="1 warnings in strict mode"):
        build(load_config(str(tmp_path / "mkdocs.yml"), strict=True))
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warnings == ["spec reference: the field runtime_env.working_dir has no description; "
                        "give it Field(description=...)"]


def test_troubleshooting_has_an_entry_for_every_failure_cause_and_exit_code():
    from rayjobs_agent.causes import CAUSES

    page = (REPO_ROOT / "docs" / "troubleshooting.md").read_text()
    causes = [cause.name for cause in CAUSES] + ["max_failures_used_up"]
    assert [cause for cause in causes if f"(`{cause}`)" not in page] == []
    table = page[page.index("## Exit codes"):]
    assert [code for code in ExitCode if f"| {int(code)} |" not in table] == []


def test_the_readme_opens_with_the_two_commands_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.DOTALL)
    assert blocks[:2] == [INSTALL_AND_RUN, RUN_TESTS]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in ci and "-c constraints.txt -e '.[dev,hf]'" in ci
    assert RUN_TESTS in ci.splitlines()


def test_every_whole_spec_the_readme_and_the_pages_show_is_valid():
    from jobs.loader import validate_spec_data

    shown = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
    specs = [(page.name, document) for page in shown
             for document in map(yaml.safe_load, re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL))
             if isinstance(document, dict) and {"name", "entrypoint"} <= document.keys()]
    assert {"README.md", "specs.md"} <= {page for page, _ in specs}
    for page, document in specs:
        # Shown as if saved in specs/, where the example specs live and `working_dir: ..` is the project.
        loaded = validate_spec_data(document, REPO_ROOT / "specs" / "shown.yaml")
        assert loaded.spec.name == document["name"], page


def test_the_readme_keeps_no_dates_or_measured_timings():
    # A console block is what a command prints, and may say how long a job ran; the prose may not.
    prose = re.sub(r"```console\n.*?```", "", README.read_text(), flags=re.DOTALL)
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", prose) == []
    assert re.findall(r"\b\d+(?:\.\d+)?\s?(?:s|min|ms|h)\b", prose) == []
    assert len(README.read_text().split()) < 1000


def test_the_readme_links_resolve_to_pages_and_their_headings(site):
    links = re.findall(r"\]\((?!https?://)([^)#\s]+)(?:#([^)\s]+))?\)", README.read_text())
    assert links
    for target, anchor in links:
        assert (REPO_ROOT / target).exists(), target
        if anchor and target.startswith("docs/") and target.endswith(".md"):
            page = target.removeprefix("docs/").removesuffix(".md")
            built = site / "index.html" if page == "index" else site / page / "index.html"
            assert f'id="{anchor}"' in built.read_text(), f"{target}#{anchor}"
