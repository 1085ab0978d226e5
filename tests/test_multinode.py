"""Multi-node local clusters without starting one: what `cluster up --nodes N` refuses, the object store per node,
and the note about local storage on several nodes (live clusters: test_multinode_cluster.py)."""

from __future__ import annotations

import pytest

from runner.errors import ExitCode
from runner.run.preflight import is_local_location, local_shared_locations, shared_storage_note
from runner.local.workers import object_store_bytes
from tests.support.cli import run_rayjobs


def _vision_workload(workload: dict):
    from workloads.vision.config import VisionParams

    return VisionParams.model_validate(workload)


@pytest.mark.parametrize("value, local", [
    ("/data/results", True), ("~/results", True), ("file:///data/results", True),
    ("s3://bucket/results", False), ("gs://bucket/x", False), ("abfss://c@a.dfs.core.windows.net/x", False),
])
def test_storage_locations_are_told_apart(value, local):
    assert is_local_location(value) is local


def test_local_shared_paths_finds_storage_path_and_output_dir():
    workload = _vision_workload({"storage_path": "/r", "data": {"output_dir": "/d", "root": "/elsewhere"}})
    assert local_shared_locations(workload) == {"storage_path": "/r", "data.output_dir": "/d"}
    remote = _vision_workload({"storage_path": "s3://bucket/r", "data": {"output_dir": "s3://bucket/d"}})
    assert local_shared_locations(remote) == {}
    assert local_shared_locations(None) == {}


def test_no_storage_note_without_a_local_cluster():
    workload = _vision_workload({"storage_path": "/r"})
    assert shared_storage_note(None, workload) is None
    assert shared_storage_note("not-running", workload) is None


def test_object_store_fits_several_nodes():
    assert object_store_bytes(1) is None
    for nodes in (2, 3, 8, 32):
        size = object_store_bytes(nodes)
        assert 128 * 2**20 <= size <= 512 * 2**20 and size % 2**20 == 0


@pytest.mark.parametrize("nodes", ["0", "33", "two"])
def test_bad_node_counts_are_bad_input(nodes, tmp_path):
    result = run_rayjobs("cluster", "up", "--name", "never", "--nodes", nodes, home=tmp_path, timeout=60)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert not (tmp_path / "clusters" / "never" / "cluster.json").exists()
