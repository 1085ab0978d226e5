"""Paths written in a spec resolve against the spec file's directory; URIs are taken only where storage allows them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BeforeValidator, ValidationInfo

from rayjobs_agent.storage_location import StorageLocation, uri_scheme

SPEC_DIR_CONTEXT_KEY = "spec_dir"


def resolve_spec_path(value: str | Path, spec_dir: Any = None) -> Path:
    """``~`` expanded and, when ``spec_dir`` is given, a relative path anchored there and resolved.

    Raises ValueError (which pydantic reports against the field) for paths no filesystem accepts.
    """
    try:
        path = Path(value).expanduser()
        if spec_dir is not None and not path.is_absolute():
            path = (Path(spec_dir) / path).resolve()
        return path
    except RuntimeError:  # expanduser: ~name where no user has that name
        raise ValueError(f"{str(value)!r} starts with ~ but names no user on this machine") from None
    except (OSError, ValueError) as exc:  # a name too long for the filesystem, a NUL byte
        raise ValueError(f"{str(value)!r} cannot be used as a path: {getattr(exc, 'strerror', None) or exc}") \
            from None


def _resolve_against_spec_dir(value: Path, info: ValidationInfo) -> Path:
    # A spec must run the same from any working directory, so relative paths are
    # anchored at the spec file. Without a spec (e.g. on the cluster, where the
    # client already made them absolute) they are left as written.
    return resolve_spec_path(value, (info.context or {}).get(SPEC_DIR_CONTEXT_KEY))


def refuse_uri(value: Any) -> Any:
    """``value`` unchanged, unless it is a URI (``scheme://…``): then ValueError, as the field takes a local path."""
    if isinstance(value, str) and (scheme := uri_scheme(value.strip())):
        raise ValueError(f"{value.strip()!r} is a URI ({scheme}://), but this field takes a local path")
    return value


def _storage_path(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str):
        # Read as workloads.storage reads it on the cluster (file:///data/runs is the local folder /data/runs).
        location = StorageLocation.parse(value.strip())
        if location.is_s3:
            return location.uri
        value = location.path
    if isinstance(value, (str, Path)):
        return _resolve_against_spec_dir(Path(value), info)
    return value


SpecPath = Annotated[Path, BeforeValidator(refuse_uri), AfterValidator(_resolve_against_spec_dir)]
"""A filesystem path that, in a spec, is relative to the spec file's directory. A URI is refused."""

SpecStoragePath = Annotated[Union[Path, str], BeforeValidator(_storage_path)]
"""A local folder (as :data:`SpecPath`; ``file://`` names one too) or an ``s3://bucket/prefix`` URI, kept as written."""
