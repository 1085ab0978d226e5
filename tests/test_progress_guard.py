"""The progress channel cannot fail a run: its hooks are guarded, its import cannot break ``fit``, and it is
installed only on the Ray versions it is tested on (rayjobs_agent/guard.py, train_hooks/install.py)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from jobs.loader import load_spec
from rayjobs_agent.wire import RECORD_ENV_VAR
from jobs.submission import PROGRESS_CALLBACK, build_submission
from rayjobs_agent import supervisor
from rayjobs_agent.train_hooks import install
from rayjobs_agent.guard import guarded

OURS = install.PROGRESS_CALLBACK
REPO_ROOT = Path(__file__).resolve().parents[1]


class Hooks:
    """A callback with one hook that works and one that fails, as a Ray Train callback's hooks are called."""

    def __init__(self) -> None:
        self.calls = 0

    @guarded
    def after_report(self, training_report: object, metrics: list) -> str:
        self.calls += 1
        return "reported"

    @guarded
    def after_controller_state_update(self, previous_state: object, current_state: object) -> None:
        raise KeyError("training_failed_error")


def test_a_failing_hook_turns_the_callback_off_said_once_and_never_raises(capsys):
    hooks = Hooks()
    assert hooks.after_report(None, []) == "reported"
    for _ in range(3):
        assert hooks.after_controller_state_update(None, None) is None
    assert hooks.after_report(None, []) is None and hooks.calls == 1, "off for the rest of the run"
    out, err = capsys.readouterr()
    assert err == ("rayjobs: progress unavailable: after_controller_state_update failed (KeyError: "
                   "'training_failed_error'); the run goes on\n")
    (event,) = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()]
    assert event["event"] == "progress_unavailable" and "KeyError" in event["reason"]


class FullDisk:
    """A stream whose every write fails as on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_log_that_cannot_be_written_does_not_reach_the_run_either(monkeypatch):
    monkeypatch.setattr(sys, "stdout", FullDisk())
    monkeypatch.setattr(sys, "stderr", FullDisk())
    hooks = Hooks()
    assert hooks.after_controller_state_update(None, None) is None
    assert "KeyError" in hooks.unavailable


def test_the_callback_is_named_after_the_jobs_own_only_on_a_tested_ray():
    low, high = install.TESTED_RAY_RANGE
    tested = f"{high[0]}.{high[1]}.0"
    assert install.train_callbacks({}, tested) == (OURS, None)
    assert install.train_callbacks({"RAY_TRAIN_CALLBACKS": "mine.A, mine.B"}, tested) == (
        f"mine.A,mine.B,{OURS}", None)
    assert install.train_callbacks({"RAY_TRAIN_CALLBACKS": OURS}, tested) == (OURS, None)

    value, reason = install.train_callbacks({"RAY_TRAIN_CALLBACKS": "mine.A"}, f"{high[0]}.{high[1] + 1}.0")
    assert value is None and f"tested on Ray {install.tested_range_text()}" in reason
    assert install.train_callbacks({}, f"{low[0]}.{low[1] - 1}.3")[0] is None
    assert install.train_callbacks({}, None)[0] is None

    value, reason = install.train_callbacks({"RAY_TRAIN_V2_ENABLED": "0"}, tested)
    assert value is None and "unavailable under Ray Train V1" in reason


def test_the_keeper_gives_the_entrypoint_the_callback_only_when_the_record_asks_for_progress(monkeypatch):
    monkeypatch.setattr(install, "TESTED_RAY_RANGE", ((2, 60), (2, 60)))
    monkeypatch.setattr(supervisor, "ray_version", lambda: "2.60.0")
    env, note = supervisor.entrypoint_environment({"RAY_TRAIN_CALLBACKS": "mine.A", "PATH": "/bin"}, {"progress": True})
    assert env == {"RAY_TRAIN_CALLBACKS": f"mine.A,{OURS}", "PATH": "/bin"} and note is None
    env, note = supervisor.entrypoint_environment({"RAY_TRAIN_CALLBACKS": "mine.A"}, {"name": "no-progress"})
    assert env == {"RAY_TRAIN_CALLBACKS": "mine.A"} and note is None

    monkeypatch.setattr(supervisor, "ray_version", lambda: "3.1.0")
    env, note = supervisor.entrypoint_environment({}, {"progress": True})
    assert "RAY_TRAIN_CALLBACKS" not in env and "this cluster runs Ray 3.1.0" in note


def _submission(tmp_path: Path, extra: str) -> dict:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: guarded\nentrypoint: python train.py\n{extra}runtime_env:\n  working_dir: {code}\n"
                    "  env_vars:\n    RAY_TRAIN_CALLBACKS: mine.Callback\n")
    return build_submission(load_spec(spec))


def test_a_job_that_keeps_its_record_leaves_the_callback_to_the_keeper_and_one_that_does_not_names_it(tmp_path):
    recorded = _submission(tmp_path, "")
    env_vars = recorded["runtime_env"]["env_vars"]
    assert env_vars["RAY_TRAIN_CALLBACKS"] == "mine.Callback", "the job's own callbacks, as the spec set them"
    assert json.loads(env_vars[RECORD_ENV_VAR])["progress"] is True

    unrecorded = _submission(tmp_path, "record: false\n")["runtime_env"]["env_vars"]
    assert unrecorded["RAY_TRAIN_CALLBACKS"] == f"mine.Callback,{PROGRESS_CALLBACK}" and RECORD_ENV_VAR not in unrecorded

    quiet = _submission(tmp_path, "progress: false\n")["runtime_env"]["env_vars"]
    assert "progress" not in json.loads(quiet[RECORD_ENV_VAR]) and quiet["RAY_TRAIN_CALLBACKS"] == "mine.Callback"


BROKEN_RAY = """
import os
from ray.train.v2._internal.callbacks.env_callback import _initialize_env_callbacks
from ray.train.v2._internal.execution import callback as interfaces
del interfaces.ControllerCallback  # as in a Ray that renamed or moved it
os.environ["RAY_TRAIN_CALLBACKS"] = "rayjobs_agent.train_hooks.progress_callback.ProgressCallback"
(callback,) = _initialize_env_callbacks()  # what TorchTrainer does in the user's script
callback.after_report(None, [{"loss": 1.0}])  # no interface of Ray's: not called by Ray, and harmless if it were
print("built:", type(callback).__name__, "off:", bool(callback.unavailable))
"""


def test_a_callback_whose_ray_internals_cannot_be_imported_is_built_by_ray_and_does_nothing():
    env = {"PYTHONPATH": str(REPO_ROOT / "workloads"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(BROKEN_RAY)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built: ProgressCallback off: True" in done.stdout
    said = [line for line in done.stderr.splitlines() if line.startswith("rayjobs: ")]
    assert said == [line for line in said if "progress unavailable: Ray Train's callback interfaces could not be "
                    "imported" in line and line.endswith("; the run goes on")] and len(said) == 1, done.stderr
