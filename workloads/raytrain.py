"""What the training workloads share about driving Ray Train: the run's configuration and its errors."""

from __future__ import annotations

from pathlib import Path


def run_config(run_dir: Path, num_to_keep: int, score_attribute: str, max_failures: int):
    """``RunConfig`` of a run kept at ``run_dir`` (``<storage_path>/<run_name>``): the best ``num_to_keep``
    checkpoints by ``score_attribute`` (higher is better), and ``max_failures`` worker failures survived."""
    import ray.train

    return ray.train.RunConfig(
        name=run_dir.name,
        storage_path=str(run_dir.parent),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=num_to_keep, checkpoint_score_attribute=score_attribute,
                                                     checkpoint_score_order="max"),
        failure_config=ray.train.FailureConfig(max_failures=max_failures),
    )


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters ('' for an empty message)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


def root_cause(exc: BaseException) -> str:
    """The innermost error behind Ray Train's wrappers, as ``Type: last line of its message``."""
    seen = set()
    while True:
        inner = exc.__cause__ or getattr(exc, "cause", None) or exc.__context__
        nested = getattr(exc, "worker_failures", None)
        if isinstance(nested, dict) and nested:
            inner = next(iter(nested.values()))
        if inner is None or id(inner) in seen or not isinstance(inner, BaseException):
            break
        seen.add(id(exc))
        exc = inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"
