"""The preprocess stage's workload entry point on the session cluster: a bad data root exits 2."""

from __future__ import annotations

from tests.support.cli import REPO_ROOT
from tests.test_preprocess import _run_with_a_missing_data_root


def test_a_bad_data_root_exits_2_from_the_workload_entry_point(ray_cluster, ray_cluster_env, tmp_path):
    # This entry point connects to Ray before it runs the stage: give it the session's cluster.
    env = {**ray_cluster_env, "PYTHONPATH": str(REPO_ROOT), "RAY_ADDRESS": ray_cluster.gcs_address}
    _run_with_a_missing_data_root(tmp_path, "workloads.vision", env)
