"""Naming why a job failed from its log: each cause from the lines Ray, PyTorch or Python print for it.

The lines below were copied from real logs (Ray 2.60, torch 2.14). A full disk and refused object-store
credentials are also brought about here, in the test process, and their real errors read through the
follower's view; the causes that need a cluster are reproduced on one (tests/test_diagnosis_cluster.py).
"""

from __future__ import annotations

import pytest

from rayjobs_agent.causes import FailureReader

RECORDED = {
    "host_out_of_memory": "(raylet) ray.exceptions.OutOfMemoryError: Task was killed due to the node running low "
                          "on memory. Memory on the node (IP: 10.0.0.5, ID: 3f2a) where the task (actor ID: 9c1, "
                          "name=RayTrainWorker.__init__, pid=4242) was running was 30.12GB / 31.00GB (0.971602)",
    "cuda_out_of_memory": "(RayTrainWorker pid=811) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                          "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.31 GiB is free.",
    "module_missing": "ModuleNotFoundError: No module named 'timm'",
    "disk_full": "(RayTrainWorker pid=12) OSError: [Errno 28] No space left on device: '/tmp/rayjobs-ckpt-1/state.pt'",
    "storage_credentials": "OSError: When initiating multiple part upload for key 'runs/x/state.pt' in bucket 'b': "
                           "AWS Error INVALID_ACCESS_KEY_ID during CreateMultipartUpload operation: The AWS Access "
                           "Key Id you provided does not exist in our records. (Request ID: XZKY6NAnVpRJ4XhrzEB8)",
    "placement_infeasible": "ray.train.ControllerError: Insufficient cluster resources to launch training workers. "
                            "The worker group requires {'CPU': 8} but the cluster only has {'CPU': 2}.",
    "collective_timeout": "(RayTrainWorker pid=77) RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                          "unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to complete",
    # Ray 2.60, a TorchTrainer whose loop reports a checkpoint made in tempfile.TemporaryDirectory() after the
    # `with` block ended (the tutorial's pattern, run on a local cluster).
    "checkpoint_deleted_before_report": "(RayTrainWorker pid=4682) FileNotFoundError: [Errno 2] Failed to open local "
                                        "file '/tmp/tmp7l518t0q'. Detail: [errno 2] No such file or directory",
    # Ray 2.60, the quickstart with 3 fixed workers on a 3-node local cluster, a worker node's raylet SIGKILLed
    # mid-training and RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=10 (tests/test_node_lost_cluster.py).
    "workers_not_placed": "error: training run 'fixed' failed: WorkerGroupStartupTimeoutError: 3 workers could not "
                          "be placed in 10 tries of 10 s each: the nodes up cannot hold them",
}


def test_every_cause_of_the_table_has_a_line_from_a_real_log_here():
    from rayjobs_agent.causes import CAUSES

    assert sorted(cause.name for cause in CAUSES if cause.name not in RECORDED_ELSEWHERE) == sorted(RECORDED)


# Causes whose real lines are read from whole logs in tests/data/logs (tests/test_node_lost.py).
RECORDED_ELSEWHERE = {"node_lost"}


@pytest.mark.parametrize("cause", sorted(RECORDED))
def test_each_cause_is_named_from_its_recorded_line(cause):
    reader = FailureReader()
    for line in ("Running entrypoint for job raysubmit_x: python train.py", "epoch 1/4: loss 2.3", RECORDED[cause],
                 "Traceback (most recent call last):"):
        reader.line(line)
    diagnosis = reader.diagnose()
    assert diagnosis is not None and diagnosis.cause == cause
    assert diagnosis.advice and diagnosis.paragraph().endswith(diagnosis.advice)
    assert not diagnosis.evidence.startswith("(")  # Ray's forwarding prefix is not evidence


def test_the_missing_module_is_named():
    reader = FailureReader()
    reader.line(RECORDED["module_missing"])
    assert reader.diagnose().text == "A module is missing on the cluster: no module named 'timm'"


def test_memory_outranks_the_collective_errors_it_causes():
    reader = FailureReader()
    reader.line(RECORDED["collective_timeout"])
    reader.line(RECORDED["host_out_of_memory"])
    assert reader.diagnose().cause == "host_out_of_memory"


def test_a_run_that_used_up_max_failures_is_named_with_its_last_reason():
    reader = FailureReader()
    for event in ({"event": "attempt", "attempt": 1}, {"event": "restart", "attempt": 1, "reason": "ValueError: x"},
                  {"event": "attempt", "attempt": 2},
                  {"event": "train_end", "state": "ERRORED", "reason": "ValueError: x"}):
        reader.event(event)
    reader.line("(TrainController pid=1)   Error count: 2 (max allowed: 1)")
    diagnosis = reader.diagnose()
    assert diagnosis.cause == "max_failures_used_up"
    assert diagnosis.text.startswith("Training failed 2 times and used up its max_failures (1)")
    assert diagnosis.evidence == "(TrainController pid=1)   Error count: 2 (max allowed: 1)"


def test_an_ordinary_failure_has_no_diagnosis():
    reader = FailureReader()
    for line in ("Traceback (most recent call last):", "ValueError: the job's own bug"):
        reader.line(line)
    assert reader.diagnose() is None


