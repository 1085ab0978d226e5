"""The ``auto`` layout of Ray Train workers: resolved from the cluster's nodes, explicit values kept."""

from __future__ import annotations

import pytest

from workloads.training.config import NodeCapacity, RayTrainSettings


def settings(**values) -> RayTrainSettings:
    return RayTrainSettings.model_validate(values)


def test_auto_is_the_default_and_asks_admission_for_one_worker_of_one_cpu():
    default = settings()
    assert default.layout_is_auto
    demand = default.demand("training", "train")
    assert (demand.count, demand.cpus) == (1, 1.0)


def test_one_node_gets_one_worker_with_every_free_cpu():
    resolved, line = settings().resolved_for([NodeCapacity("head", 16.0)])
    assert (resolved.num_workers, resolved.cpus_per_worker) == (1, 16.0)
    assert "1 worker(s) × 16 CPU" in line and "auto" in line


def test_the_entrypoints_cpus_and_the_data_pipelines_are_left_free():
    nodes = [NodeCapacity("head", 8.0, held_cpus=1.0), NodeCapacity("worker", 8.0)]
    resolved, line = settings().resolved_for(nodes, reserve_cpus_per_node=1.0)
    # Every worker reserves the same: the fewest free CPUs among the nodes (8 - 1 held - 1 for data).
    assert (resolved.num_workers, resolved.cpus_per_worker) == (2, 6.0)
    assert "data pipeline" in line


def test_several_nodes_get_one_worker_each_kept_one_per_node():
    resolved, _ = settings().resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert (resolved.num_workers, resolved.cpus_per_worker) == (3, 1.0)
    assert resolved.scaling_config().placement_strategy == "SPREAD"


def test_the_spread_survives_a_dump_as_a_sweeps_trial_rebuilds_its_settings():
    resolved, _ = settings().resolved_for([NodeCapacity(f"n{i}", 2.0) for i in range(2)])
    rebuilt = RayTrainSettings.model_validate(resolved.model_dump(mode="json"))
    assert rebuilt.scaling_config().placement_strategy == "SPREAD"


def test_an_explicit_placement_is_kept_through_the_auto_layout():
    resolved, _ = settings(placement="pack").resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert resolved.num_workers == 3
    assert resolved.scaling_config().placement_strategy == "PACK"
    spread = settings(num_workers=2, cpus_per_worker=1, placement="spread")
    assert spread.scaling_config().placement_strategy == "SPREAD"


def test_a_node_with_no_cpu_free_takes_no_worker():
    nodes = [NodeCapacity("head", 2.0, held_cpus=2.0), NodeCapacity("worker", 4.0)]
    resolved, _ = settings().resolved_for(nodes)
    assert (resolved.num_workers, resolved.cpus_per_worker) == (1, 4.0)


def test_a_cluster_with_nothing_free_still_runs_one_worker_of_one_cpu():
    resolved, _ = settings().resolved_for([NodeCapacity("head", 1.0, held_cpus=1.0)])
    assert (resolved.num_workers, resolved.cpus_per_worker) == (1, 1.0)


def test_gpus_get_one_worker_each_sharing_their_nodes_cpus():
    nodes = [NodeCapacity("a", 16.0, gpus=4.0), NodeCapacity("b", 16.0, gpus=4.0), NodeCapacity("cpu-only", 64.0)]
    resolved, line = settings(use_gpu=True).resolved_for(nodes)
    assert (resolved.num_workers, resolved.cpus_per_worker) == (8, 4.0)
    assert "GPU" in line


def test_explicit_values_are_kept_and_only_the_auto_one_is_resolved():
    explicit = settings(num_workers=2, cpus_per_worker=1)
    resolved, line = explicit.resolved_for([NodeCapacity("head", 16.0)])
    assert resolved is explicit and "as the spec sets" in line
    resolved, _ = settings(num_workers=2).resolved_for([NodeCapacity("head", 16.0)])
    assert (resolved.num_workers, resolved.cpus_per_worker) == (2, 16.0)
    assert resolved.scaling_config().placement_strategy == "PACK"


def test_an_unresolved_layout_never_reaches_ray_train():
    with pytest.raises(ValueError, match="resolve the auto layout"):
        settings().scaling_config()


@pytest.mark.parametrize("value", ["many", 0, -1])
def test_a_layout_is_auto_or_a_positive_number(value):
    with pytest.raises(Exception):
        settings(num_workers=value)
