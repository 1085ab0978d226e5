"""Pre-flight: an entrypoint that no node can host is refused before submission; one that does not run its
workload is warned about."""

from __future__ import annotations

import pytest

from jobs.loader import load_spec
from runner.client.preflight import check_entrypoint_fits, entrypoint_demand, entrypoint_note, unmet_on_every_node
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
