"""How a training worker gets its batches: a DataLoader over Parquet row groups (``ingest: torch``)
or its shards of Ray Datasets (``ingest: ray_data``).

Both yield ``(uint8 images N×C×H×W, int64 labels)`` and know how many optimizer steps an epoch has.
Training never yields a batch of one image: batch norm in training mode needs more than one value
per channel, and ResNet's last block sees one value per channel and image, so such a batch would
crash the epoch. Each rank drops that one image instead; evaluation keeps every image.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Iterator

from workloads.storage import StoragePath
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout


def skipped_images_line(skipped: int, per_worker_batch: int, world_size: int) -> str | None:
    """The one line that says how many training images an epoch leaves out, or None when it trains on all."""
    from workloads.vision.reading.torch_dataset import MIN_TRAINING_BATCH

    if skipped <= 0:
        return None
    return (f"Training skips {skipped} image(s) an epoch: the last batch of each of the {world_size} worker(s) "
            f"would hold fewer than {MIN_TRAINING_BATCH} images (batch {per_worker_batch} per worker), too few for "
            "batch norm to train on; which images are left out changes every epoch, and evaluation sees every image.")


def _announce(line: str | None, rank: int) -> None:
    # Written to stdout directly: Ray Train V2 doubles print() in workers (see training.loop.say).
    if line and rank == 0:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def effective_loader_workers(cfg: TrainConfig) -> int:
    """DataLoader processes per training worker: ``loader_workers``, but never more than the CPUs reserved beside
    the training process itself.

    On 2 cores with 2 one-CPU workers, two loader processes each made six busy
    processes; DDP's all-reduce then waited on whichever rank was descheduled, and
    training ran at 66-80 images/s instead of 114-119 with decoding done inline.
    """
    if cfg.use_gpu:
        return cfg.loader_workers  # the GPU does the model's work; the reserved CPUs are the loader's
    return min(cfg.loader_workers, cfg.cpu_threads() - 1)


class TorchBatches:
    """``ingest: torch``: Parquet row groups through a DataLoader prepared by Ray Train.

    With ``decode_on_device`` the loader only reads the JPEG files; they are decoded and augmented on
    ``device`` as each batch is taken (:func:`workloads.vision.images.decode_jpegs_on`).
    """

    def __init__(self, dataset_root: StoragePath, cfg: TrainConfig, layout: ImageLayout, rank: int, world_size: int,
                 device, decode_on_device: bool = False):
        import ray.train.torch
        from torch.utils.data import DataLoader

        from workloads.vision.reading.torch_dataset import (AugmentingCollate, EncodedCollate, GroupedShardSampler,
                                                            ParquetImageDataset, split_files)

        on_gpu = device.type == "cuda"
        per_worker_batch = max(1, cfg.global_batch // world_size)
        train_set = ParquetImageDataset(split_files(dataset_root, "train"), layout, encoded=decode_on_device)
        val_set = ParquetImageDataset(split_files(dataset_root, "val"), layout, encoded=decode_on_device)
        self.train_sampler = GroupedShardSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                                 seed=cfg.seed, pad=True, batch_size=per_worker_batch)
        # Unpadded shards: each validation row is seen by exactly one rank, so the
        # summed counts are the exact full-split figures.
        val_sampler = GroupedShardSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False, pad=False)
        loader_workers = effective_loader_workers(cfg)
        options: dict[str, Any] = {"num_workers": loader_workers, "pin_memory": on_gpu}
        if loader_workers > 0:
            options["persistent_workers"] = True
        if loader_workers > 0 and on_gpu:
            options["prefetch_factor"] = 4  # batches each loader process keeps ready: a GPU step is short
        self.augment = layout.resolve_augment(cfg.augment)
        self.layout, self.device, self.decode_on_device = layout, device, decode_on_device
        train_collate = EncodedCollate() if decode_on_device else AugmentingCollate(self.augment)
        val_collate = EncodedCollate() if decode_on_device else AugmentingCollate("none")
        # Ray Train moves every tensor of a batch to the device; nvJPEG reads the files from the CPU.
        self.train_loader = ray.train.torch.prepare_data_loader(DataLoader(
            train_set, batch_size=per_worker_batch, sampler=self.train_sampler, drop_last=False,
            collate_fn=train_collate, **options), move_to_device=not decode_on_device)
        self.val_loader = ray.train.torch.prepare_data_loader(DataLoader(
            val_set, batch_size=per_worker_batch, sampler=val_sampler, collate_fn=val_collate, **options),
            move_to_device=not decode_on_device)
        self.steps_per_epoch = len(self.train_loader)
        self.world_size = world_size
        self.skipped_per_epoch = self.train_sampler.left_out * world_size
        _announce(skipped_images_line(self.skipped_per_epoch, per_worker_batch, world_size), rank)

    def train_epoch(self, epoch: int) -> Iterator:
        """This rank's shuffled training batches of epoch index ``epoch``."""
        if self.world_size > 1:
            self.train_loader.sampler.set_epoch(epoch)
        if self.decode_on_device:
            return self._decoded(self.train_loader, self.augment)
        return iter(self.train_loader)

    def val_batches(self) -> Iterator:
        """This rank's share of the validation split, every row on exactly one rank."""
        if self.decode_on_device:
            return self._decoded(self.val_loader, "none")
        return iter(self.val_loader)

    def _decoded(self, loader, augment: str) -> Iterator:
        from workloads.vision.images import augment_batch, decode_jpegs_on

        for encoded, labels in loader:
            images = augment_batch(decode_jpegs_on(self.device, encoded.files(), self.layout), augment)
            yield images, labels.to(self.device, non_blocking=True)


