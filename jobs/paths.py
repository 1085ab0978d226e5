"""Paths written in a spec resolve against the spec file's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo

SPEC_DIR_CONTEXT_KEY = "spec_dir"


def _resolve_against_spec_dir(value: Path, info: ValidationInfo) -> Path:
    # A spec must run the same from any working directory, so relative paths are
    # anchored at the spec file. Without a spec (e.g. on the cluster, where the
    # client already made them absolute) they are left as written.
    value = value.expanduser()
    spec_dir = (info.context or {}).get(SPEC_DIR_CONTEXT_KEY)
    if spec_dir is not None and not value.is_absolute():
        value = (Path(spec_dir) / value).resolve()
    return value


SpecPath = Annotated[Path, AfterValidator(_resolve_against_spec_dir)]
"""A filesystem path that, in a spec, is relative to the spec file's directory."""
