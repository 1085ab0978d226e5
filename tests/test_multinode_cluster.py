"""Multi-node local clusters, live: `rayjobs cluster up --nodes N`, their status, jobs across nodes,
a lost node, and `cluster down`.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.waiting import wait_for_condition
from runner.errors import ExitCode
from runner.local import LocalCluster, cluster_processes
from runner.local.processes import psutil_module
from tests.support.cli import cli_env, read_metrics_csv, run_rayjobs
from tests.support.node_faults import (cluster_of, cluster_status, job_ended, lose_a_training_workers_node,
                                       started_cluster, submitted_job_id)
from tests.support.train_faults import HOLD_AT_EPOCH_ENV_VAR, HOLD_MARKER, SETUP_HOOK

CLUSTER_NAME = "multi"
NODES = 3
# The node-death run: epoch 1 checkpointed, the node lost at the start of epoch 2, epoch 2 trained by the retry.
EPOCHS = 2
IMAGES_PER_CLASS = 8

SPREAD_DRIVER = '''\
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
group = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=120)


@ray.remote(num_cpus=1)
def node_id():
    return ray.get_runtime_context().get_node_id()


ids = ray.get([
    node_id.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
    for i in range(3)
])
print("distinct nodes:", len(set(ids)))
'''


def _processes_with_token_file(token_file: Path) -> list:
    """Live processes whose environment names ``token_file``: every process of a cluster inherits it."""
    psutil = psutil_module()
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("RAY_AUTH_TOKEN_PATH") == str(token_file):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_a_worker_node_that_fails_to_start_stops_the_whole_cluster(tmp_path):
    # A `ray` whose interpreter starts the head as usual but refuses to run a worker node.
    real_ray = Path(sys.executable).parent / "ray"
    fake_python = tmp_path / "python3"
    fake_python.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "no worker today" >&2; exit 3; fi\n'
                           f'exec {sys.executable} "$@"\n')
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f"#!{fake_python}\n" + real_ray.read_text().split("\n", 1)[1])
    for script in (fake_python, fake_ray):
        script.chmod(0o755)
    home = tmp_path / "home"
    result = run_rayjobs("cluster", "up", "--name", "broken", "--nodes", "2", "--num-cpus", "1", home=home,
                         timeout=300, env=cli_env(home, RAYJOBS_RAY_EXECUTABLE=str(fake_ray)))
    assert result.returncode == ExitCode.CLUSTER_UNREACHABLE, result.stderr
    assert "Worker node 'worker-1'" in result.stderr and "exited with code 3" in result.stderr
    assert "no worker today" in result.stderr
    directory = home / "clusters" / "broken"
    assert not (directory / "cluster.json").exists()
    assert _processes_with_token_file(directory / "auth_token") == []


# ----------------------------------------------------------------- one 3-node cluster for the module


@pytest.fixture(scope="module")
def multi_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """RAYJOBS_HOME of a 3-node, 1-CPU-per-node cluster started through the CLI; stopped afterwards."""
    with started_cluster(tmp_path_factory.mktemp("multinode-home"), CLUSTER_NAME, NODES) as home:
        yield home


@pytest.fixture
def multi_cluster(multi_home: Path) -> LocalCluster:
    return cluster_of(multi_home, CLUSTER_NAME)


def _status(home: Path) -> dict:
    return cluster_status(home, CLUSTER_NAME)


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_status_lists_every_node_alive_with_one_cpu(multi_home, multi_cluster):
    status = _status(multi_home)
    assert status["node_count"] == NODES and status["nodes_error"] is None
    nodes = status["nodes"]
    assert [node["role"] for node in nodes] == ["head", "worker-1", "worker-2"]
    assert all(node["alive"] and node["cpus"] == 1 for node in nodes)
    assert len({node["node_id"] for node in nodes}) == NODES
    assert [worker.name for worker in multi_cluster.worker_nodes] == ["worker-1", "worker-2"]

    text = run_rayjobs("cluster", "status", "--name", CLUSTER_NAME, home=multi_home, timeout=60)
    assert text.returncode == 0, text.stderr
    assert f"nodes:     {NODES} ({NODES} alive)" in text.stdout
    for node in nodes:
        assert node["node_id"] in text.stdout


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_every_node_listens_on_loopback_only(multi_cluster):
    psutil = psutil_module()
    addresses = set()
    for proc in cluster_processes(multi_cluster):
        try:
            connections = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        addresses |= {conn.laddr.ip for conn in connections if conn.status == psutil.CONN_LISTEN}
    assert addresses
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        assert ip.is_loopback, f"a node listens on {address}"


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_job_runs_tasks_on_three_distinct_nodes(multi_home, tmp_path):
    (tmp_path / "spread.py").write_text(SPREAD_DRIVER)
    spec = tmp_path / "spread.yaml"
    spec.write_text("name: spread\nentrypoint: python spread.py\nrecord: false\nruntime_env:\n  working_dir: .\n")
    result = run_rayjobs("submit", str(spec), "--cluster", CLUSTER_NAME, home=multi_home, timeout=300)
    assert result.returncode == ExitCode.SUCCEEDED, result.stdout + result.stderr
    assert "SUCCEEDED" in result.stderr
    assert f"distinct nodes: {NODES}" in result.stdout


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_submit_notes_local_storage_on_several_nodes(multi_home, tmp_path):
    spec = tmp_path / "note.yaml"
    spec.write_text(
        "name: note\nentrypoint: echo stored\nrecord: false\nruntime_env:\n  working_dir: .\n"
        "workload:\n  kind: vision\n  storage_path: ./results\n  data:\n    source: synthetic\n    output_dir: ./shards\n")
    result = run_rayjobs("submit", str(spec), "--cluster", CLUSTER_NAME, "--no-wait", home=multi_home, timeout=120)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("rayjobs: note: ")]
    assert len(notes) == 1, result.stderr
    assert "workload.storage_path" in notes[0] and "workload.data.output_dir" in notes[0]
    assert "shared mount or object storage" in notes[0]


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_a_sweep_whose_trial_the_nodes_hold_in_all_but_not_worker_by_worker_is_refused_before_submission(
        multi_home, tmp_path):
    """Four workers of 0.6 CPU: the three nodes have 3 CPUs in all, but each holds one such worker."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(Path("specs/quickstart.yaml").read_text().replace("working_dir: ..", f"working_dir: {Path.cwd()}")
                    + "sweep:\n  metric: val_accuracy\n  mode: max\n  parameters:\n"
                    "    workload.train.lr: {choice: [0.002, 0.0005]}\n")
    listed = run_rayjobs("list", "--cluster", CLUSTER_NAME, "--output", "json", home=multi_home, timeout=60)
    result = run_rayjobs("submit", str(spec), "--cluster", CLUSTER_NAME, "--set", "workload.train.num_workers=4",
                         "--set", "workload.train.cpus_per_worker=0.6", home=multi_home, timeout=120)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert ("a trial's 4 workers ask for CPU 0.6 each, and a worker runs whole on one node: the cluster's 3 node(s) "
            "(CPU 1; CPU 1; CPU 1) hold 3 such workers at once") in result.stderr
    assert "submitted" not in result.stderr
    after = run_rayjobs("list", "--cluster", CLUSTER_NAME, "--output", "json", home=multi_home, timeout=60)
    # The jobs an earlier test left may still end meanwhile: the ids tell whether anything was submitted.
    assert ({job["submission_id"] for job in json.loads(after.stdout)}
            == {job["submission_id"] for job in json.loads(listed.stdout)}), "nothing was submitted"


