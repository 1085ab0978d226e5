"""The vision workload's errors that end a stage, and what its entry points make of them.

``python -m workloads.vision``, ``python -m workloads.vision.preprocess`` and
``python -m workloads.vision.inference.predict`` end through :func:`workloads.entry.workload_main`:

- exit status 1 when a stage failed: training diverged (``TrainingError``), inference failed
  (:class:`InferenceError`), or the preprocessed dataset a later stage needs is missing
  (:class:`DatasetMissingError`);
- exit status 2 for bad input: the data named in ``workload.data`` cannot be read as asked
  (:class:`DataSourceError`; the message names the data and what was looked for), the
  parameters themselves are invalid, or the object storage named by ``data.output_dir`` or
  ``storage_path`` cannot be used: a missing bucket, refused credentials or an endpoint that
  does not answer (``rayjobs_agent.s3_access.ObjectStoreError``; the message names the field, the
  path and the AWS variables to check). Storage is checked before the first stage starts; a
  storage failure inside the training workers is a failed stage (1).
"""

from __future__ import annotations


class DataSourceError(ValueError):
    """The configured data cannot be read as asked (missing root, unknown class, ...)."""


class DatasetMissingError(RuntimeError):
    """The Parquet split a stage needs is not on disk."""


class InferenceError(RuntimeError):
    """Inference cannot run; the message says why."""