class RayDataBatches:
    """``ingest: ray_data``: this worker's shards of the Ray Datasets given to the trainer."""

    def __init__(self, train_rows: int, cfg: TrainConfig, world_size: int, device):
        import ray.train
        import torch

        from workloads.vision.reading.torch_dataset import trained_rows

        self.per_worker_batch = max(1, cfg.global_batch // world_size)
        self.prefetch = cfg.prefetch_batches
        self.device = device
        self.train_shard = ray.train.get_dataset_shard("train")
        self.val_shard = ray.train.get_dataset_shard("val")
        self.dtypes = {"image": torch.uint8, "label": torch.int64}
        # The trainer splits the train set into equal shares, so every rank runs the same number of steps.
        rows_per_rank = train_rows // world_size
        trained = trained_rows(rows_per_rank, self.per_worker_batch)
        self.steps_per_epoch = max(1, math.ceil(trained / self.per_worker_batch))
        self.skipped_per_epoch = (rows_per_rank - trained) * world_size
        _announce(skipped_images_line(self.skipped_per_epoch, self.per_worker_batch, world_size),
                  ray.train.get_context().get_world_rank())

    def _batches(self, shard, shuffle: bool) -> Iterator:
        for batch in shard.iter_torch_batches(
            batch_size=self.per_worker_batch, dtypes=self.dtypes, device=self.device,
            prefetch_batches=self.prefetch, drop_last=False,
            # Blocks arrive in a new order every epoch; the buffer mixes rows across them.
            local_shuffle_buffer_size=4 * self.per_worker_batch if shuffle else None,
        ):
            yield batch["image"], batch["label"]

    def train_epoch(self, epoch: int) -> Iterator:
        """This rank's training batches; Ray Data reorders the blocks every epoch. Only the last batch can be
        short, and one too small to train on is left out."""
        from workloads.vision.reading.torch_dataset import MIN_TRAINING_BATCH

        return (batch for batch in self._batches(self.train_shard, shuffle=True)
                if batch[1].shape[0] >= MIN_TRAINING_BATCH)

    def val_batches(self) -> Iterator:
        """This rank's validation batches."""
        return self._batches(self.val_shard, shuffle=False)
