"""Every process of a job talks to the job's own cluster, not to whichever Ray instance the host knows last.

Ray's job supervisor hands the driver its cluster in ``RAY_ADDRESS``, but the actors the driver starts
get the job's runtime environment, not the driver's: Ray Train's PlacementGroupCleaner asks the state
API with no address, which makes Ray scan the host for GCS processes. With a second Ray instance on
the host it warns ``Found multiple active Ray instances … Connecting to latest cluster`` every few
seconds, or asks the other cluster. Putting the driver's ``RAY_ADDRESS`` into the job config that the
driver's ``ray.init`` reads (``RAY_JOB_CONFIG_JSON_ENV_VAR``) gives it to every worker and actor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .wire import RAY_JOB_CONFIG_ENV_VAR as JOB_CONFIG_VARIABLE, job_config

# Where Ray's job supervisor hands the driver its cluster (the GCS address): Ray's own variable.
ADDRESS_VARIABLE = "RAY_ADDRESS"


def pinned_to_this_cluster(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the entrypoint's environment (none when there is nothing to pin or the user did).

    Fail soft: a job config that does not read as expected is left as it is.
    """
    address, config = environ.get(ADDRESS_VARIABLE), job_config(environ)
    if not address or not config:  # none, or one that does not read as a config: left as it is
        return {}
    runtime_env = config.get("runtime_env") or {}
    if not isinstance(runtime_env, dict):
        return {}
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or ADDRESS_VARIABLE in env_vars:
        return {}
    config["runtime_env"] = {**runtime_env, "env_vars": {**env_vars, ADDRESS_VARIABLE: address}}
    return {JOB_CONFIG_VARIABLE: json.dumps(config)}
