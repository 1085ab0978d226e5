"""``tracking: mlflow:`` for a user's own Ray Train script, through the callback shipped with its code
(rayjobs_agent/train_hooks/tracking_callback.py): the specs refused because nothing would record them, what is
shipped, and a callback that never raises. On the session cluster (test_tracking_script_cluster.py), a plain
script's reports reach MLflow.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from rayjobs_agent.wire import TRACKING_ENV_VAR
from jobs.loader import load_spec
from jobs.submission import TRACKING_CALLBACK, TRAIN_CALLBACKS_ENV_VAR, build_submission
from runner.errors import ExitCode
from tests.support.cli import cli_env, run_rayjobs
from tests.support.mlflow_server import free_port
from tests.test_rerun import vision_spec

TRACKING = "tracking:\n  mlflow:\n    tracking_uri: {uri}\n    experiment: {experiment}\n"


def test_tracking_is_refused_where_nothing_would_record_it_and_shipped_where_something_does(tmp_path):
    pytest.importorskip("mlflow", reason="the tracking block needs MLflow's client where the spec is checked")
    tracking = TRACKING.format(uri="http://127.0.0.1:5000", experiment="e")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: script\nentrypoint: python train.py\n" + tracking)
    refused = run_rayjobs("validate", str(spec), env=cli_env(tmp_path / "home"))
    assert refused.returncode == ExitCode.BAD_INPUT
    assert "tracking needs code uploaded with the job" in refused.stderr

    (tmp_path / "code").mkdir()
    spec.write_text("name: script\nentrypoint: python train.py\nruntime_env:\n  working_dir: code\n  env_vars:\n"
                    "    RAY_TRAIN_V2_ENABLED: '0'\n" + tracking)
    v1 = run_rayjobs("validate", str(spec), env=cli_env(tmp_path / "home"))
    assert v1.returncode == ExitCode.BAD_INPUT and "turn v2 off" in v1.stderr

    spec.write_text("name: script\nentrypoint: python train.py\nprogress: false\nruntime_env:\n  working_dir: code\n"
                    + tracking)
    env_vars = build_submission(load_spec(spec))["runtime_env"]["env_vars"]
    assert env_vars[TRAIN_CALLBACKS_ENV_VAR] == TRACKING_CALLBACK
    assert json.loads(env_vars[TRACKING_ENV_VAR])["mlflow"]["experiment"] == "e"

    # A workload records its own runs: the callback would record each twice.
    spec.write_text(vision_spec(tmp_path).replace("name: tiny", "name: vision") + tracking)
    env_vars = build_submission(load_spec(spec))["runtime_env"]["env_vars"]
    assert TRACKING_CALLBACK not in env_vars.get(TRAIN_CALLBACKS_ENV_VAR, "") and TRACKING_ENV_VAR in env_vars


@pytest.mark.parametrize("mlflow_installed", [True, False])
def test_the_callback_says_once_why_nothing_is_recorded_and_never_raises(mlflow_installed, monkeypatch, capsys):
    from rayjobs_agent.train_hooks.tracking_callback import TrackingCallback

    if not mlflow_installed:
        monkeypatch.setitem(sys.modules, "mlflow", None)
        monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    down = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(TRACKING_ENV_VAR, json.dumps({"mlflow": {"tracking_uri": down, "experiment": "x"}}))
    callback = TrackingCallback()
    context = SimpleNamespace(run_config=SimpleNamespace(name="plain", storage_path="/tmp/runs"),
                              train_loop_config={"epochs": 2})
    callback.after_controller_start(context)
    for epoch in (1, 2):
        callback.after_report(SimpleNamespace(checkpoint=None), [{"epoch": epoch, "loss": 0.5}])
    callback.after_controller_state_update(None, type("FinishedState", (), {})())
    callback.after_report(None, None)  # what no Ray sends: still no exception
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayjobs:")]
    expected = f"MLflow at {down} could not start the run" if mlflow_installed else "MLflow's client is not installed"
    assert len(said) == 1 and expected in said[0], said


