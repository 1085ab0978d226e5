"""Packaging a runtime_env's local directories as Ray does and uploading them to S3.

KubeRay submits a job from inside the cluster, where the laptop's ``working_dir`` does
not exist. Ray itself can fetch a working_dir from ``s3://…zip``, so the directory is
zipped here with Ray's own packaging code (same excludes, same content-hash name
``_ray_pkg_<hash>.zip``) and put in a bucket. The same contents always get the same
name, so an unchanged directory is uploaded once.

Configuration comes from the standard AWS variables: ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` (handed to pyarrow, which does not read them itself),
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` (else the AWS SDK's
own chain: profiles, web identity, instance roles), and ``AWS_REGION``/``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runner.errors import AuthFailed, BadInput, ClusterUnreachable, RayJobsError

# Short: an unreachable endpoint must fail within seconds, not after the SDK's default minutes.
CONNECT_TIMEOUT_S = 3
REQUEST_TIMEOUT_S = 30
MAX_ATTEMPTS = 2
DEFAULT_REGION = "us-east-1"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StorageUnreachable(ClusterUnreachable):
    """The object store did not answer, or answered with an error of its own."""


class StorageAuthFailed(AuthFailed):
    """The object store refused the credentials (or wanted some)."""


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: where packages go."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, text: str) -> S3Location:
        """Read ``s3://bucket[/prefix]``. Raises BadInput for anything else."""
        parsed = urlparse(text)
        if parsed.scheme != "s3" or not _BUCKET_NAME.match(parsed.netloc or ""):
            raise BadInput(f"--upload-to {text!r} is not s3://BUCKET[/PREFIX] (a bucket name is 3-63 lowercase "
                           "letters, digits, '.' and '-')")
        return cls(parsed.netloc, parsed.path.strip("/"))

    def key(self, name: str) -> str:
        """The object path of ``name`` under this location, as pyarrow names it (bucket first)."""
        return "/".join(part for part in (self.bucket, self.prefix, name) if part)

    def uri(self, name: str) -> str:
        """The ``s3://`` URI of ``name`` under this location."""
        return f"s3://{self.key(name)}"


@dataclass(frozen=True)
class S3Settings:
    """How to reach the object store, read from the standard AWS variables."""

    endpoint: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> S3Settings:
        """The settings the AWS variables in ``env`` describe."""
        keys = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        return cls(
            endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            access_key=keys[0] if all(keys) else None,
            secret_key=keys[1] if all(keys) else None,
            session_token=env.get("AWS_SESSION_TOKEN") if all(keys) else None,
        )

    @property
    def where(self) -> str:
        """The endpoint, in words, for messages."""
        return self.endpoint or "AWS S3 (no AWS_ENDPOINT_URL set)"


