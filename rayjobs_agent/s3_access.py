"""How S3 is reached: settings from the AWS variables, one way to open pyarrow's filesystem, errors in one paragraph.

Part of the one storage seam (:mod:`storage_location`, which every side uses): standard library only at
import, like the run record's keeper that ships it; pyarrow is imported when a filesystem is opened.

Configuration comes from the standard AWS variables: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``
(handed to pyarrow, which does not read them itself), ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN`` (else the AWS SDK's own chain: profiles, web identity, instance roles), and
``AWS_REGION``/``AWS_DEFAULT_REGION``. The errors pyarrow raises (``OSError`` with the SDK's text) become
one paragraph of one of three kinds, :class:`ObjectStoreUnreachable`, :class:`ObjectStoreAuthFailed` and
:class:`ObjectStoreMissing`, naming what was asked for and the variables to check; the client and the
workloads map the kinds to their own exit codes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlparse

# Short: an unreachable endpoint must fail within seconds, not after the SDK's default minutes.
CONNECT_TIMEOUT_S = 3
REQUEST_TIMEOUT_S = 30
MAX_ATTEMPTS = 2
DEFAULT_REGION = "us-east-1"
CREDENTIAL_VARIABLES = "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN)"

T = TypeVar("T")


class ObjectStoreError(Exception):
    """The object store could not be used; the message is one paragraph naming the path and what to check."""


class ObjectStoreUnreachable(ObjectStoreError):
    """The object store did not answer, or answered with an error of its own."""


class ObjectStoreAuthFailed(ObjectStoreError):
    """The object store refused the credentials (or wanted some)."""


class ObjectStoreMissing(ObjectStoreError):
    """The bucket does not exist."""


@dataclass(frozen=True)
class S3Settings:
    """How to reach the object store, read from the standard AWS variables."""

    endpoint: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """The settings the AWS variables in ``env`` (this process's by default) describe."""
        env = os.environ if env is None else env
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

    def __repr__(self) -> str:
        # Settings end up in tracebacks and logs; the keys must not.
        return f"S3Settings(endpoint={self.endpoint!r}, region={self.region!r})"


def s3_filesystem(settings: S3Settings, bucket: str) -> Any:
    """A ``pyarrow.fs.S3FileSystem`` for ``settings``, with short timeouts and few retries."""
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


def check_bucket(filesystem: Any, location: Any, settings: S3Settings, remedy: str) -> None:
    """Raise unless the bucket of ``location`` exists and answers to these credentials.

    Args:
        filesystem: from :func:`s3_filesystem`.
        location: where the caller means to read or write (a StorageLocation in S3).
        settings: for the messages.
        remedy: what to do about a missing bucket, ending its message (``create it, or …``).

    Raises:
        ObjectStoreMissing: no such bucket.
        ObjectStoreAuthFailed: the credentials were refused.
        ObjectStoreUnreachable: no answer, or an error from the store.
    """
    from pyarrow.fs import FileType

    bucket = str(location.bucket)
    info = call_object_store(lambda: filesystem.get_file_info(bucket), settings, f"bucket {bucket}")
    if info.type == FileType.NotFound:
        raise ObjectStoreMissing(f"bucket {bucket!r} does not exist at {settings.where}; {remedy}")


def call_object_store(call: Callable[[], T], settings: S3Settings, what: str) -> T:
    """Run one pyarrow S3 call; turn its OSError into an :class:`ObjectStoreError` naming ``what``."""
    try:
        return call()
    except OSError as exc:
        raise object_store_error(str(exc), settings, what) from None


def object_store_error(message: str, settings: S3Settings, what: str) -> ObjectStoreError:
    """The :class:`ObjectStoreError` an S3 error message (pyarrow's ``OSError`` text) amounts to."""
    first_line = message.strip().splitlines()[0] if message.strip() else "no details"
    if "NETWORK_CONNECTION" in message or "curlCode" in message:
        return ObjectStoreUnreachable(f"cannot reach the object store at {settings.where} ({first_line}); check "
                                      "AWS_ENDPOINT_URL and the network")
    if any(code in message for code in ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH",
                                         "EXPIRED_TOKEN", "AccessDenied", "InvalidAccessKeyId", "Forbidden")):
        return ObjectStoreAuthFailed(f"the object store at {settings.where} refused access to {what}: check "
                                     f"{CREDENTIAL_VARIABLES} and the bucket's permissions ({first_line})")
    if "NO_SUCH_BUCKET" in message:
        return ObjectStoreMissing(f"{what}: the bucket does not exist at {settings.where} ({first_line})")
    return ObjectStoreUnreachable(f"the object store at {settings.where} failed on {what}: {first_line}")


def _bucket_region(settings: S3Settings, bucket: str) -> str:
    if settings.endpoint:
        return DEFAULT_REGION
    from pyarrow import fs

    try:
        return fs.resolve_s3_region(bucket)
    except OSError:  # unknown here; the request itself then says what is wrong
        return DEFAULT_REGION
