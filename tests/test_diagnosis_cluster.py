"""Failures brought about for real, each named with what to do (rayjobs_agent/causes.py, said by the agent).

They run on the session cluster (2 CPUs), one job each. A full disk and refused object-store credentials
need no cluster: tests/test_diagnosis.py brings them about in its own process; the causes this machine
cannot bring about at all are named there from recorded log lines.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli import plain_train_spec
from tests.support.waiting import HANG_GUARD_S


def test_a_failure_with_a_known_cause_is_named_with_what_to_do(rayjobs_cli, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import rayjobs_no_such_module\n")
    spec = tmp_path / "missing.yaml"
    spec.write_text(f"name: missing-module\nentrypoint: python train.py\nruntime_env:\n  working_dir: {code}\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 1, result.stderr
    why = [line for line in result.stderr.splitlines() if line.startswith("rayjobs: why: ")]
    assert why == ["rayjobs: why: A module is missing on the cluster: no module named 'rayjobs_no_such_module'. "
                   "Install it in the job's environment (runtime_env.pip, or the cluster's image); if it is your "
                   "own code, it must be inside runtime_env.working_dir or listed in runtime_env.py_modules"]
    job_id = re.search(r"submitted missing-module as (\S+)", result.stderr)[1]
    status = rayjobs_cli("status", job_id)
    assert status.returncode == 1
    assert "why:" in status.stdout and "no module named 'rayjobs_no_such_module'" in status.stdout


@pytest.mark.parametrize(("cause", "arguments", "named"), [
    ("collective_timeout", "--hang-at-epoch 2 --collective-timeout-s 5 --max-failures 0",
     "A collective operation (gloo/NCCL) timed out"),
    # One worker, dying in the first epoch of both attempts: a restart is what is counted, not who dies.
    ("max_failures_used_up", "--workers 1 --die-at-epoch 1 --max-failures 1", "used up its max_failures"),
], ids=["collective_timeout", "max_failures_used_up"])
def test_failures_brought_about_for_real_are_named(rayjobs_cli, tmp_path, cause, arguments, named):
    """A rank that skips its part of DDP's all-reduce under a short gloo timeout; a rank that dies in every
    attempt (the one worker of a run, in its first epoch). (More workers than the cluster has is not among them: Ray Train waits for them to fit, and the
    job stalls instead of failing; the stall warning covers it.)"""
    spec = plain_train_spec(tmp_path, "failing", f"--epochs 3 --epoch-s 0.1 {arguments}", policy="record: false\n")
    result = rayjobs_cli("submit", str(spec), "--output", "json", timeout=HANG_GUARD_S * 3)
    assert result.returncode == 1, result.stderr[-3000:]
    diagnosis = json.loads(result.stdout)["diagnosis"]
    assert diagnosis is not None and diagnosis["cause"] == cause, (diagnosis, result.stderr[-3000:])
    assert named in diagnosis["text"], diagnosis
