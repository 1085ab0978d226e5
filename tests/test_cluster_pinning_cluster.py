"""With two Ray clusters on one host, a job's processes all talk to the cluster it was submitted to.

Ray Train's actors ask Ray's state API with no address, and Ray then scans the host for a GCS: with a
second cluster started later it warns ``Found multiple active Ray instances … Connecting to latest
cluster`` and talks to that one, or (no cluster marked latest) fails with ``Found multiple active Ray
instances``. Two pins keep it on its own: the job's keeper puts the driver's RAY_ADDRESS into the job config
every actor gets (workloads/rayjobs_observe/pinning.py, for any cluster; its unit checks are
tests/test_cluster_pinning.py), and a local cluster's processes inherit their own GCS address
(runner/local/environment.py). Either is enough here; with neither (an empty RAY_ADDRESS for the job's
actors) the PlacementGroupCleaner fails with that line in the job's log.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from runner.local import LocalCluster
from runner.local.nodes import dashboard_json
from tests.support.cli import REPO_ROOT
from tests.support.ray_instances import local_cluster_in

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"
OTHER = "pinning-other"


@pytest.fixture
def second_cluster(ray_cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalCluster]:
    """A second 1-CPU cluster on the host, beside the session's (a second GCS for Ray's scan to find); stopped after."""
    with local_cluster_in(tmp_path / "other-home", OTHER, num_cpus=1) as cluster:
        yield cluster


def _actors(cluster: LocalCluster) -> list[dict]:
    document = dashboard_json(cluster, "/api/v0/actors?limit=1000", timeout_s=10)
    return document["data"]["result"]["result"]


def test_a_training_job_stays_on_its_own_cluster_while_another_runs_on_the_host(ray_cluster, second_cluster,
                                                                                  rayjobs_cli, tmp_path):
    assert second_cluster.gcs_address != ray_cluster.gcs_address
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    spec = tmp_path / "pinned.yaml"
    # One training worker is enough: the controller and the worker are both actors the scan could mislead.
    spec.write_text(f"name: pinned\nentrypoint: python train.py --storage {tmp_path / 'runs'} --epochs 2 "
                    f"--epoch-s 0 --max-failures 0 --workers 1\nrecord_path: {tmp_path / 'records'}\n"
                    f"runtime_env:\n  working_dir: {code}\n")
    # --raw: the log exactly as written, so that no line of Ray's is held back from the check below.
    result = rayjobs_cli("submit", str(spec), "--raw", timeout=300)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-4000:]
    assert "final loss" in result.stdout
    assert "Found multiple active Ray instances" not in shown and "Connecting to latest cluster" not in shown

    job_id = next(line.split(" as ", 1)[1].split()[0] for line in result.stderr.splitlines()
                  if line.startswith("rayjobs: submitted pinned as "))
    ray_job = dashboard_json(ray_cluster, f"/api/jobs/{job_id}", timeout_s=10)["job_id"]
    ours = {actor["class_name"] for actor in _actors(ray_cluster) if actor.get("job_id") == ray_job}
    assert {"RayTrainWorker", "TrainController"} <= ours, ours
    assert _actors(second_cluster) == []
