"""The one line that tells a submitter their job keeps no run record, and how to have one.

A job keeps its record only when it runs under the record's keeper (``jobs.submission.keeps_record``): it
uploads code, names a ``record_path`` or is queued. Without that it keeps neither a record nor progress
events, which users otherwise find out only when ``rayjobs runs`` has nothing for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayjobs_agent.wire import RECORD_ENV_VAR
from rayjobs_agent.record_layout import DEFAULT_RECORD_PATH

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec


def no_record_note(loaded: LoadedSpec, submission: dict[str, Any]) -> str | None:
    """The note for a submission that keeps no record; None when it keeps one or the spec says ``record: false``.

    Args:
        loaded: the validated spec.
        submission: what is sent to Ray (``jobs.submission.build_submission``); a kept record shows in its
            runtime_env as the keeper's configuration.
    """
    if not loaded.spec.record:
        return None  # turned off on purpose: nothing to tell
    env_vars = ((submission.get("runtime_env") or {}).get("env_vars")) or {}
    if RECORD_ENV_VAR in env_vars:
        return None
    return (f"job {loaded.spec.name} keeps no run record and shows no training progress: it uploads no code "
            f"(runtime_env.working_dir or py_modules) and names no record_path; add `record_path: "
            f"{DEFAULT_RECORD_PATH}` (or s3://BUCKET/PREFIX) to the spec to keep a record, or `record: false` to "
            "not be told")
