"""``ingest: ray_data``: the Parquet dataset as Ray Datasets handed to the trainer.

Decoding and augmentation run as Ray Data ``map_batches`` tasks on CPU workers,
separately from the training processes, so data preparation scales with the
cluster's CPUs rather than with the trainers'. The pipeline is lazy: every epoch
runs it again, so random crops and flips are new each epoch.
"""

from __future__ import annotations

import os

import numpy as np
import ray
import ray.train

from workloads import storage
from workloads.storage import StoragePath
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout, augment_batch, decode_batch

# Rows per map_batches call: large enough to amortize the task overhead, small
# enough that a batch of 224-px images stays a few tens of MB in the object store.
TRANSFORM_BATCH_ROWS = 128


def read_parquet_on_no_cpu(paths, columns: list[str], max_concurrent_reads: int | None = None, filesystem=None):
    """``ray.data.read_parquet`` whose tasks reserve no CPU, so it runs beside actors holding every CPU.

    Reading is I/O, light next to decoding or a model. Ray Data's newer Parquet
    reader first lists files in a task that always asks for 1 CPU, which never
    starts while training workers or model actors hold every CPU of a small
    cluster; the classic reader plans on the driver and honours ``num_cpus``.
    ``max_concurrent_reads`` bounds the read tasks in flight (unbounded by default).
    ``filesystem``: the ``pyarrow.fs`` filesystem of ``paths`` (None: local paths).
    """
    context = ray.data.DataContext.get_current()
    previous = context.use_datasource_v2
    context.use_datasource_v2 = False
    try:
        options = {"filesystem": filesystem} if filesystem is not None else {}
        return ray.data.read_parquet(paths, columns=columns, num_cpus=0, concurrency=max_concurrent_reads, **options)
    finally:
        context.use_datasource_v2 = previous


def decode_and_augment(batch: dict[str, np.ndarray], layout: dict, augment: str) -> dict[str, np.ndarray]:
    """``map_batches`` function: stored images → uint8 ``N×C×H×W`` (augmented unless ``augment`` is 'none')."""
    import torch

    images = decode_batch(batch["image"], ImageLayout.from_manifest({"layout": layout}))
    if augment != "none":
        # Each task process would otherwise start from torch's fixed default seed, and
        # all of them would draw the same crops.
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        images = augment_batch(images, augment, generator)  # type: ignore[arg-type]
    return {"image": images.numpy(), "label": batch["label"].astype(np.int64)}


def training_datasets(dataset_root: StoragePath, layout: ImageLayout, cfg: TrainConfig) -> dict:
    """``{"train": ..., "val": ...}`` Ray Datasets of decoded (and, for train, augmented) batches."""
    # Ray Data's redrawn progress bars turn into thousands of lines in a job log; the
    # training loop prints its own progress.
    ray.data.DataContext.get_current().enable_progress_bars = False
    transform = {"batch_size": TRANSFORM_BATCH_ROWS, "batch_format": "numpy", "num_cpus": cfg.data_cpus}

    def read(split: str):
        path, filesystem = storage.arrow_path(dataset_root / split)
        return read_parquet_on_no_cpu(path, columns=["image", "label"], filesystem=filesystem)

    train = read("train").randomize_block_order().map_batches(
        decode_and_augment, fn_kwargs={"layout": layout.to_dict(), "augment": layout.resolve_augment(cfg.augment)},
        **transform)
    val = read("val").map_batches(decode_and_augment, fn_kwargs={"layout": layout.to_dict(), "augment": "none"},
                                  **transform)
    return {"train": train, "val": val}


class ExactValidationDataConfig(ray.train.DataConfig):
    """Ray Train's data config, except that the validation set is split without dropping rows.

    The default splits every dataset into equal shares, which may drop up to
    ``world_size - 1`` rows: right for training (every rank must take the same
    number of steps), wrong for validation, whose counts are summed across ranks
    and must cover each row exactly once.
    """

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        """Split ``train`` as Ray Train does; split ``val`` into unequal shares that cover every row."""
        equal = {name: ds for name, ds in datasets.items() if name != "val"}
        output = super().configure(equal, world_size, worker_handles, worker_node_ids, **kwargs)
        if "val" in datasets:
            val = datasets["val"]
            if val.name is None:
                val.set_name("val")
            val = val.copy(val)
            val.context.execution_options = self._resolve_execution_options("val")
            for rank, shard in enumerate(val.streaming_split(world_size, equal=False)):
                output[rank]["val"] = shard
        return output


def data_cpu_shortfall(cfg: TrainConfig) -> str | None:
    """Why the decode tasks could never start on this cluster as it is now, or None when they can."""
    total = float(ray.cluster_resources().get("CPU", 0))
    left = total - cfg.num_workers * cfg.cpus_per_worker
    if cfg.data_cpus <= left:
        return None
    return (f"ingest ray_data runs its decode tasks on {cfg.data_cpus:g} CPU each, but the cluster has {total:g} CPUs "
            f"and the {cfg.num_workers} training workers hold {cfg.num_workers * cfg.cpus_per_worker:g} of them, "
            f"leaving {max(left, 0):g}. Lower train.num_workers or train.cpus_per_worker, add CPUs, or set "
            "train.data_cpus=0 to let the decode tasks share the workers' CPUs.")
