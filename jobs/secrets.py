"""Keeping secrets out of what rayjobs prints."""

from __future__ import annotations

import copy
import re
from typing import Any

from jobs.keys import METADATA_SECRETS

MASK = "****"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|_KEY$|^KEY$|AUTH)", re.IGNORECASE
)


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name suggests its value is a secret."""
    return bool(_SECRET_NAME.search(name))


def masked(job: dict[str, Any]) -> dict[str, Any]:
    """A copy of a submission or job info that is safe to print: secret-looking env var values replaced."""
    # The spec's own list travels in the job's metadata, so `status` and `list` honour it too.
    marked = ((job.get("metadata") or {}).get(METADATA_SECRETS) or "").split(",")
    return masked_runtime_env(job, marked)


def masked_runtime_env(document: dict[str, Any], secret_names: list[str]) -> dict[str, Any]:
    """A copy of ``document`` (anything with a ``runtime_env``) with the values of secret env vars replaced:
    those named in ``secret_names`` and those whose names look secret."""
    result = copy.deepcopy(document)
    env_vars = (result.get("runtime_env") or {}).get("env_vars") or {}
    for name in env_vars:
        if name in secret_names or looks_secret(name):
            env_vars[name] = MASK
    return result
