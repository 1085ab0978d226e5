"""Whether a job's Ray Train runs get rayjobs' progress callback, decided on the cluster before the entrypoint starts.

The callback implements Ray Train's own callback interfaces, which Ray keeps privately and may change
in any release. The record keeper knows the cluster's Ray version before anything of the user's runs,
so it names the callback in the entrypoint's ``RAY_TRAIN_CALLBACKS`` only on the Ray versions it is
tested on (:data:`TESTED_RAY_RANGE`); anywhere else the job runs without it and its log says so once.
Nothing here imports Ray: reading its version costs the job's start nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

from ..wire import PROGRESS_CALLBACK, TRAIN_CALLBACKS_ENV_VAR

TRAIN_V2_ENV_VAR = "RAY_TRAIN_V2_ENABLED"
# (major, minor) of the oldest and newest Ray the callback is tested on, both included.
TESTED_RAY_RANGE = ((2, 60), (2, 60))
_FALSE_WORDS = ("0", "false", "no", "off")


def tested_range_text() -> str:
    """The tested range for a person: ``2.60.x`` or ``2.58.x to 2.60.x``."""
    (low_major, low_minor), (high_major, high_minor) = TESTED_RAY_RANGE
    low, high = f"{low_major}.{low_minor}.x", f"{high_major}.{high_minor}.x"
    return low if low == high else f"{low} to {high}"


def ray_version() -> str | None:
    """The installed Ray's version, from its package metadata (None when Ray is not installed)."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


def is_tested(version: str | None) -> bool:
    """Whether ``version`` (``2.60.0``, ``2.60.1rc1``) lies in :data:`TESTED_RAY_RANGE`."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    if found is None:
        return False
    low, high = TESTED_RAY_RANGE
    return low <= (int(found[1]), int(found[2])) <= high


def train_callbacks(environ: Mapping[str, str], version: str | None) -> tuple[str | None, str | None]:
    """What the entrypoint's ``RAY_TRAIN_CALLBACKS`` becomes, and why progress is unavailable when it is.

    Returns ``(value, None)``: the callbacks the job named, then rayjobs' own; or ``(None, reason)``:
    the variable is left as the job set it and ``reason`` is told once.
    """
    if environ.get(TRAIN_V2_ENV_VAR, "").strip().lower() in _FALSE_WORDS:
        return None, (f"progress from Ray Train is unavailable under Ray Train V1 ({TRAIN_V2_ENV_VAR}="
                      f"{environ[TRAIN_V2_ENV_VAR]}), which never reads {TRAIN_CALLBACKS_ENV_VAR}")
    if not is_tested(version):
        return None, (f"the progress callback is tested on Ray {tested_range_text()} and this cluster runs Ray "
                      f"{version or 'of an unknown version'}, so it is not installed")
    named = [name.strip() for name in environ.get(TRAIN_CALLBACKS_ENV_VAR, "").split(",") if name.strip()]
    if PROGRESS_CALLBACK not in named:
        named.append(PROGRESS_CALLBACK)
    return ",".join(named), None
