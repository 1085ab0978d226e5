"""Reading the preprocessed Parquet images from PyTorch.

The preprocess stage writes images (JPEG bytes or raw arrays) in row groups of a few hundred rows. A
row group is the smallest unit Parquet can read, so the dataset reads one group
at a time and keeps the last few in memory; the samplers below visit indices
group by group so that a group is read once per epoch rather than once per image.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import OrderedDict
from typing import Iterator, NamedTuple, Sequence

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from workloads import storage
from workloads.storage import StoragePath
from workloads.vision.errors import DatasetMissingError
from workloads.vision.images import Augment, ImageLayout, augment_batch, decode_one

# The smallest batch batch norm can train on: one image gives one value per channel in ResNet's last block.
MIN_TRAINING_BATCH = 2


def trained_rows(rows: int, per_worker_batch: int) -> int:
    """How many of a rank's ``rows`` an epoch trains on: all of them, unless its last batch would be too small
    to train on, which is then left out."""
    last = rows % per_worker_batch
    return rows - last if 0 < last < MIN_TRAINING_BATCH else rows


def split_files(dataset_root: StoragePath, split: str) -> list[StoragePath]:
    """Return the sorted Parquet files of ``split`` ("train" or "val") under ``dataset_root`` (local or in S3)."""
    split_dir = dataset_root / split
    files = storage.list_files(split_dir, ".parquet")
    if not files:
        raise DatasetMissingError(
            f"No Parquet files in {split_dir}: the {split!r} split of the dataset is missing. "
            "Run the preprocess stage first (stages: [preprocess]) or point data.output_dir at an existing dataset."
        )
    return files


class AugmentingCollate:
    """``collate_fn`` that stacks decoded images and applies the training augmentation.

    Running it as the collate function puts the augmentation in the DataLoader's
    worker processes when there are any, and does one batched call instead of one per image.
    """

    def __init__(self, augment: Augment = "none"):
        self.augment = augment

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([image for image, _ in samples])
        labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
        return augment_batch(images, self.augment), labels


class EncodedFiles(NamedTuple):
    """A batch's JPEG files, end to end in one uint8 tensor, and each file's length in bytes.

    One tensor, not one per file: a tensor leaves a loader process through a shared-memory segment of its own,
    and 256 segments took ten times as long to hand over as one (``tests/test_device_decode.py`` holds the
    count; ``docs/benchmarks.md``, the GPU path, the figures).
    """

    joined: torch.Tensor
    lengths: torch.Tensor

    def files(self) -> list[torch.Tensor]:
        """Each file as a 1-D view into :attr:`joined`, in the batch's order, as nvJPEG takes them."""
        return list(torch.split(self.joined, self.lengths.tolist())) if len(self.lengths) else []


class EncodedCollate:
    """``collate_fn`` for decoding on the device: the batch's JPEG files (:class:`EncodedFiles`) and the labels.

    The files are a tenth of the pixels' bytes; they stay on the CPU, where nvJPEG reads them from.
    """

    def __call__(self, samples: list[tuple[bytes, int]]) -> tuple[EncodedFiles, torch.Tensor]:
        joined = bytearray().join(data for data, _ in samples)  # one copy, writable: torch wraps it as it is
        files = EncodedFiles(torch.frombuffer(joined, dtype=torch.uint8) if joined
                             else torch.zeros(0, dtype=torch.uint8),
                             torch.tensor([len(data) for data, _ in samples], dtype=torch.int64))
        return files, torch.tensor([label for _, label in samples], dtype=torch.int64)


