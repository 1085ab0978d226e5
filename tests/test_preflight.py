"""Pre-flight: an entrypoint that no node can host is refused before submission; one that does not run its
workload is warned about."""

from __future__ import annotations

import pytest

from jobs.loader import load_spec
from runner.run.preflight import check_entrypoint_fits, entrypoint_demand, entrypoint_note, unmet_on_every_node
from runner.errors import BadInput, ClusterUnreachable

NODES = [{"CPU": 2.0, "memory": 8 * 2**30}, {"CPU": 8.0, "GPU": 1.0, "memory": 32 * 2**30}]


def test_demand_uses_ray_resource_names_and_skips_zeros():
    submission = {"entrypoint_num_cpus": 1, "entrypoint_num_gpus": 0, "entrypoint_memory": 2**30,
                  "entrypoint_resources": {"TPU": 4}}
    assert entrypoint_demand(submission) == {"CPU": 1.0, "memory": float(2**30), "TPU": 4.0}


def test_one_node_must_offer_everything_at_once():
    assert unmet_on_every_node({"CPU": 4, "GPU": 1}, NODES) is None
    # 2 CPUs + a GPU exist, but not on one node together with 16 CPUs.
    assert unmet_on_every_node({"CPU": 16, "GPU": 1}, NODES) == {"CPU": 8.0, "GPU": 1.0}


class FakeApi:
    """Stands in for the dashboard at the one seam the check uses."""

    def __init__(self, nodes, autoscaling=False, fail=False):
        self.nodes, self.autoscaling, self.fail = nodes, autoscaling, fail

    def node_resources(self):
        if self.fail:
            raise ClusterUnreachable("down")
        return self.nodes

    def has_autoscaler(self):
        return self.autoscaling


def test_impossible_demand_is_bad_input_with_numbers():
    with pytest.raises(BadInput, match=r"asks for GPU 2, .*offers GPU 1"):
        check_entrypoint_fits(FakeApi(NODES), {"entrypoint_num_gpus": 2}, warn=print)


def test_autoscaling_cluster_only_warns():
    warnings = []
    check_entrypoint_fits(FakeApi(NODES, autoscaling=True), {"entrypoint_num_gpus": 2}, warn=warnings.append)
    assert warnings and "autoscales" in warnings[0]


def test_check_never_blocks_when_the_dashboard_cannot_answer():
    check_entrypoint_fits(FakeApi(NODES, fail=True), {"entrypoint_num_gpus": 2}, warn=print)


@pytest.mark.parametrize("entrypoint, warned", [
    ("python -m workloads.hello", False), ("bash -c 'python -m workloads.hello --params p.yaml'", False),
    ("python workloads/hello.py", False), ("python train.py", True),
])
def test_an_entrypoint_that_does_not_run_its_workload_is_warned_about(tmp_path, entrypoint, warned):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: hello\nentrypoint: {entrypoint}\nworkload:\n  kind: hello\n")
    note = entrypoint_note(load_spec(spec))
    assert (note is not None) is warned
    if warned:
        assert "python -m workloads.hello" in note and "the workload section is ignored" in note


def _quickstart_sweep(tmp_path, *overrides: str):
    import yaml

    from tests.support.cli import REPO_ROOT

    document = yaml.safe_load((REPO_ROOT / "specs" / "quickstart.yaml").read_text())
    document["runtime_env"]["working_dir"] = str(REPO_ROOT)
    document["sweep"] = {"metric": "val_accuracy", "mode": "max", "search": "grid",
                         "parameters": {"workload.train.lr": {"choice": [0.001, 0.01]},
                                        "workload.train.weight_decay": {"choice": [0.0, 0.05]}}}
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(document))
    return load_spec(spec, list(overrides))