# ----------------------------------------------------------------- node death, then the end of the cluster


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_a_lost_worker_node_fails_the_attempt_which_the_agent_retries_in_place_with_nobody_following(
        multi_home, multi_cluster, tmp_path):
    # Preprocessing spreads its tasks over the 1-CPU nodes. Two 1-CPU training workers: at least one of them
    # is on a worker node, whose raylet is SIGKILLed once epoch 1 is checkpointed and rank 0 holds at the start
    # of epoch 2 (tests/support/train_faults.py), so the node is lost mid-run however fast the epochs are. With
    # max_failures 0 Ray Train does not restart by itself: the attempt fails, and the agent beside the job reads
    # the lost node in its log and runs the entrypoint again in the same Ray job, which resumes on the two nodes
    # left (they still fit both workers). The job is submitted with --no-wait: no client follows it.
    # The model is a one-layer VisionTransformer: what is tested is the attempts, not what the model learns.
    run_dir = tmp_path / "results" / "node-death"
    overrides = [f"workload.data.output_dir={tmp_path / 'data'}", f"workload.storage_path={tmp_path / 'results'}",
                 f"workload.data.synthetic_per_class={IMAGES_PER_CLASS}", "workload.data.image_size=16",
                 f"workload.train.epochs={EPOCHS}", "workload.train.batch_size=64", "workload.train.max_failures=0",
                 # Two workers, not the spec's auto (one per node): the nodes left after the loss still fit them.
                 "workload.train.num_workers=2", "workload.train.cpus_per_worker=1",
                 "workload.train.model=vit", "workload.train.vit.num_layers=1", "workload.train.vit.num_heads=2",
                 "workload.train.vit.hidden_dim=32", "workload.train.vit.mlp_dim=64",
                 "workload.run_name=node-death", "workload.stages=[preprocess, train]",
                 f"runtime_env.worker_process_setup_hook={SETUP_HOOK}",
                 f"runtime_env.env_vars.{HOLD_AT_EPOCH_ENV_VAR}=1",
                 "retry_on=[node_lost]", "max_retries=1", "retry_backoff.initial_s=0"]
    submitted = run_rayjobs("submit", "specs/quickstart.yaml", "--cluster", CLUSTER_NAME, "--no-wait",
                            *[arg for override in overrides for arg in ("--set", override)], home=multi_home,
                            timeout=300)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted_job_id(submitted.stderr)
    wait_for_condition((run_dir / HOLD_MARKER).exists, timeout_s=300, interval_s=0.5)
    victim = lose_a_training_workers_node(multi_home, CLUSTER_NAME)
    epochs_before = [int(row["epoch"]) for row in read_metrics_csv(run_dir)]
    assert epochs_before[-1] < EPOCHS, "training ended before the node died"

    final = wait_for_condition(lambda: job_ended(multi_home, CLUSTER_NAME, job_id), timeout_s=480, interval_s=2)
    log = run_rayjobs("logs", job_id, "--cluster", CLUSTER_NAME, home=multi_home, timeout=60).stdout
    assert final["status"] == "SUCCEEDED", log[-4000:]
    # How many nodes encoded is not pinned: a few small images take one worker moments, often less than a
    # worker on another node needs to start, and that node's lease then finds no chunk left (tasks on three
    # nodes at once are test_job_runs_tasks_on_three_distinct_nodes, above).
    images = IMAGES_PER_CLASS * 10
    assert re.search(rf"preprocess: wrote .* {images} images \(.* images/s, on [123] nodes?\)", log), log[:3000]
    # The first attempt failed of the lost node, the agent named it and ran the entrypoint again in the same
    # job, and the second attempt went on from the latest checkpoint: every epoch trained once.
    assert "rayjobs: attempt 1 failed with node_lost (in retry_on); running attempt 2 of 2" in log, log[-4000:]
    assert re.search(r"Resuming run 'node-death' after epoch 1 from ", log), log[-3000:]
    assert [int(row["epoch"]) for row in read_metrics_csv(run_dir)] == list(range(1, EPOCHS + 1))
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert [(attempt["attempt"], attempt["status"], attempt["submission_id"]) for attempt in attempts] == \
        [(1, "FAILED", job_id), (2, "SUCCEEDED", job_id)]
    assert attempts[0]["cause"]["cause"] == "node_lost" and attempts[1]["cause"] is None

    def victim_dead() -> dict | None:
        nodes = {node["role"]: node for node in _status(multi_home)["nodes"]}
        return nodes if nodes[victim.name]["state"] == "DEAD" else None

    nodes = wait_for_condition(victim_dead, timeout_s=60, interval_s=2)
    assert sum(node["alive"] for node in nodes.values()) == NODES - 1
    text = run_rayjobs("cluster", "status", "--name", CLUSTER_NAME, home=multi_home, timeout=60)
    assert f"nodes:     {NODES} ({NODES - 1} alive)" in text.stdout


@pytest.mark.cluster  # its own cluster, started through the CLI
def test_cluster_down_stops_every_process_of_every_node(multi_home, multi_cluster):
    psutil = psutil_module()
    members = cluster_processes(multi_cluster)
    # The head's `ray start` leader is a member (a worker node's may have exited with its raylet
    # in the test before).
    assert multi_cluster.pid in {p.pid for p in members}
    assert _processes_with_token_file(Path(multi_cluster.token_file))
    down = run_rayjobs("cluster", "down", "--name", CLUSTER_NAME, home=multi_home, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stderr
    assert cluster_processes(multi_cluster) == []
    assert _processes_with_token_file(Path(multi_cluster.token_file)) == []
    for proc in members:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, proc
    assert not Path(multi_cluster.temp_dir).exists()
    gone = run_rayjobs("cluster", "status", "--name", CLUSTER_NAME, home=multi_home, timeout=60)
    assert gone.returncode == ExitCode.CLUSTER_UNREACHABLE
