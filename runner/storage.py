"""Object-store errors as the client's errors: one paragraph and the exit code of their kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rayjobs_agent import s3_access as object_store
from runner.errors import AuthFailed, BadInput, ClusterUnreachable, RayJobsError

T = TypeVar("T")


class StorageUnreachable(ClusterUnreachable):
    """The object store did not answer, or answered with an error of its own."""


class StorageAuthFailed(AuthFailed):
    """The object store refused the credentials (or wanted some)."""


def calling_storage(call: Callable[[], T]) -> T:
    """Run a call to the object store; its error becomes the client's error of the same kind."""
    try:
        return call()
    except object_store.ObjectStoreError as exc:
        raise client_error(exc) from None


def client_error(error: object_store.ObjectStoreError) -> RayJobsError:
    """The client's error for an object-store error: auth refused (7), no bucket (2), or unreachable (4)."""
    if isinstance(error, object_store.ObjectStoreAuthFailed):
        return StorageAuthFailed(str(error))
    if isinstance(error, object_store.ObjectStoreMissing):
        return BadInput(str(error))
    return StorageUnreachable(str(error))