def upload_local_paths(runtime_env: dict[str, Any], destination: str, *, env: Mapping[str, str] = os.environ,
                       say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """A copy of ``runtime_env`` whose local working_dir and py_modules directories are uploaded packages.

    Args:
        runtime_env: a submission's runtime_env (its ``excludes`` already hold rayjobs' defaults).
        destination: ``s3://bucket/prefix`` for the packages.
        env: where the AWS variables are read.
        say: receives one line per package (its URI, uploaded or already there).

    Returns:
        The runtime_env with ``s3://…/_ray_pkg_<hash>.zip`` URIs, and without ``excludes`` (applied here).

    Raises:
        BadInput: a malformed destination, a missing bucket, or a py_modules entry that is not a directory.
        StorageUnreachable: no answer from the endpoint, or an error from it.
        StorageAuthFailed: the credentials were refused.
    """
    location = S3Location.parse(destination)
    result = copy.deepcopy(runtime_env)
    excludes = list(result.get("excludes") or [])
    jobs: list[tuple[str, Path, bool, list[str]]] = []
    working_dir = result.get("working_dir")
    if working_dir and "://" not in working_dir:
        # Ray adds its own defaults to the working_dir's excludes (not to py_modules').
        jobs.append(("working_dir", Path(working_dir), False, _ray_default_excludes() + excludes))
    for module in result.get("py_modules") or []:
        if "://" in module:
            continue
        if not Path(module).is_dir():
            raise BadInput(f"py_modules entry {module} is a file: only directories are packaged for KubeRay; "
                           "upload it yourself and give its URI")
        jobs.append(("py_modules", Path(module), True, excludes))
    if not jobs:
        return result

    settings = S3Settings.from_env(env)
    filesystem = s3_filesystem(settings, location.bucket)
    check_bucket(filesystem, location, settings)
    uploaded: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rayjobs-package-") as scratch:
        for field_name, directory, include_parent_dir, patterns in jobs:
            name, package = package_directory(directory, patterns, include_parent_dir, Path(scratch))
            uri = location.uri(name)
            if upload_file(filesystem, package, location.key(name), settings):
                say(f"uploaded {field_name} {directory} ({_size(package.stat().st_size)}) as {uri}")
            else:
                say(f"{field_name} {directory} is already uploaded as {uri} (same contents)")
            uploaded[str(directory)] = uri
    if working_dir in uploaded:
        result["working_dir"] = uploaded[working_dir]
    if result.get("py_modules"):
        result["py_modules"] = [uploaded.get(module, module) for module in result["py_modules"]]
    result.pop("excludes", None)
    return result


def package_directory(directory: Path, excludes: list[str], include_parent_dir: bool,
                      scratch: Path) -> tuple[str, Path]:
    """Zip ``directory`` with Ray's packaging code; return the package's name (``_ray_pkg_<hash>.zip``) and file."""
    from ray._private.runtime_env.packaging import create_package, get_uri_for_directory

    quiet = logging.getLogger("rayjobs.package")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    with _ray_packaging_quiet():
        uri = get_uri_for_directory(str(directory), include_gitignore=_include_gitignore(), excludes=excludes)
        name = uri.split("://", 1)[1]
        target = scratch / name
        create_package(str(directory), target, include_gitignore=_include_gitignore(),
                       include_parent_dir=include_parent_dir, excludes=excludes, logger=quiet)
    return name, target


@contextlib.contextmanager
def _ray_packaging_quiet() -> Iterator[None]:
    # Ray's packaging logs INFO lines of its own (e.g. about .gitignore files) outside rayjobs' format.
    ray_logger = logging.getLogger("ray._private.runtime_env.packaging")
    level = ray_logger.level
    ray_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ray_logger.setLevel(level)


def s3_filesystem(settings: S3Settings, bucket: str) -> Any:
    """A ``pyarrow.fs.S3FileSystem`` for ``settings``, with short timeouts."""
    from pyarrow import fs

    options: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS),
        "region": settings.region or _bucket_region(settings, bucket),
    }
    if settings.endpoint:
        parsed = urlparse(settings.endpoint if "://" in settings.endpoint else f"https://{settings.endpoint}")
        options["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        options["scheme"] = parsed.scheme
    if settings.access_key:
        options.update(access_key=settings.access_key, secret_key=settings.secret_key,
                       session_token=settings.session_token)
    return fs.S3FileSystem(**options)


def check_bucket(filesystem: Any, location: S3Location, settings: S3Settings) -> None:
    """Raise unless the bucket exists and answers."""
    from pyarrow.fs import FileType

    info = _calling_storage(lambda: filesystem.get_file_info(location.bucket), settings, f"bucket {location.bucket}")
    if info.type == FileType.NotFound:
        raise BadInput(f"bucket {location.bucket!r} does not exist at {settings.where}; create it, or name "
                       "another with --upload-to")


def upload_file(filesystem: Any, package: Path, key: str, settings: S3Settings) -> bool:
    """Copy ``package`` to ``key`` unless an object of that name and size is there; return whether it copied."""
    from pyarrow.fs import FileType

    existing = _calling_storage(lambda: filesystem.get_file_info(key), settings, key)
    size = package.stat().st_size
    if existing.type == FileType.File and existing.size == size:
        return False

    def copy_it() -> None:
        with package.open("rb") as source, filesystem.open_output_stream(key) as target:
            while chunk := source.read(8 * 1024 * 1024):
                target.write(chunk)

    _calling_storage(copy_it, settings, key)
    return True


def _calling_storage(call: Callable[[], Any], settings: S3Settings, what: str) -> Any:
    """Run one pyarrow S3 call; turn its OSError into a one-paragraph error of the right kind."""
    try:
        return call()
    except OSError as exc:
        raise _storage_error(str(exc), settings, what) from None


def _storage_error(message: str, settings: S3Settings, what: str) -> RayJobsError:
    first_line = message.strip().splitlines()[0] if message.strip() else "no details"
    if "NETWORK_CONNECTION" in message or "curlCode" in message:
        return StorageUnreachable(f"cannot reach the object store at {settings.where} ({first_line}); check "
                                  "AWS_ENDPOINT_URL and the network")
    if any(code in message for code in ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
                                         "EXPIRED_TOKEN", "AccessDenied", "InvalidAccessKeyId", "Forbidden")):
        return StorageAuthFailed(f"the object store at {settings.where} refused access to {what}: check "
                                 "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) and the "
                                 f"bucket's permissions ({first_line})")
    if "NO_SUCH_BUCKET" in message:
        return BadInput(f"{what}: the bucket does not exist at {settings.where} ({first_line})")
    return StorageUnreachable(f"the object store at {settings.where} failed on {what}: {first_line}")


def _bucket_region(settings: S3Settings, bucket: str) -> str:
    if settings.endpoint:
        return DEFAULT_REGION
    from pyarrow import fs

    try:
        return fs.resolve_s3_region(bucket)
    except OSError:  # unknown here; the request itself then says what is wrong
        return DEFAULT_REGION


def _include_gitignore() -> bool:
    # As Ray's JobSubmissionClient decides it.
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE

    return os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"


def _ray_default_excludes() -> list[str]:
    from ray._private.ray_constants import get_runtime_env_default_excludes

    return get_runtime_env_default_excludes()


def _size(size_bytes: int) -> str:
    amount = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"
