"""A node lost mid-training, live, on a local cluster of three one-CPU nodes (the quickstart, tiny).

With the default layout (``num_workers: auto``, one worker per node) training goes on with the nodes left:
Ray Train's restart takes the workers they hold and resumes from the latest checkpoint, and the log says the
world size changed. With a fixed layout the nodes left cannot hold, no restart can ever be placed: the attempt
ends, with its cause named, after a bounded number of tries, instead of waiting for ever.

In both, rank 0 holds at the start of epoch 2 once epoch 1 is checkpointed (tests/support/train_faults.py),
and the raylet of a worker node that runs a training worker is SIGKILLed then, so the node is lost mid-run
however fast the epochs are. The jobs are submitted with --no-wait: nobody follows them. The model is a
one-layer VisionTransformer on 16-pixel images: what is tested is the restarts, not what the model learns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import pytest

from rayjobs_agent.vocabulary import EventKind, decode, kind_of
from tests.support.cli import read_metrics_csv, run_rayjobs
from tests.support.node_faults import (alive_nodes, job_ended, lose_a_training_workers_node, started_cluster,
                                       submitted_job_id)
from tests.support.train_faults import HOLD_AT_EPOCH_ENV_VAR, HOLD_MARKER, SETUP_HOOK
from tests.support.waiting import wait_for_condition

CLUSTER_NAME = "nodeloss"
NODES = 3
EPOCHS = 2
IMAGES_PER_CLASS = 8
# Ray Train's wait for each try at placing a worker group (60 s by default), short here so that a restart that
# cannot be placed uses up its tries in a minute or two. Each try is still long enough to place workers that fit.
START_TIMEOUT_S = 10
# Hang guards, within pytest's own timeout of a test: the first epoch checkpointed (preprocessing and a first
# epoch on a loaded 2-core machine), and the job's end after the node is lost (the cluster's view dropping the
# node, the restarts, the second epoch; or every try at placing the workers).
HOLD_GUARD_S = 240
END_GUARD_S = 330


@pytest.fixture(scope="module")
def nodeloss_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RAYJOBS_HOME of a cluster of three one-CPU nodes, for this module; stopped afterwards."""
    with started_cluster(tmp_path_factory.mktemp("nodeloss-home"), CLUSTER_NAME, NODES) as home:
        yield home


def _train_until_a_node_is_lost(home: Path, tmp_path: Path, run_name: str, *overrides: str) -> tuple[str, Path]:
    """Submit the tiny quickstart as run ``run_name``, lose a training worker's node once epoch 1 is checkpointed,
    and return the job's id and the run's folder."""
    run_dir = tmp_path / "results" / run_name
    settings = [f"workload.data.output_dir={tmp_path / 'data'}", f"workload.storage_path={tmp_path / 'results'}",
                f"workload.data.synthetic_per_class={IMAGES_PER_CLASS}", "workload.data.image_size=16",
                f"workload.train.epochs={EPOCHS}", "workload.train.batch_size=64",
                "workload.train.model=vit", "workload.train.vit.num_layers=1", "workload.train.vit.num_heads=2",
                "workload.train.vit.hidden_dim=32", "workload.train.vit.mlp_dim=64",
                f"workload.run_name={run_name}", "workload.stages=[preprocess, train]",
                f"runtime_env.worker_process_setup_hook={SETUP_HOOK}",
                f"runtime_env.env_vars.{HOLD_AT_EPOCH_ENV_VAR}=1",
                f"runtime_env.env_vars.RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S={START_TIMEOUT_S}", *overrides]
    submitted = run_rayjobs("submit", "specs/quickstart.yaml", "--cluster", CLUSTER_NAME, "--no-wait",
                            *[arg for setting in settings for arg in ("--set", setting)], home=home, timeout=300)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted_job_id(submitted.stderr)

    def held() -> str | dict | None:
        return "held" if (run_dir / HOLD_MARKER).exists() else job_ended(home, CLUSTER_NAME, job_id)

    where = wait_for_condition(held, timeout_s=HOLD_GUARD_S, interval_s=2)
    assert where == "held", run_rayjobs("logs", job_id, "--cluster", CLUSTER_NAME, home=home, timeout=60).stdout[-4000:]
    lose_a_training_workers_node(home, CLUSTER_NAME)
    assert [int(row["epoch"]) for row in read_metrics_csv(run_dir)] == [1], "training moved past epoch 1"
    return job_id, run_dir


