"""What every benchmark shares: a private Ray instance on this machine."""

from __future__ import annotations

import os


def start_private_ray(num_cpus: int, log_to_driver: bool = False) -> None:
    """Start a Ray instance of ``num_cpus`` CPUs for this process alone, on loopback.

    ``address="local"`` ignores any RAY_ADDRESS (a benchmark never joins a user's
    cluster); token auth is off so that Ray does not write ~/.ray/auth_token.
    """
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver)