class ParquetImageDataset(Dataset):
    """Map-style dataset over Parquet files with ``image`` and ``label`` columns.

    Items are ``(uint8 tensor C×H×W, label)``, or ``(stored bytes, label)`` with ``encoded``; augmentation and normalization are
    batch operations done later (see :mod:`workloads.vision.images`). Only metadata
    is read up front; rows are read one row group at a time when an index in that
    group is first asked for, and the ``cache_groups`` most recently used groups are kept.
    """

    def __init__(self, files: Sequence[StoragePath | str], layout: ImageLayout, cache_groups: int = 8,
                 encoded: bool = False):
        self.files = [storage.storage_path(f) for f in files]
        self.layout = layout
        self.encoded = encoded  # items are the stored bytes, for a collate that leaves decoding to the device
        self.cache_groups = max(1, cache_groups)
        # (file index, row group index) of every group, and the global index of its first row.
        self.groups: list[tuple[int, int]] = []
        self.group_starts: list[int] = []
        total = 0
        for file_index, path in enumerate(self.files):
            metadata = pq.read_metadata(storage.open_input_file(path))
            for group_index in range(metadata.num_row_groups):
                rows = metadata.row_group(group_index).num_rows
                if rows == 0:
                    continue
                self.groups.append((file_index, group_index))
                self.group_starts.append(total)
                total += rows
        self._length = total
        self._cache: OrderedDict[int, tuple[list[bytes], list[int]]] = OrderedDict()
        self._open_files: dict[int, pq.ParquetFile] = {}
        self.group_reads = 0  # how many times a row group was read from disk (for tests and tuning)

    def __len__(self) -> int:
        return self._length

    def __getstate__(self):
        # Open file handles and cached rows stay behind when the dataset is sent to
        # a DataLoader worker process or another Ray worker.
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        state["_open_files"] = {}
        return state

    def group_of(self, index: int) -> int:
        """Return the position in ``self.groups`` of the row group holding ``index``."""
        return bisect.bisect_right(self.group_starts, index) - 1

    def group_ranges(self) -> list[range]:
        """Global row indices of each row group, in file order."""
        ends = self.group_starts[1:] + [self._length]
        return [range(start, end) for start, end in zip(self.group_starts, ends)]

    def _rows_of_group(self, group: int) -> tuple[list[bytes], list[int]]:
        cached = self._cache.get(group)
        if cached is not None:
            self._cache.move_to_end(group)
            return cached
        file_index, group_index = self.groups[group]
        parquet_file = self._open_files.get(file_index)
        if parquet_file is None:
            source = storage.open_input_file(self.files[file_index])
            parquet_file = self._open_files[file_index] = pq.ParquetFile(source)
        table = parquet_file.read_row_group(group_index, columns=["image", "label"])
        rows = (table.column("image").to_pylist(), table.column("label").to_pylist())
        self.group_reads += 1
        self._cache[group] = rows
        while len(self._cache) > self.cache_groups:
            self._cache.popitem(last=False)
        return rows

    def raw(self, index: int) -> tuple[bytes, int]:
        """Return the undecoded image bytes and the label of row ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for a dataset of {self._length} rows")
        group = self.group_of(index)
        images, labels = self._rows_of_group(group)
        offset = index - self.group_starts[group]
        return images[offset], int(labels[offset])

    def __getitem__(self, index: int) -> tuple[torch.Tensor | bytes, int]:
        data, label = self.raw(index)
        if self.encoded:
            return data, label
        return torch.from_numpy(decode_one(data, self.layout)).permute(2, 0, 1), label

    def labels(self) -> list[int]:
        """All labels in index order (reads only the label column)."""
        out: list[int] = []
        for path in self.files:
            out.extend(pq.read_table(storage.open_input_file(path), columns=["label"]).column("label").to_pylist())
        return out


class GroupedShardSampler(DistributedSampler):
    """A ``DistributedSampler`` that keeps row-group locality.

    Each rank gets a contiguous share of an epoch's index order, so it reads only
    its own row groups. With ``shuffle``, the order is: row groups shuffled, then
    taken ``window`` groups at a time with the rows of each window shuffled
    together, so a batch mixes several groups (and so several classes, even if a
    group holds one class) while at most ``window`` groups are in use at once.

    ``pad=True`` repeats indices so every rank gets the same number (DDP steps must
    match); ``pad=False`` gives each rank exactly its own rows, for exact evaluation.
    With ``pad=True`` and a ``batch_size``, a share whose last batch would hold a single row
    leaves that row out (``left_out``), since batch norm cannot train on one image.
    """

    def __init__(
        self,
        dataset: ParquetImageDataset,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 4,
        pad: bool = True,
        batch_size: int | None = None,
    ):
        if num_replicas is None or rank is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                num_replicas = torch.distributed.get_world_size() if num_replicas is None else num_replicas
                rank = torch.distributed.get_rank() if rank is None else rank
            else:
                num_replicas, rank = num_replicas or 1, rank or 0
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.window = max(1, window)
        self.pad = pad
        total = len(dataset)
        self.left_out = 0
        if pad:
            # Every rank's padded share; a short last batch of it is left out from the end of the share.
            self.share = math.ceil(total / self.num_replicas) if total else 0
            self.num_samples = self.share
            if batch_size:
                self.num_samples = trained_rows(self.share, batch_size)
                self.left_out = self.share - self.num_samples
        else:
            start, end = self._share_bounds(total)
            self.share = self.num_samples = end - start
        self.total_size = self.share * self.num_replicas if pad else total

    def _share_bounds(self, total: int) -> tuple[int, int]:
        base, extra = divmod(total, self.num_replicas)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def epoch_order(self) -> list[int]:
        """The global index order of the current epoch, before it is split between ranks."""
        ranges = self.dataset.group_ranges()
        if not self.shuffle:
            return [i for r in ranges for i in r]
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        rng.shuffle(ranges)
        order: list[int] = []
        for first in range(0, len(ranges), self.window):
            chunk = [i for r in ranges[first:first + self.window] for i in r]
            rng.shuffle(chunk)
            order.extend(chunk)
        return order

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        if self.pad:
            per_rank = self.share
            needed = per_rank * self.num_replicas - len(order)
            while needed > 0 and order:
                order.extend(order[:needed])
                needed = per_rank * self.num_replicas - len(order)
            mine = order[self.rank * per_rank:self.rank * per_rank + self.num_samples]
        else:
            start, end = self._share_bounds(len(order))
            mine = order[start:end]
        return iter(mine)

    def __len__(self) -> int:
        return self.num_samples
