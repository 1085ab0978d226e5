"""The preprocessed dataset as its manifest describes it: what it holds, read back by the later stages.

Layout under ``data.output_dir`` (a local folder or an S3 prefix)::

    train/part-00000.parquet ...   one row group of ``rows_per_file`` rows per file
    val/part-00000.parquet ...
    _manifest.json                 classes, counts, skipped, fingerprint, files

Each row is ``image`` (JPEG bytes, RGB, image_size × image_size; or, for MNIST
and CIFAR-10, the raw uint8 H×W×C array), ``label``, ``class_name``, ``split`` and
``path`` (where the image came from). The manifest's ``layout`` says which.

A folder without a manifest is not a dataset. The preprocess stage writes the dataset
(:mod:`workloads.vision.preprocess.writing`); training reads its rows with
:mod:`workloads.vision.reading.torch_dataset` (PyTorch) or
:mod:`workloads.vision.reading.ray_datasets` (Ray Data).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from workloads import storage
from workloads.storage import StoragePath
from workloads.vision.errors import DataSourceError
from workloads.vision.images import ImageLayout

MANIFEST_NAME = "_manifest.json"


@dataclass
class DatasetInfo:
    """What the preprocess stage produced (or found already produced)."""

    root: StoragePath
    classes: list[str]
    counts: dict[str, int]
    image_size: int
    skipped: dict[str, int] = field(default_factory=dict)
    reused: bool = False
    layout: ImageLayout | None = None

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = ImageLayout.photos(self.image_size)


def load_dataset_info(root: StoragePath | str) -> DatasetInfo:
    """Read ``<root>/_manifest.json`` written by the preprocess stage (``root`` local or in S3).

    ``reused`` is False: it describes a preprocess run, not a dataset on disk.
    """
    root = storage.storage_path(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise DataSourceError(
            f"no preprocessed dataset at {str(root)!r} ({MANIFEST_NAME} is missing or unreadable): run the "
            "'preprocess' stage first, or point workload.data.output_dir at the folder it wrote"
        )
    return info_from_manifest(root, manifest, reused=False)


def read_manifest(root: StoragePath) -> dict | None:
    """The manifest of the dataset at ``root``, or None when there is no readable one."""
    try:
        manifest = json.loads(storage.read_text(root / MANIFEST_NAME))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "classes" in manifest and "counts" in manifest else None


def manifest_intact(root: StoragePath, manifest: dict) -> bool:
    """True when every part file the manifest lists is there with its recorded size."""
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return False
    for entry in files:
        try:
            if storage.file_size(root / entry["path"]) != entry["bytes"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def info_from_manifest(root: StoragePath, manifest: dict, *, reused: bool) -> DatasetInfo:
    """The :class:`DatasetInfo` a manifest describes."""
    return DatasetInfo(
        root=root,
        classes=list(manifest["classes"]),
        counts={split: int(n) for split, n in manifest["counts"].items()},
        image_size=int(manifest["image_size"]),
        skipped={reason: int(n) for reason, n in manifest.get("skipped", {}).items()},
        reused=reused,
        layout=ImageLayout.from_manifest(manifest),
    )
