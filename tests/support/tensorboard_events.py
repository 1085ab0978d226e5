"""Scalars of a TensorBoard event file, read by TensorBoard's own loader (the reader ``tensorboard --logdir`` uses)."""

from __future__ import annotations

from pathlib import Path


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the event files of ``folder``, as (step, value) pairs in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}