def _ended(home: Path, job_id: str) -> tuple[dict, str]:
    final = wait_for_condition(lambda: job_ended(home, CLUSTER_NAME, job_id), timeout_s=END_GUARD_S, interval_s=2)
    log = run_rayjobs("logs", job_id, "--cluster", CLUSTER_NAME, home=home, timeout=60).stdout
    return final, log


def _events(log: str, kind: str) -> list[dict]:
    return [event for event in map(decode, log.splitlines()) if event is not None and kind_of(event) == kind]


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_an_auto_layout_trains_on_with_the_nodes_left_after_one_is_lost(nodeloss_home, tmp_path):
    nodes = alive_nodes(nodeloss_home, CLUSTER_NAME)
    assert nodes >= 2, "a node to lose and one to go on with"
    # max_failures 1: the one restart the lost node costs. No retry_on: the job itself must get past it.
    job_id, run_dir = _train_until_a_node_is_lost(nodeloss_home, tmp_path, "elastic", "workload.train.max_failures=1")
    final, log = _ended(nodeloss_home, job_id)
    assert final["status"] == "SUCCEEDED", log[-6000:]
    assert f"Layout: {nodes} worker(s) × 1 CPU, auto: one per node" in log, log[:4000]
    # One attempt of the entrypoint; within it Ray Train restarted on the nodes left, fewer workers than before.
    assert "running attempt 2" not in log
    attempts = _events(log, EventKind.ATTEMPT)
    assert len(attempts[0]["workers"]) == nodes and len(attempts[-1]["workers"]) == nodes - 1, attempts
    assert attempts[-1]["nodes"] == nodes - 1
    assert _events(log, EventKind.RESTART), "Ray Train never restarted"
    # The workers say the world size changed, and what that does to the batch: the global batch is kept.
    share = 64 // (nodes - 1)
    assert re.search(rf"Training on {nodes - 1} of the {nodes} workers planned\b.*global batch stays 64 images "
                     rf"\({share} per worker\)", log), log[-6000:]
    # Resumed from epoch 1's checkpoint with the smaller group: every epoch trained once, the last one complete.
    assert re.search(r"Resuming run 'elastic' after epoch 1 from ", log), log[-6000:]
    assert [int(row["epoch"]) for row in read_metrics_csv(run_dir)] == list(range(1, EPOCHS + 1))
    assert re.search(rf"Training workers: rank 0 on node \w+, .*\({nodes - 1} nodes?\)", log), log[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert [(attempt["status"], attempt["cause"]) for attempt in record["attempts"]] == [("SUCCEEDED", None)]


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_a_fixed_layout_the_nodes_left_cannot_hold_ends_with_its_cause(nodeloss_home, tmp_path):
    nodes = alive_nodes(nodeloss_home, CLUSTER_NAME)
    assert nodes >= 2, "a node to lose and one left"
    # One worker per node alive, fixed: once a node is lost, no restart can ever be placed.
    job_id, run_dir = _train_until_a_node_is_lost(
        nodeloss_home, tmp_path, "fixed", f"workload.train.num_workers={nodes}", "workload.train.cpus_per_worker=1",
        "workload.train.max_failures=1")
    final, log = _ended(nodeloss_home, job_id)
    assert final["status"] == "FAILED", log[-6000:]
    assert final["diagnosis"]["cause"] == "workers_not_placed", final["diagnosis"]
    assert re.search(rf"error: training run 'fixed' failed: .*{nodes} workers", log), log[-6000:]
    attempt, = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert attempt["status"] == "FAILED" and attempt["cause"]["cause"] == "workers_not_placed"
    # Epoch 1's checkpoint is kept for a later attempt (the agent's retry in place, or a run of the same name).
    assert [int(row["epoch"]) for row in read_metrics_csv(run_dir)] == [1]
