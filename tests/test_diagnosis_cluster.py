"""Failures brought about for real, each named with what to do (runner/follow/diagnosis.py).

They run on a cluster of their own (2 CPUs, started through the CLI), beside the session's: each is a job
that waits on a timeout or a restart more than it computes. A full disk and refused object-store credentials
need no cluster: tests/test_diagnosis.py brings them about in its own process; the causes this machine
cannot bring about at all are named there from recorded log lines.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import REPO_ROOT, run_rayjobs
from tests.support.waiting import HANG_GUARD_S

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"
pytestmark = pytest.mark.cluster  # its own cluster, started through the CLI


@pytest.fixture(scope="module")
def causes_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RAYJOBS_HOME of this module's 2-CPU cluster; stopped afterwards."""
    home = tmp_path_factory.mktemp("causes-home")
    up = run_rayjobs("cluster", "up", "--num-cpus", "2", home=home, timeout=400)
    try:
        assert up.returncode == 0, up.stderr
        yield home
    finally:
        run_rayjobs("cluster", "down", home=home, timeout=120)


@pytest.fixture
def causes_cluster(causes_home: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real `rayjobs` command against this module's cluster."""
    def run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_rayjobs(*args, home=causes_home, **kwargs)

    return run


def test_a_failure_with_a_known_cause_is_named_with_what_to_do(causes_cluster, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import rayjobs_no_such_module\n")
    spec = tmp_path / "missing.yaml"
    spec.write_text(f"name: missing-module\nentrypoint: python train.py\nruntime_env:\n  working_dir: {code}\n")
    result = causes_cluster("submit", str(spec))
    assert result.returncode == 1, result.stderr
    why = [line for line in result.stderr.splitlines() if line.startswith("rayjobs: why: ")]
    assert why == ["rayjobs: why: A module is missing on the cluster: no module named 'rayjobs_no_such_module'. "
                   "Install it in the job's environment (runtime_env.pip, or the cluster's image); if it is your "
                   "own code, it must be inside runtime_env.working_dir or listed in runtime_env.py_modules"]
    job_id = re.search(r"submitted missing-module as (\S+)", result.stderr)[1]
    status = causes_cluster("status", job_id)
    assert status.returncode == 1
    assert "why:" in status.stdout and "no module named 'rayjobs_no_such_module'" in status.stdout


@pytest.mark.parametrize(("cause", "arguments", "named"), [
    ("collective_timeout", "--hang-at-epoch 2 --collective-timeout-s 5 --max-failures 0",
     "A collective operation (gloo/NCCL) timed out"),
    ("max_failures_used_up", "--die-at-epoch 2 --max-failures 1", "used up its max_failures"),
], ids=["collective_timeout", "max_failures_used_up"])
def test_failures_brought_about_for_real_are_named(causes_cluster, tmp_path, cause, arguments, named):
    """A rank that skips its part of DDP's all-reduce under a short gloo timeout; a rank that dies in every
    attempt. (More workers than the cluster has is not among them: Ray Train waits for them to fit, and the
    job stalls instead of failing; the stall warning covers it.)"""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    spec = tmp_path / "failing.yaml"
    spec.write_text(f"name: failing\nentrypoint: python train.py --storage {tmp_path / 'runs'} --epochs 3 "
                    f"--epoch-s 0.1 {arguments}\nrecord: false\nruntime_env:\n  working_dir: {code}\n")
    result = causes_cluster("submit", str(spec), "--output", "json", timeout=HANG_GUARD_S * 3)
    assert result.returncode == 1, result.stderr[-3000:]
    diagnosis = json.loads(result.stdout)["diagnosis"]
    assert diagnosis is not None and diagnosis["cause"] == cause, (diagnosis, result.stderr[-3000:])
    assert named in diagnosis["text"], diagnosis
