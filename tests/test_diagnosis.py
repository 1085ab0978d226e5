"""Naming why a job failed from its log: each cause from the lines Ray, PyTorch or Python print for it.

The lines below were copied from real logs (Ray 2.60, torch 2.14); the causes that a test on this
machine can bring about for real are also reproduced on a cluster (tests/test_failure_causes_cluster.py).
"""

from __future__ import annotations

import pytest

from runner.follow.diagnosis import FailureReader
from runner.follow.progress import RunProgress

RECORDED = {
    "host_out_of_memory": "(raylet) ray.exceptions.OutOfMemoryError: Task was killed due to the node running low "
                          "on memory. Memory on the node (IP: 10.0.0.5, ID: 3f2a) where the task (actor ID: 9c1, "
                          "name=RayTrainWorker.__init__, pid=4242) was running was 30.12GB / 31.00GB (0.971602)",
    "cuda_out_of_memory": "(RayTrainWorker pid=811) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                          "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.31 GiB is free.",
    "module_missing": "ModuleNotFoundError: No module named 'timm'",
    "disk_full": "(RayTrainWorker pid=12) OSError: [Errno 28] No space left on device: '/tmp/rayjobs-ckpt-1/state.pt'",
    "storage_credentials": "OSError: When initiating multiple part upload for key 'runs/x/state.pt' in bucket 'b': "
                           "AWS Error ACCESS_DENIED during CreateMultipartUpload operation: The AWS Access Key Id "
                           "you provided does not exist in our records. (InvalidAccessKeyId)",
    "placement_infeasible": "ray.train.ControllerError: Insufficient cluster resources to launch training workers. "
                            "The worker group requires {'CPU': 8} but the cluster only has {'CPU': 2}.",
    "collective_timeout": "(RayTrainWorker pid=77) RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                          "unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to complete",
}


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
    progress = RunProgress()
    for event in ({"event": "attempt", "attempt": 1}, {"event": "restart", "attempt": 1, "reason": "ValueError: x"},
                  {"event": "attempt", "attempt": 2},
                  {"event": "train_end", "state": "ERRORED", "reason": "ValueError: x"}):
        progress.update(event)
    reader = FailureReader()
    reader.line("(TrainController pid=1)   Error count: 2 (max allowed: 1)")
    diagnosis = reader.diagnose(progress)
    assert diagnosis.cause == "max_failures_used_up"
    assert diagnosis.text.startswith("Training failed 2 times and used up its max_failures (1)")
    assert diagnosis.evidence == "(TrainController pid=1)   Error count: 2 (max allowed: 1)"


def test_an_ordinary_failure_has_no_diagnosis():
    reader = FailureReader()
    for line in ("Traceback (most recent call last):", "ValueError: the job's own bug"):
        reader.line(line)
    assert reader.diagnose(RunProgress()) is None
