"""The environment every process that talks to a Ray cluster on this machine needs."""

from __future__ import annotations

import os

# Without it Ray on some hosts binds the machine's external address instead of the one it was
# given, and loopback clusters stop being reachable.
RAY_CLIENT_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def prepare_ray_env() -> None:
    """Set :data:`RAY_CLIENT_ENV` in this process, keeping any value the user already chose.

    Must run before ``ray`` is imported for the setting to take effect.
    """
    for name, value in RAY_CLIENT_ENV.items():
        os.environ.setdefault(name, value)
