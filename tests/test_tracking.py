"""Recording runs in MLflow (workloads/ray_train/tracking.py) against a real tracking server on loopback.

What a training run sends is the sweep test's (tests/test_sweep.py, one MLflow run per trial with two
workers); here, what must hold whatever the server does: a server down at start is one line and the
job runs on, a server that goes out of reach mid-run (a proxy between the job and the server resets
every connection) loses nothing (metrics kept in the run folder and sent when it is back), and an
attempt that starts again continues its run. Plus the spec's side: the block's checks.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from jobs.errors import SpecError
from rayjobs_agent.wire import TRACKING_ENV_VAR
from jobs.loader import load_spec, validate_spec_data
from tests.support.cli import REPO_ROOT
from tests.support.fault_proxy import FaultProxy
from tests.support.mlflow_server import free_port

# Looked up, not imported: importing MLflow costs every test process seconds at collection, tests or not.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                reason="MLflow's client comes with the dev extra (rayjobs[mlflow])")

QUICKSTART = REPO_ROOT / "specs" / "quickstart.yaml"


def QUICKSTART_WITH_TRACKING(folder):  # noqa: N802 - a spec file, named as the constant above
    """The quickstart spec with a tracking block, written into ``folder``."""
    document = yaml.safe_load(QUICKSTART.read_text())
    document["tracking"] = {"mlflow": {"tracking_uri": "http://mlflow.internal:5000", "experiment": "food"}}
    path = folder / "tracked.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_server_down_at_start_is_one_line_and_the_run_goes_on_untracked(tmp_path, capsys):
    from workloads.ray_train.tracking import MlflowRun

    down = f"http://127.0.0.1:{free_port()}"
    assert MlflowRun.open(tmp_path / "run", "run", {"train": {"lr": 0.1}},
                          settings={"tracking_uri": down, "experiment": "down"}) is None
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"rayjobs: MLflow at {down} could not start the run (")


def test_a_server_out_of_reach_mid_run_loses_no_metric_and_an_attempt_continues_the_run(mlflow_tracking_server,
                                                                                        tmp_path, capsys):
    from workloads.ray_train.tracking import UNSENT_FILE, MlflowRun

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    experiment = f"tracking-{tmp_path.name}"
    with FaultProxy(mlflow_tracking_server.port) as proxy:
        through_proxy = {"tracking_uri": proxy.address, "experiment": experiment}
        run = MlflowRun.open(run_dir, "tracked", {"train": {"lr": 0.1, "epochs": 3}, "stages": ["train"]},
                             settings=through_proxy)
        assert run is not None
        reporter = run.reporter()  # as the Train controller holds it
        reporter.after_report(None, [{"epoch": 1, "val_loss": 0.9}, {"epoch": 1, "val_loss": 0.9}], None)

        proxy.outage(3600)
        reporter.after_report(None, [{"epoch": 2, "val_loss": 0.5}, {"epoch": 2, "val_loss": 0.5}], None)
        reporter.after_report(None, [{"epoch": 3, "val_loss": 0.3}, {"epoch": 3, "val_loss": 0.3}], None)
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayjobs: MLflow")]
        assert len(said) == 1 and "could not log metrics" in said[0] and str(run_dir / UNSENT_FILE) in said[0]
        kept = [json.loads(line) for line in (run_dir / UNSENT_FILE).read_text().splitlines()]
        assert [entry["step"] for entry in kept] == [2, 3]

        proxy.end_outage()
        # The driver ends the run; what the controller could not send goes first.
        MlflowRun(run.settings, run_dir, run.run_id).close("FINISHED")
    assert not (run_dir / UNSENT_FILE).exists()
    client = mlflow_tracking_server.client()
    history = client.get_metric_history(run.run_id, "val_loss")
    assert [(point.step, point.value) for point in history] == [(1, 0.9), (2, 0.5), (3, 0.3)]
    recorded = client.get_run(run.run_id)
    assert recorded.info.status == "FINISHED"
    assert recorded.data.params["train.lr"] == "0.1" and recorded.data.params["stages"] == '["train"]'
    assert recorded.data.tags["rayjobs.run_dir"] == str(run_dir)

    # A later attempt of the same run folder continues the same MLflow run.
    again = MlflowRun.open(run_dir, "tracked", {"train": {"lr": 0.1, "epochs": 4}},
                           settings={"tracking_uri": mlflow_tracking_server.uri, "experiment": experiment})
    assert again is not None and again.run_id == run.run_id
    assert client.get_run(run.run_id).data.params["train.epochs"] == "3", "a parameter keeps its first value"
    assert len(client.search_runs([client.get_experiment_by_name(experiment).experiment_id])) == 1


def test_the_tracking_block_is_checked_and_reaches_the_job(tmp_path):
    from jobs.submission import build_submission

    document = yaml.safe_load(QUICKSTART.read_text())
    document["tracking"] = {"mlflow": {"tracking_uri": "mlflow.internal:5000", "experiment": "food"}}
    with pytest.raises(SpecError, match="is not a tracking server's address: write http"):
        validate_spec_data(dict(document), QUICKSTART)
    with_credentials = ["https://me:pw-4f1c@mlflow.internal:5000", "https://tok-9a2e@mlflow.internal",
                        "https://me:pw 4f1c@mlflow.internal", "https://mlflow.internal/?token=tok-9a2e",
                        "https://me:pw?4f1c@mlflow.internal",
                        "ftp://me:pw-4f1c@mlflow.internal"]
    for address in with_credentials:
        document["tracking"]["mlflow"]["tracking_uri"] = address
        with pytest.raises(SpecError) as refused:
            validate_spec_data(dict(document), QUICKSTART)
        assert "4f1c" not in str(refused.value) and "9a2e" not in str(refused.value), refused.value
        assert "MLFLOW_TRACKING_USERNAME" in str(refused.value) or address.startswith("ftp"), refused.value
        # Given on the command line, the setting is named in the error without them too.
        with pytest.raises(SpecError) as refused:
            load_spec(QUICKSTART_WITH_TRACKING(tmp_path), [f"tracking.mlflow.tracking_uri={address}"])
        assert "4f1c" not in str(refused.value) and "9a2e" not in str(refused.value), refused.value
        assert "(from --set tracking.mlflow.tracking_uri=" in str(refused.value), refused.value
    # A value YAML refuses is not quoted back when its key looks secret.
    for refused_value in ("!Hunter2", "*hunter2"):
        with pytest.raises(SpecError) as refused:
            load_spec(QUICKSTART_WITH_TRACKING(tmp_path), [f"runtime_env.env_vars.DB_PASSWORD={refused_value}"])
        assert "unter2" not in str(refused.value) and "DB_PASSWORD=***" in str(refused.value), refused.value
    document["tracking"]["mlflow"]["tracking_uri"] = "http://mlflow.internal:5000/"
    loaded = validate_spec_data(document, QUICKSTART)
    submission = build_submission(loaded)
    sent = json.loads(submission["runtime_env"]["env_vars"][TRACKING_ENV_VAR])
    assert sent == {"mlflow": {"tracking_uri": "http://mlflow.internal:5000", "experiment": "food"}}

    # MLflow's own credential variables are masked like every secret.
    from jobs.secrets import masked

    submission["runtime_env"]["env_vars"]["MLFLOW_TRACKING_TOKEN"] = "s3cr3t"
    assert masked(submission)["runtime_env"]["env_vars"]["MLFLOW_TRACKING_TOKEN"] != "s3cr3t"


def test_a_report_mlflow_refuses_is_dropped_and_the_reports_after_it_are_sent(mlflow_tracking_server, tmp_path,
                                                                             capsys):
    from workloads.ray_train.tracking import MlflowRun

    run = MlflowRun.open(tmp_path / "run", "refused", {"train": {"lr": 0.1}},
                         settings={"tracking_uri": mlflow_tracking_server.uri, "experiment": f"refused-{tmp_path.name}"})
    assert run is not None
    reporter = run.reporter()
    reporter.after_report(None, [{"epoch": 1, "acc@1": 0.5}], None)  # a name MLflow does not take as it is
    reporter.after_report(None, [{"epoch": 2, "x" * 300: 1.0}], None)  # a name MLflow refuses for good (too long)
    reporter.after_report(None, [{"epoch": 3, "acc@1": 0.7}], None)
    client = mlflow_tracking_server.client()
    assert [(point.step, point.value) for point in client.get_metric_history(run.run_id, "acc_1")] == [(1, 0.5), (3, 0.7)]
    assert [point.step for point in client.get_metric_history(run.run_id, "epoch")] == [1, 3]
    said = [line for line in capsys.readouterr().err.splitlines() if "refused a report's metrics" in line]
    assert len(said) == 1 and "step 2" in said[0]
    assert run.pending == []


def test_a_jobs_secrets_reach_mlflow_masked_in_its_parameters(mlflow_tracking_server, tmp_path, monkeypatch):
    from workloads.ray_train.tracking import MlflowRun

    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop0123")
    run = MlflowRun.open(tmp_path / "run", "masked", {"train_loop_config": {"token": "hf_abcdefghijklmnop0123",
                                                                            "data": "s3://me:pw-sekrit99@store/x"}},
                         settings={"tracking_uri": mlflow_tracking_server.uri, "experiment": f"masked-{tmp_path.name}"})
    assert run is not None
    params = mlflow_tracking_server.client().get_run(run.run_id).data.params
    assert params["train_loop_config.token"] == "***"
    assert params["train_loop_config.data"] == "s3://me:***@store/x"