def test_the_cause_nearest_the_failure_wins():
    """A handled ImportError early in the run and the autoscaler's complaint while it waited are not the end."""
    from runner.follow.log_view import read_log

    log = "\n".join([
        "Traceback (most recent call last):",
        "  File \"train.py\", line 3, in <module>",
        "ModuleNotFoundError: No module named 'wandb'",
        "wandb is not installed: metrics go to the console only",
        "\x1b[33m(autoscaler +3s)\x1b[0m Error: No available node types can fulfill resource request {'CPU': 3.0}. "
        "Add suitable node types to this cluster to resolve this issue.",
        RECORDED["disk_full"],
        "Traceback (most recent call last):",
    ]) + "\n"
    _, reader = read_log(log)
    assert reader.diagnose().cause == "disk_full"


def test_a_collective_timeout_after_a_worker_ran_out_of_memory_is_the_memory():
    reader = FailureReader()
    reader.line(RECORDED["host_out_of_memory"])
    reader.line(RECORDED["collective_timeout"])
    assert reader.diagnose().cause == "host_out_of_memory"
    only = FailureReader()
    only.line(RECORDED["collective_timeout"])
    assert only.diagnose().cause == "collective_timeout"


def test_a_cause_the_run_went_on_past_is_forgotten():
    from runner.follow.log_view import read_log

    log = "\n".join([RECORDED["module_missing"],
                     'rayjobs-event {"event":"report","iteration":1,"metrics":{"epoch":1}}',
                     "ValueError: the job's own bug"]) + "\n"
    _, reader = read_log(log)
    assert reader.diagnose() is None


def _log_of(error: BaseException, prefix: str = "(RayTrainWorker pid=12) ") -> str:
    """The traceback Python prints for ``error``, as a worker's lines forwarded into the driver log."""
    import traceback

    lines = "".join(traceback.format_exception(error)).splitlines()
    return "".join(f"{prefix}{line}\n" for line in lines)


def _raised(action) -> BaseException:
    try:
        action()
    except Exception as error:  # the real error is what the test wants
        return error
    raise AssertionError("the action did not fail")


@pytest.fixture
def refused_s3(aws_env, s3_endpoint, monkeypatch):
    """The test S3 server, with a bucket, checking keys from now on; the process holds keys it does not know."""
    import moto.settings

    from tests.support.s3_server import create_bucket

    create_bucket(s3_endpoint, "rayjobs-refused")
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIARAYJOBSUNKNOWN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    return s3_endpoint


def test_refused_object_storage_credentials_are_named_from_the_real_errors(refused_s3):
    """pyarrow (Ray Train's storage, Ray Data) and boto3 each refused by a real S3 server, in their own words."""
    import os

    import boto3
    import pyarrow.fs as pafs

    filesystem = pafs.S3FileSystem(endpoint_override=refused_s3, region="us-east-1",
                                   access_key=os.environ["AWS_ACCESS_KEY_ID"],
                                   secret_key=os.environ["AWS_SECRET_ACCESS_KEY"])

    def upload_with_pyarrow():
        with filesystem.open_output_stream("rayjobs-refused/runs/x/checkpoint_000001/state.pt") as stream:
            stream.write(b"weights")

    def upload_with_boto():
        boto3.client("s3", endpoint_url=refused_s3, region_name="us-east-1").put_object(
            Bucket="rayjobs-refused", Key="runs/x/metrics.csv", Body=b"epoch\n")

    for action in (upload_with_pyarrow, upload_with_boto):
        error = _raised(action)
        reader = FailureReader()
        for line in _log_of(error).splitlines():
            reader.line(line)
        diagnosis = reader.diagnose()
        assert diagnosis is not None and diagnosis.cause == "storage_credentials", (action.__name__, str(error))
        assert "AWS_SECRET_ACCESS_KEY" in diagnosis.advice and "wrong-secret" not in diagnosis.paragraph()


def _torch_save_large():
    import torch

    torch.save({"weights": torch.zeros(100_000)}, "/dev/full")


def _torch_save_small():
    import torch

    torch.save({"weights": torch.zeros(10)}, "/dev/full")


def _python_write():
    with open("/dev/full", "wb") as full:
        full.write(b"checkpoint")
        full.flush()


def _parquet_write():
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Into an open file: given a path, pyarrow removes what it failed to write, and /dev/full is no file to remove.
    with pa.OSFile("/dev/full", "wb") as sink:
        pq.write_table(pa.table({"label": list(range(100_000))}), sink)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("write", [_python_write, _parquet_write, _torch_save_large, _torch_save_small],
                         ids=["python", "pyarrow-parquet", "torch-save", "torch-save-small"])
def test_a_full_disk_is_named_from_the_real_errors(write):
    """A write to a full device (Linux's /dev/full answers every write with ENOSPC). torch.save never says
    the disk is full: its zip writer fails with words of its own, which are named as a full disk too."""
    from runner.follow.log_view import read_log

    error = _raised(write)
    _, reader = read_log(_log_of(error))
    diagnosis = reader.diagnose()
    assert diagnosis is not None and diagnosis.cause == "disk_full", str(error)
    assert "storage_path" in diagnosis.advice