def test_a_sweep_whose_trial_needs_more_cpus_than_the_cluster_has_is_refused_with_the_figures(tmp_path):
    from runner.run.preflight import check_sweep_fits

    loaded = _quickstart_sweep(tmp_path, "workload.train.num_workers=8")
    with pytest.raises(BadInput) as refused:
        check_sweep_fits(FakeApi([{"CPU": 2.0, "memory": 8 * 2**30}]), loaded, warn=print)
    assert ("one trial of the sweep needs 8 CPUs (8 workers × 1 CPU; the trial's Train controller reserves none), "
            "and the cluster has 2 CPUs: no trial fits (its largest node has 2; cpus_per_worker auto gives each "
            "worker at least 1 CPU)") in str(refused.value)
    assert refused.value.exit_code == 2
    check_sweep_fits(FakeApi([{"CPU": 2.0}]), _quickstart_sweep(tmp_path), warn=print)  # 2 workers fit


def test_a_sweep_whose_one_worker_fits_no_node_is_refused_although_the_cluster_has_enough_in_all(tmp_path):
    from runner.run.preflight import check_sweep_fits

    loaded = _quickstart_sweep(tmp_path, "workload.train.num_workers=1", "workload.train.cpus_per_worker=3")
    with pytest.raises(BadInput, match=r"one worker of a trial asks for CPU 3, but the largest of the cluster's 2 "
                                       r"node\(s\) offers CPU 2: no trial can start"):
        check_sweep_fits(FakeApi([{"CPU": 2.0}, {"CPU": 2.0}]), loaded, warn=print)


def test_an_edited_sweep_sent_to_a_local_cluster_whose_run_folder_holds_the_earlier_one_is_refused(tmp_path):
    import json
    from types import SimpleNamespace

    from jobs.sweep import stored_definition
    from runner.run.preflight import check_sweep_unchanged

    runs = tmp_path / "runs"
    earlier = _quickstart_sweep(tmp_path, f"workload.storage_path={runs}")
    run_dir = runs / earlier.workload.run_name
    (run_dir / "tune").mkdir(parents=True)
    (run_dir / "tune" / "experiment_state-2026-11-25.json").write_text("{}")
    (run_dir / "sweep.json").write_text(json.dumps(stored_definition(earlier.spec.sweep)))
    local = FakeApi([{"CPU": 2.0}])
    local.connection = SimpleNamespace(local_cluster="default")

    check_sweep_unchanged(local, earlier)  # the same sweep continues
    edited = _quickstart_sweep(tmp_path, f"workload.storage_path={runs}", "sweep.mode=min")
    with pytest.raises(BadInput, match=r"these changes would be ignored: sweep.mode: 'max' -> 'min'\. Set "
                                       r"sweep.on_change: restart") as refused:
        check_sweep_unchanged(local, edited)
    assert refused.value.exit_code == 2
    check_sweep_unchanged(local, _quickstart_sweep(tmp_path, f"workload.storage_path={runs}", "sweep.mode=min",
                                                   "sweep.on_change=restart"))
    remote = FakeApi([{"CPU": 2.0}])
    remote.connection = SimpleNamespace(local_cluster=None)
    check_sweep_unchanged(remote, edited)  # another machine's disk: the job checks it there


def test_a_sweep_whose_trial_has_enough_in_all_but_not_worker_by_worker_is_refused(tmp_path):
    """Three workers of 2 CPUs on two nodes of 3: the cluster has 6 CPUs, but a worker runs whole on one node."""
    from runner.run.preflight import check_sweep_fits

    loaded = _quickstart_sweep(tmp_path, "workload.train.num_workers=3", "workload.train.cpus_per_worker=2")
    with pytest.raises(BadInput) as refused:
        check_sweep_fits(FakeApi([{"CPU": 3.0}, {"CPU": 3.0}]), loaded, warn=print)
    assert ("a trial's 3 workers ask for CPU 2 each, and a worker runs whole on one node: the cluster's 2 node(s) "
            "(CPU 3; CPU 3) hold 2 such workers at once, although they have enough in all: no trial can start, so "
            "lower sweep.max_concurrent") in str(refused.value)
    assert refused.value.exit_code == 2
    check_sweep_fits(FakeApi([{"CPU": 4.0}, {"CPU": 2.0}]), loaded, warn=print)  # 2 + 1 workers: it fits
    warnings = []
    check_sweep_fits(FakeApi([{"CPU": 3.0}, {"CPU": 3.0}], autoscaling=True), loaded, warn=warnings.append)
    assert len(warnings) == 1 and "submitting anyway because the cluster autoscales" in warnings[0]


