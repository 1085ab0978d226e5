"""How a training worker gets its batches: a DataLoader over Parquet row groups (``ingest: torch``)
or its shards of Ray Datasets (``ingest: ray_data``).

Both yield ``(uint8 images N×C×H×W, int64 labels)`` and know how many optimizer steps an epoch has.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from workloads.storage import StoragePath
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout


def effective_loader_workers(cfg: TrainConfig) -> int:
    """DataLoader processes per training worker: ``loader_workers``, but never more than the CPUs reserved beside
    the training process itself.

    On 2 cores with 2 one-CPU workers, two loader processes each made six busy
    processes; DDP's all-reduce then waited on whichever rank was descheduled, and
    training ran at 66-80 images/s instead of 114-119 with decoding done inline.
    """
    if cfg.use_gpu:
        return cfg.loader_workers  # the GPU does the model's work; the reserved CPUs are the loader's
    return min(cfg.loader_workers, max(0, int(cfg.cpus_per_worker) - 1))


class TorchBatches:
    """``ingest: torch``: Parquet row groups through a DataLoader prepared by Ray Train."""

    def __init__(self, dataset_root: StoragePath, cfg: TrainConfig, layout: ImageLayout, rank: int, world_size: int,
                 on_gpu: bool):
        import ray.train.torch
        from torch.utils.data import DataLoader

        from workloads.vision.reading.torch_dataset import (AugmentingCollate, GroupedShardSampler,
                                                            ParquetImageDataset, split_files)

        per_worker_batch = max(1, cfg.batch_size // world_size)
        train_set = ParquetImageDataset(split_files(dataset_root, "train"), layout)
        val_set = ParquetImageDataset(split_files(dataset_root, "val"), layout)
        self.train_sampler = GroupedShardSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                                 seed=cfg.seed, pad=True)
        # Unpadded shards: each validation row is seen by exactly one rank, so the
        # summed counts are the exact full-split figures.
        val_sampler = GroupedShardSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False, pad=False)
        loader_workers = effective_loader_workers(cfg)
        options: dict[str, Any] = {"num_workers": loader_workers, "pin_memory": on_gpu}
        if loader_workers > 0:
            options["persistent_workers"] = True
        augment = layout.resolve_augment(cfg.augment)
        self.train_loader = ray.train.torch.prepare_data_loader(DataLoader(
            train_set, batch_size=per_worker_batch, sampler=self.train_sampler, drop_last=False,
            collate_fn=AugmentingCollate(augment), **options))
        self.val_loader = ray.train.torch.prepare_data_loader(DataLoader(
            val_set, batch_size=per_worker_batch, sampler=val_sampler, collate_fn=AugmentingCollate("none"), **options))
        self.steps_per_epoch = len(self.train_loader)
        self.world_size = world_size

    def train_epoch(self, epoch: int) -> Iterator:
        """This rank's shuffled training batches of epoch index ``epoch``."""
        if self.world_size > 1:
            self.train_loader.sampler.set_epoch(epoch)
        return iter(self.train_loader)

    def val_batches(self) -> Iterator:
        """This rank's share of the validation split, every row on exactly one rank."""
        return iter(self.val_loader)


class RayDataBatches:
    """``ingest: ray_data``: this worker's shards of the Ray Datasets given to the trainer."""

    def __init__(self, train_rows: int, cfg: TrainConfig, world_size: int, device):
        import ray.train
        import torch

        self.per_worker_batch = max(1, cfg.batch_size // world_size)
        self.prefetch = cfg.prefetch_batches
        self.device = device
        self.train_shard = ray.train.get_dataset_shard("train")
        self.val_shard = ray.train.get_dataset_shard("val")
        self.dtypes = {"image": torch.uint8, "label": torch.int64}
        # The trainer splits the train set into equal shares, so every rank runs the same number of steps.
        self.steps_per_epoch = max(1, math.ceil((train_rows // world_size) / self.per_worker_batch))

    def _batches(self, shard, shuffle: bool) -> Iterator:
        for batch in shard.iter_torch_batches(
            batch_size=self.per_worker_batch, dtypes=self.dtypes, device=self.device,
            prefetch_batches=self.prefetch, drop_last=False,
            # Blocks arrive in a new order every epoch; the buffer mixes rows across them.
            local_shuffle_buffer_size=4 * self.per_worker_batch if shuffle else None,
        ):
            yield batch["image"], batch["label"]

    def train_epoch(self, epoch: int) -> Iterator:
        """This rank's training batches; Ray Data reorders the blocks every epoch."""
        return self._batches(self.train_shard, shuffle=True)

    def val_batches(self) -> Iterator:
        """This rank's validation batches."""
        return self._batches(self.val_shard, shuffle=False)
