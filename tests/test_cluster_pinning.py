"""A job's own processes are pinned to its cluster: the driver's RAY_ADDRESS reaches every worker and actor."""

from __future__ import annotations

import json

from rayjobs_agent.pinning import pinned_to_this_cluster


def test_the_drivers_address_goes_into_the_job_config_every_actor_gets():
    from ray.job_config import JobConfig

    config = {"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip", "env_vars": {"A": "1"}}, "metadata": {"k": "v"}}
    added = pinned_to_this_cluster({"RAY_ADDRESS": "127.0.0.1:6380",
                                    "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(config)})
    # read as the driver's ray.init reads it
    job_config = JobConfig.from_json(json.loads(added["RAY_JOB_CONFIG_JSON_ENV_VAR"]))
    assert job_config.runtime_env["env_vars"] == {"A": "1", "RAY_ADDRESS": "127.0.0.1:6380"}
    assert job_config.runtime_env["working_dir"] == "gcs://_ray_pkg_x.zip" and job_config.metadata == {"k": "v"}


def test_nothing_is_pinned_without_an_address_or_over_the_users_own():
    own = json.dumps({"runtime_env": {"env_vars": {"RAY_ADDRESS": "10.0.0.1:6379"}}})
    assert pinned_to_this_cluster({"RAY_ADDRESS": "127.0.0.1:6380", "RAY_JOB_CONFIG_JSON_ENV_VAR": own}) == {}
    assert pinned_to_this_cluster({"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"}) == {}
    assert pinned_to_this_cluster({"RAY_ADDRESS": "127.0.0.1:6380", "RAY_JOB_CONFIG_JSON_ENV_VAR": "not json"}) == {}
    bare = pinned_to_this_cluster({"RAY_ADDRESS": "127.0.0.1:6380",
                                   "RAY_JOB_CONFIG_JSON_ENV_VAR": '{"runtime_env": null}'})
    assert json.loads(bare["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"] == {
        "env_vars": {"RAY_ADDRESS": "127.0.0.1:6380"}}