def test_an_auto_cpu_count_is_refused_at_the_least_it_gives_and_says_so(tmp_path):
    from runner.run.preflight import check_sweep_fits

    loaded = _quickstart_sweep(tmp_path, "workload.train.num_workers=3")  # cpus_per_worker: auto
    with pytest.raises(BadInput, match=r"one trial of the sweep needs 3 CPUs \(3 workers × 1 CPU; .*\), and the "
                                       r"cluster has 2 CPUs: no trial fits \(its largest node has 1; cpus_per_worker "
                                       r"auto gives each worker at least 1 CPU\)"):
        check_sweep_fits(FakeApi([{"CPU": 1.0}, {"CPU": 1.0}]), loaded, warn=print)
    check_sweep_fits(FakeApi([{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]), loaded, warn=print)


@pytest.mark.parametrize("max_concurrent", ["auto", 2])
@pytest.mark.parametrize("num_workers", ["auto", 1, 2, 3, 5])
def test_a_sweep_the_pre_flight_lets_through_is_one_the_workloads_own_check_runs_once_its_layout_is_resolved(
        tmp_path, num_workers, max_concurrent):
    """One rule on both sides: for every cluster of up to three nodes of 1 to 4 CPUs, a sweep whose trial the
    pre-flight accepts (an auto CPU count at its least) resolves, on the cluster, to workers the nodes place and to
    trials the job's own check holds (the job refuses the others itself, a few seconds after it was submitted)."""
    import itertools

    from jobs.sweep import sweep_concurrency
    from jobs.worker_layout import workers_that_fit
    from runner.run.preflight import check_sweep_fits
    from workloads.ray_train.config import NodeCapacity, shared_by

    loaded = _quickstart_sweep(tmp_path, f"workload.train.num_workers={num_workers}",
                               f"sweep.max_concurrent={max_concurrent}")
    at_once = max_concurrent if isinstance(max_concurrent, int) else 1
    for count in range(1, 4):
        for cpus in itertools.product(range(1, 5), repeat=count):
            nodes = [{"CPU": float(amount)} for amount in cpus]
            try:
                check_sweep_fits(FakeApi(nodes), loaded, warn=print)
            except BadInput:
                continue
            train, _ = loaded.workload.train.resolved_for(
                shared_by([NodeCapacity(f"n{i}", amount) for i, amount in enumerate(cpus)], at_once))
            assert workers_that_fit({"CPU": train.cpus_per_worker}, nodes) >= train.num_workers * at_once, \
                (cpus, train)
            sweep_concurrency(loaded.spec.sweep, train.demand("training", "train"), {"CPU": float(sum(cpus))})


def test_workers_fit_node_by_node_each_whole_on_one():
    from jobs.worker_layout import workers_that_fit

    assert workers_that_fit({"CPU": 2}, [{"CPU": 3}, {"CPU": 3}]) == 2  # not 6 // 2
    assert workers_that_fit({"CPU": 1, "GPU": 1}, NODES) == 1  # only the second node has a GPU
    assert workers_that_fit({"CPU": 0.1}, [{"CPU": 0.3}]) == 3
    assert workers_that_fit({"CPU": 1, "TPU": 4}, NODES) == 0
    assert workers_that_fit({"CPU": 0}, []) > 10**9  # nothing reserved: no limit
