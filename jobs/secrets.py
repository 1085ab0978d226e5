"""Keeping secrets out of what rayjobs prints and writes.

A secret env var's value is replaced by ``***`` in any copy of a submission, a job's info or a spec,
and that value is then masked wherever else it turns up (the entrypoint, another field, the job's
log), as is the password of any URL. The masking itself lives in ``rayjobs_agent/masking.py``
(standard library only), which the job runs on the cluster too: both sides mask by one rule, with one
mask and one reading of the spec's ``secret_env_vars``.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

from rayjobs_agent.masking import (MASK, SecretMask, is_masked, looks_secret, mask_url_userinfo, marked_names,
                                   secret_names)


def marked_secrets(job: dict[str, Any]) -> list[str]:
    """The spec's own ``secret_env_vars`` of a submission or job info: they travel in the job's metadata."""
    return marked_names(job.get("metadata") or {})


def job_mask(job: dict[str, Any], marked: Iterable[str] | None = None) -> SecretMask:
    """The mask of one job's secrets, from its ``runtime_env.env_vars`` as submitted.

    Args:
        job: a submission, a job's info from the cluster (Ray returns the runtime_env it was given),
            or a spec document.
        marked: names to treat as secret besides those that look secret (default: the job's metadata list).
    """
    env_vars = (job.get("runtime_env") or {}).get("env_vars") or {}
    names = secret_names(env_vars, marked_secrets(job) if marked is None else marked)
    return SecretMask.from_environ(env_vars, names)


def masked(job: dict[str, Any]) -> dict[str, Any]:
    """A copy of a submission or job info that is safe to print: secret env var values replaced, and those
    values and URL passwords masked in every other field (entrypoint, message, metadata)."""
    return masked_runtime_env(job, marked_secrets(job))


def masked_runtime_env(document: dict[str, Any], marked: list[str]) -> dict[str, Any]:
    """A copy of ``document`` (anything with a ``runtime_env``) with its secrets masked.

    The values of secret env vars (those named in ``marked`` and those whose names look secret) become
    ``***`` (:data:`MASK`; `rayjobs rerun` takes such a value from its own environment), as does every other
    place one of those values appears, and every URL's password.
    """
    mask = job_mask(document, marked)
    result = copy.deepcopy(document)
    env_vars = (result.get("runtime_env") or {}).get("env_vars") or {}
    for name in secret_names(env_vars, marked):
        env_vars[name] = MASK
    return masked_strings(result, mask)


def masked_strings(document: Any, mask: SecretMask) -> Any:
    """``document`` (JSON-like) with ``mask`` applied to every string in it, keys included."""
    if isinstance(document, str):
        return mask.mask_text(document)
    if isinstance(document, dict):
        return {masked_strings(key, mask): masked_strings(value, mask) for key, value in document.items()}
    if isinstance(document, (list, tuple)):
        return [masked_strings(value, mask) for value in document]
    return document


def without_credentials(address: str) -> str:
    """``address`` as an error message may show it: whatever comes before its last ``@`` (``user:password@``,
    ``token@``) is ``***``, the scheme kept, and so is a URL's query (``?token=…``). Stricter than the log's
    masking, which must end a URL at a space: an error repeats what was typed, whole."""
    if "@" in address:  # first: a password may hold a "?"
        scheme, separator, rest = address.partition("://")
        if not separator:
            scheme, rest = "", address
        address = f"{scheme}{separator}{MASK}@{rest.rpartition('@')[2]}"
    if "://" in address and "?" in address:
        address = f"{address.partition('?')[0]}?{MASK}"
    return address


def shown_setting(text: str) -> str:
    """A ``KEY=VALUE`` setting (``--set``) as an error message may show it: the value masked when its key looks
    secret, an address's credentials hidden otherwise (text without ``=`` as an address)."""
    key, separator, value = text.partition("=")
    if not separator:
        return without_credentials(text)
    name = key.strip().rpartition(".")[2]
    return f"{key}={MASK if value and looks_secret(name) else without_credentials(value)}"


__all__ = ["MASK", "SecretMask", "is_masked", "job_mask", "looks_secret", "marked_secrets", "mask_url_userinfo",
           "masked", "masked_runtime_env", "masked_strings", "secret_names", "shown_setting", "without_credentials"]
