"""The vision workload's errors that end a stage, and the exit status of its entry points.

``python -m workloads.vision`` and ``python -m workloads.vision.preprocess`` exit with

- 0 when every stage did its work;
- 1 when a stage failed (training diverged, inference failed, the preprocessed dataset a
  later stage needs is missing);
- 2 for bad input: the data named in ``workload.data`` cannot be read as asked
  (:class:`DataSourceError`; the message names the data and what was looked for),
  the parameters themselves are invalid, or the object storage named by
  ``data.output_dir`` or ``storage_path`` cannot be used: a missing bucket, refused
  credentials or an endpoint that does not answer (``jobs.object_store.ObjectStoreError``;
  the message names the field, the path and the AWS variables to check). Storage is
  checked before the first stage starts; a storage failure inside the training workers
  is a failed stage (1).
"""

from __future__ import annotations

STAGE_FAILED_EXIT_CODE = 1
BAD_INPUT_EXIT_CODE = 2


class DataSourceError(ValueError):
    """The configured data cannot be read as asked (missing root, unknown class, ...)."""


class DatasetMissingError(RuntimeError):
    """The Parquet split a stage needs is not on disk."""
