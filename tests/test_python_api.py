"""The Python API as docs/python-api.md shows it: its example's one import, and ``runner`` is one cheap import.

The example is taken from the page itself, so the page cannot drift from the code: a renamed
function fails here, a changed result in test_python_api_cluster.py (which runs it), before a reader finds out.
"""

from __future__ import annotations

import re
import subprocess
import sys

import runner
from tests.support.cli import REPO_ROOT
from tests.support.waiting import HANG_GUARD_S

PYTHON_API_PAGE = REPO_ROOT / "docs" / "python-api.md"


def python_blocks(markdown: str) -> list[str]:
    """The ```python code blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```$", markdown, re.M | re.S)


def test_the_pages_example_needs_one_import_and_every_public_name_resolves():
    blocks = python_blocks(PYTHON_API_PAGE.read_text(encoding="utf-8"))
    assert len(blocks) == 1
    imports = [line for line in blocks[0].splitlines() if re.match(r"(from|import) ", line)]
    assert imports == ["from runner import RunOptions, connect, load_spec, submit"]
    for name in runner.__all__:
        assert getattr(runner, name) is not None, name
    from runner.run.lifecycle import run_with_retries

    assert runner.submit is run_with_retries


def test_importing_runner_loads_no_run_no_ray_and_no_pydantic():
    # Every command imports ``runner``; what the API pulls in comes only when a name is used.
    probe = ("import sys, runner; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pydantic') "
             "or m.startswith(('runner.run', 'runner.client', 'jobs'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT,
                            timeout=HANG_GUARD_S, check=True)
    assert loaded.stdout.strip() == "[]"
