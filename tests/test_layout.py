"""The ``auto`` layout of Ray Train workers: resolved from the cluster's nodes, explicit values kept."""

from __future__ import annotations

import pytest

from workloads.ray_train.config import NodeCapacity, RayTrainSettings


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
    resolved, line = settings(num_workers=2).resolved_for([NodeCapacity("head", 16.0)])
    # The two share the node: a node's every CPU each would ask for two nodes' worth.
    assert (resolved.num_workers, resolved.cpus_per_worker) == (2, 8.0)
    assert "the spec's 2 workers share the 16 CPU(s) free on 1 node(s)" in line
    assert resolved.scaling_config().placement_strategy == "PACK"


@pytest.mark.parametrize("num_workers, nodes, cpus", [
    (2, [NodeCapacity("head", 2.0)], 1.0),  # was 2 × 2 CPUs on 2 CPUs: a sweep's "no trial fits", a run that waits
    (3, [NodeCapacity("a", 3.0), NodeCapacity("b", 3.0)], 1.0),  # 2 CPUs each would place two of the three
    (2, [NodeCapacity("a", 8.0, held_cpus=1.0), NodeCapacity("b", 2.0)], 3.0),  # both on a, 3 of its 7 free each
    (8, [NodeCapacity("head", 2.0)], 1.0),  # more than fit: the least, and the run waits (the pre-flight refuses it)
])
def test_a_number_of_workers_the_spec_sets_shares_the_free_cpus_as_many_each_as_still_place_them_all(
        num_workers, nodes, cpus):
    resolved, _ = settings(num_workers=num_workers).resolved_for(nodes)
    assert (resolved.num_workers, resolved.cpus_per_worker) == (num_workers, cpus)


def test_the_auto_cpu_count_is_the_most_that_places_every_worker_and_never_below_one():
    import itertools

    from jobs.worker_layout import AUTO_LEAST_CPUS, auto_cpus_per_worker, workers_that_fit

    for count in range(1, 4):
        for free in itertools.product(range(0, 7), repeat=count):
            nodes = [{"CPU": float(amount)} for amount in free]
            for workers in range(1, 10):
                cpus = auto_cpus_per_worker(workers, free)
                assert cpus >= AUTO_LEAST_CPUS
                if workers_that_fit({"CPU": 1.0}, nodes) >= workers:
                    assert workers_that_fit({"CPU": float(cpus)}, nodes) >= workers, (free, workers, cpus)
                assert workers_that_fit({"CPU": float(cpus + 1)}, nodes) < workers, (free, workers, cpus)


def test_an_unresolved_layout_never_reaches_ray_train():
    with pytest.raises(ValueError, match="resolve the auto layout"):
        settings().scaling_config()


@pytest.mark.parametrize("value", ["many", 0, -1])
def test_a_layout_is_auto_or_a_positive_number(value):
    with pytest.raises(Exception):
        settings(num_workers=value)


# ----------------------------------------------------------------- a node lost mid-run


def test_an_auto_number_of_workers_is_a_most_that_a_restart_may_go_below():
    resolved, line = settings().resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert (resolved.num_workers, resolved.fewest_workers, resolved.is_elastic) == (3, 1, True)
    assert line.endswith("; fewer (down to 1) if a node is lost")
    scaling = resolved.scaling_config()
    assert (scaling.num_workers, scaling.elasticity_enabled) == ((1, 3), True)
    # Never resized while it trains: a resize throws the epoch in progress away.
    assert scaling.elastic_resize_monitor_interval_s >= 365 * 24 * 3600


def test_the_range_survives_a_dump_as_a_sweeps_trial_rebuilds_its_settings():
    resolved, _ = settings().resolved_for([NodeCapacity(f"n{i}", 2.0) for i in range(2)])
    rebuilt = RayTrainSettings.model_validate(resolved.model_dump(mode="json"))
    assert rebuilt.scaling_config().num_workers == (1, 2)


def test_one_worker_and_every_explicit_number_stay_fixed():
    one, line = settings().resolved_for([NodeCapacity("head", 4.0)])
    assert not one.is_elastic and one.scaling_config().num_workers == 1 and "lost" not in line
    explicit, _ = settings(num_workers=3, cpus_per_worker=1).resolved_for([NodeCapacity("head", 16.0)])
    assert (explicit.fewest_workers, explicit.is_elastic, explicit.scaling_config().num_workers) == (3, False, 3)
    # Only the CPUs auto: the number the spec sets is kept fixed.
    half_auto, _ = settings(num_workers=3).resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert half_auto.scaling_config().num_workers == 3


def test_an_explicit_minimum_makes_an_explicit_layout_elastic():
    ranged = settings(num_workers=4, min_workers=2, cpus_per_worker=1)
    assert ranged.scaling_config().num_workers == (2, 4)
    assert settings(num_workers=4, min_workers=4).is_elastic is False


@pytest.mark.parametrize("values, words", [({"min_workers": 2}, "needs num_workers as a number"),
                                           ({"num_workers": 2, "min_workers": 3}, "is more than num_workers")])
def test_a_minimum_needs_a_number_of_workers_at_least_as_large(values, words):
    with pytest.raises(Exception, match=words):
        settings(**values)


def test_admission_still_counts_an_auto_layout_as_one_worker_of_one_cpu():
    resolved, _ = settings().resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert (settings().demand("training", "train").count, resolved.demand("training", "train").count) == (1, 3)


def test_fewer_workers_than_planned_keep_the_global_batch_and_say_so():
    resolved, _ = settings().resolved_for([NodeCapacity(f"n{i}", 1.0) for i in range(3)])
    assert resolved.world_size_line(3, 64) is None
    assert resolved.world_size_line(2, 64) == (
        "Training on 2 of the 3 workers planned, as many as the nodes up hold: the global batch stays 64 images "
        "(32 per worker), and so do the learning rate and its schedule")
    assert settings().world_size_line(1, 64) is None  # the loop run outside a resolved layout


def test_an_auto_layout_keeps_within_what_its_queue_let_its_workers_take():
    from workloads.ray_train.config import NodeCapacity, WorkerScaling, within_grant

    nodes = [NodeCapacity("here", 4.0), NodeCapacity("there", 4.0)]
    assert [node.free_cpus for node in within_grant(nodes, None)] == [4, 4]
    assert [node.free_cpus for node in within_grant(nodes, 5.0)] == [4, 1]
    assert [node.free_cpus for node in within_grant(nodes, 2.0)] == [2, 0]
    resolved, line = WorkerScaling().resolved_for(within_grant(nodes, 2.0))
    assert (resolved.num_workers, resolved.cpus_per_worker) == (1, 2), line
