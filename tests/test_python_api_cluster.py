"""The Python API page's example, run to success on the session cluster."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.cli import REPO_ROOT, cli_env
from tests.support.waiting import HANG_GUARD_S
from tests.test_python_api import PYTHON_API_PAGE, python_blocks


def test_the_pages_example_runs_a_job_to_success_on_a_cluster(ray_cluster, ray_cluster_home):
    """Run exactly as a reader would: a fresh Python in the project folder, the local cluster found by name."""
    (example,) = python_blocks(PYTHON_API_PAGE.read_text(encoding="utf-8"))
    ran = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, cwd=REPO_ROOT,
                         env=cli_env(ray_cluster_home), timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    assert ran.returncode == 0, ran.stderr
    printed = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"succeeded 0 \['raysubmit_\w+'\]", printed), ran.stdout + ran.stderr
    assert "rayjobs: submitted hello as raysubmit_" in ran.stderr
