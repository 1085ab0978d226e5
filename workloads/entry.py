"""How a workload's entry point runs and ends: on the job's Ray cluster, with one exit status per outcome.

Every entry point (``python -m workloads.vision``, ``workloads.vision.preprocess``,
``workloads.vision.inference.predict``, ``workloads.hf_vit``, ``workloads.hello``) hands its
work to :func:`workload_main`, which turns what the work raised into the exit status and one
``error: ...`` line on stderr:

- 0: the work was done;
- 1: a stage failed: the work raised one of the errors its entry point names as failures
  (training diverged, a dataset or checkpoint a stage needs is missing, ...);
- 2: bad input: parameters that are not valid (:class:`jobs.errors.BadInput`, which
  :func:`workloads.params.read_params` raises), data that cannot be read as asked (the errors
  the entry point names as bad input), or object storage that cannot be used
  (``rayjobs_agent.s3_access.ObjectStoreError``: a missing bucket, refused credentials, an endpoint
  that does not answer).

The statuses are :class:`jobs.errors.ExitCode`'s, the ``rayjobs`` command's own. Any other error is a bug: the program ends with its traceback, and exit status 1.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

from rayjobs_agent.s3_access import ObjectStoreError
from jobs.errors import BadInput, ExitCode
from jobs.infra.ray_env import prepare_ray_env

__all__ = ["BadInput", "ExitCode", "on_cluster", "workload_main"]

T = TypeVar("T")


def workload_main(work: Callable[[], object], failures: tuple[type[BaseException], ...] = (),
                  bad_input: tuple[type[BaseException], ...] = ()) -> int:
    """Call ``work()`` and return the entry point's exit status (see the module's docstring).

    ``failures`` are the errors that mean a stage failed (1); ``bad_input`` the errors, besides
    :class:`BadInput` and ``ObjectStoreError``, that mean the input cannot be used (2).
    Either way the error's message is printed as one ``error:`` line on stderr.
    """
    try:
        work()
    except (BadInput, ObjectStoreError, *bad_input) as exc:
        return _report(exc, ExitCode.BAD_INPUT)
    except failures as exc:
        return _report(exc, ExitCode.FAILED)
    return ExitCode.SUCCEEDED


def _report(exc: BaseException, status: int) -> int:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    return status


def connect_to_cluster() -> None:
    """``ray.init()`` on loopback-safe settings: inside a Ray job RAY_ADDRESS names the job's
    cluster; a workload run by hand starts a local one."""
    prepare_ray_env()  # before Ray is imported, which reads it then
    import ray

    ray.init()


def on_cluster(work: Callable[[], T]) -> T:
    """Connect to the cluster, return ``work()``, and disconnect however it ends."""
    import ray

    connect_to_cluster()
    try:
        return work()
    finally:
        ray.shutdown()
