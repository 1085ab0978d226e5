"""Storage locations and S3 for the client: the job side's storage seam, re-exported.

One parser and one type (:class:`StorageLocation`: a local folder or ``s3://bucket/prefix``) serve the
spec's checks, the run commands, packaging, the workloads and the run record's keeper. They live with
the keeper (``workloads/rayjobs_observe/storage_location.py`` and ``s3_access.py``), which is shipped
alone to the cluster and must stay standard library only. ``jobs`` imports them as it imports
``masking.py``; ``runner`` and ``workloads`` import them from here.
"""

from __future__ import annotations

from workloads.rayjobs_observe.s3_access import (ObjectStoreAuthFailed, ObjectStoreError, ObjectStoreMissing,
                                                 ObjectStoreUnreachable, S3Settings, call_object_store, check_bucket,
                                                 s3_filesystem)
from workloads.rayjobs_observe.storage_location import StorageLocation, uri_scheme

__all__ = ["ObjectStoreAuthFailed", "ObjectStoreError", "ObjectStoreMissing", "ObjectStoreUnreachable", "S3Settings",
           "StorageLocation", "call_object_store", "check_bucket", "s3_filesystem", "uri_scheme"]
