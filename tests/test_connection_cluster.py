"""Reaching a local cluster by name (--cluster, RAYJOBS_CLUSTER) and by any spelling of its address."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runner.local import LocalCluster
from tests.support.cli import cli_env, run_rayjobs


QUICK_JOB = "entrypoint: echo reached-by-name\n"
# Where RAY_ADDRESS points in these tests: nothing listens there, so a command that used it would fail.
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def alias_home(ray_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RAYJOBS_HOME in which the session cluster is the local cluster 'dev' (and there is no 'default')."""
    # Only a second state file: `cluster down --name dev` here would stop the session cluster.
    home = tmp_path_factory.mktemp("alias-home")
    directory = home / "clusters" / "dev"
    directory.mkdir(parents=True)
    (directory / "cluster.json").write_text(dataclasses.replace(ray_cluster, name="dev").to_json())
    return home


def spec_file(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def test_every_command_reaches_a_cluster_by_name(alias_home, tmp_path):
    env = cli_env(alias_home, RAY_ADDRESS=NOWHERE)

    def rayjobs_cli(*args: str):
        return run_rayjobs(*args, "--cluster", "dev", env=env)

    assert run_rayjobs("list", env=env).returncode == 4  # without --cluster, RAY_ADDRESS is used
    submitted = rayjobs_cli("submit", str(spec_file(tmp_path, "by-name", QUICK_JOB)), "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    assert "local cluster 'dev' via --cluster" in submitted.stderr
    job_id = submitted.stdout.strip()
    assert f"rayjobs logs --follow {job_id} --cluster dev" in submitted.stderr

    followed = rayjobs_cli("logs", job_id, "--follow")
    assert followed.returncode == 0 and "reached-by-name" in followed.stdout, followed.stderr
    status = rayjobs_cli("status", job_id)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stderr
    listed = rayjobs_cli("list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert job_id in {job["submission_id"] for job in json.loads(listed.stdout)}
    stopped = rayjobs_cli("stop", job_id)
    assert stopped.returncode == 0 and "had already ended: SUCCEEDED" in stopped.stderr, stopped.stderr
    by_env = run_rayjobs("status", job_id, env=cli_env(alias_home, RAY_ADDRESS=NOWHERE, RAYJOBS_CLUSTER="dev"))
    assert by_env.returncode == 0 and "SUCCEEDED" in by_env.stdout, by_env.stderr
    deleted = rayjobs_cli("delete", job_id)
    assert deleted.returncode == 0, deleted.stderr


def test_unknown_cluster_name_lists_the_running_ones(alias_home):
    result = run_rayjobs("list", "--cluster", "staging", home=alias_home)
    assert result.returncode == 4
    assert "no local cluster 'staging' is running" in result.stderr
    assert "Running local clusters: 'dev' at http://127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr


def test_cluster_and_address_that_disagree_are_a_usage_error(alias_home, ray_cluster):
    port = ray_cluster.dashboard_url.rsplit(":", 1)[1]
    agreeing = run_rayjobs("list", "--cluster", "dev", "--address", f"localhost:{port}", home=alias_home)
    assert agreeing.returncode == 0, agreeing.stderr
    result = run_rayjobs("list", "--cluster", "dev", "--address", NOWHERE, home=alias_home)
    assert result.returncode == 2
    assert f"--cluster dev and --address {NOWHERE} name different clusters" in result.stderr


def test_any_spelling_of_a_local_clusters_address_gets_its_token(ray_cluster, ray_cluster_home, tmp_path):
    port = ray_cluster.dashboard_url.rsplit(":", 1)[1]
    # The token comes from the state under RAYJOBS_HOME, not from the default-cluster fallback:
    # an address is given every time.
    followed = run_rayjobs("submit", str(spec_file(tmp_path, "by-address", "entrypoint: echo reached-by-address\n")),
                           "--address", f"localhost:{port}/", home=ray_cluster_home)
    assert followed.returncode == 0, followed.stderr
    assert "reached-by-address" in followed.stdout
    for env in (cli_env(ray_cluster_home, RAY_ADDRESS=f"127.0.0.1:{port}"),
                cli_env(ray_cluster_home, RAY_API_SERVER_ADDRESS=f"http://LOCALHOST:{port}/")):
        listed = run_rayjobs("list", env=env)
        assert listed.returncode == 0, listed.stderr
        assert "by-address" in listed.stdout
