"""The work of one image in the preprocess stage: what the driver sends, what a task returns.

The driver turns each :class:`~workloads.vision.sources.listing.SourceItem` into a payload
with :class:`PayloadReader`: a file path (the task reads the file), the file's bytes,
the bytes of a Parquet row, or the seed of a generated image. A task turns each
payload into the square JPEG the dataset holds with :func:`encode_payload`, or into
the reason the image is skipped; a bad file never fails the task.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from workloads.vision.images import square_jpeg_from_bytes, square_jpeg_from_image
from workloads.vision.sources.listing import SourceItem
from workloads.vision.sources.synthetic import render_synthetic


@dataclass(frozen=True)
class Skip:
    """An item the driver could not read; ``reason`` is counted in the dataset's ``skipped``."""

    reason: str


class PayloadReader:
    """Prepares what a task gets for each item; keeps the last Parquet row group in memory.

    Files go as paths when the cluster is this one node (workers read them, which
    spares the driver and the object store a copy of every input) and as bytes
    otherwise, because other nodes may not see the driver's disk.
    """

    def __init__(self, num_classes: int, ship_file_bytes: bool):
        self.num_classes = num_classes
        self.ship_file_bytes = ship_file_bytes
        self._group_key: tuple | None = None
        self._group_images: list | None = None

    def payload(self, item: SourceItem):
        """The path, bytes or synthetic spec to send to a worker, or a :class:`Skip`."""
        if item.synthetic_seed is not None:
            return ("synthetic", item.label, self.num_classes, item.synthetic_seed)
        if item.file is not None and not self.ship_file_bytes:
            return str(item.file)
        if item.file is not None:
            try:
                return item.file.read_bytes()
            except FileNotFoundError:
                return Skip("missing")
            except OSError:
                return Skip("unreadable")
        key = (item.shard, item.row_group)
        if key != self._group_key:
            table = pq.ParquetFile(item.shard).read_row_group(item.row_group, columns=["image"])
            self._group_images = table.column("image").to_pylist()
            self._group_key = key
        cell = self._group_images[item.row]
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        return data if data else Skip("missing")


def encode_payload(payload, size: int, quality: int) -> tuple[bytes | None, str | None]:
    """(jpeg, None) on success, (None, reason) for an input that must be skipped."""
    try:
        if isinstance(payload, tuple):
            _, label, num_classes, seed = payload
            return square_jpeg_from_image(render_synthetic(label, num_classes, seed, size), size, quality), None
        if isinstance(payload, str):
            try:
                payload = Path(payload).read_bytes()
            except FileNotFoundError:
                return None, "missing"
            except OSError:
                return None, "unreadable"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EXIF/ICC chatter from odd files is not actionable
            return square_jpeg_from_bytes(payload, size, quality), None
    except UnidentifiedImageError:
        return None, "not_an_image"
    except Image.DecompressionBombError:
        return None, "too_large"
    except Exception:  # noqa: BLE001 - any decoder failure means a damaged file, never a crashed job
        return None, "corrupt"


def encode_chunk(payloads: list, size: int, quality: int) -> list[tuple[bytes | None, str | None]]:
    """:func:`encode_payload` over a task's chunk of payloads."""
    return [encode_payload(p, size, quality) for p in payloads]
