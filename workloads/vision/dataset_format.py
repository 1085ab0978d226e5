"""The preprocessed dataset on disk: its Parquet schema, its manifest, how it is written and read back.

Layout under ``data.output_dir``::

    train/part-00000.parquet ...   one row group of ``rows_per_file`` rows per file
    val/part-00000.parquet ...
    _manifest.json                 classes, counts, skipped, fingerprint, files

Each row is ``image`` (JPEG bytes, RGB, image_size × image_size; or, for MNIST
and CIFAR-10, the raw uint8 H×W×C array), ``label``, ``class_name``, ``split`` and
``path`` (where the image came from). The manifest's ``layout`` says which.

The manifest's fingerprint covers the settings and a signature of the inputs, so a
run with the same inputs can reuse the dataset. A folder without a manifest is not a
dataset. On local disk a new dataset is built in a hidden sibling folder and renamed
into place (:func:`new_dataset_folder`), so a failed run leaves the previous one
intact. S3 has no rename: the old manifest is deleted first, the parts are written in
place and the manifest last, and ``_writing`` marks a prefix this stage is (or was,
when a run failed) writing, so that the next run may replace it. Training reads the rows back with
:mod:`workloads.vision.dataset` (PyTorch) or :mod:`workloads.vision.ingest` (Ray Data).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import atomic
from workloads import storage
from workloads.storage import ObjectPath, StoragePath
from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.images import ImageLayout

MANIFEST_NAME = "_manifest.json"
WRITING_MARKER = "_writing"
# Bumped whenever the bytes written for the same inputs change, so that datasets
# built by an older version are rebuilt rather than reused.
FORMAT_VERSION = 1

PARQUET_SCHEMA = pa.schema(
    [
        pa.field("image", pa.binary()),
        pa.field("label", pa.int64()),
        pa.field("class_name", pa.string()),
        pa.field("split", pa.string()),
        pa.field("path", pa.string()),
    ]
)


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


# ---------------------------------------------------------------------------
# Manifest and fingerprint


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


def dataset_settings(data: DataConfig, root: Path | None, folders: list[str]) -> dict:
    """The settings that shape the bytes written, as recorded in the manifest and fingerprinted."""
    settings = {
        "format_version": FORMAT_VERSION,
        "source": data.source,
        "root": str(root) if root is not None else None,
        "classes": list(data.classes),
        "folders": folders,
        "max_per_class": data.max_per_class,
        "image_size": data.image_size,
        "val_fraction": data.val_fraction,
        "jpeg_quality": data.jpeg_quality,
        "seed": data.seed,
        "rows_per_file": data.rows_per_file,
    }
    if data.source == "synthetic":
        settings["synthetic_per_class"] = data.synthetic_per_class
    return settings


def dataset_fingerprint(settings: dict, signature: list[tuple]) -> str:
    """A digest of the settings and the inputs' signature: equal fingerprints, equal datasets."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for entry in signature:
        digest.update(json.dumps(entry).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def write_manifest(folder: StoragePath, *, fingerprint: str, settings: dict, classes: list[str], folders: list[str],
                   writers: dict[str, "SplitWriter"], layout: ImageLayout, skipped: Counter, seconds: float) -> dict:
    """Write ``_manifest.json`` of the dataset the ``writers`` (closed, one per split) wrote; return it."""
    manifest = {
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": {"type": settings["source"], "root": settings["root"]},
        "classes": classes,
        "folders": folders,
        "counts": {split: writer.rows for split, writer in writers.items()},
        "counts_per_class": {split: {c: writer.per_class[c] for c in classes} for split, writer in writers.items()},
        "image_size": settings["image_size"],
        "layout": layout.to_dict(),
        "skipped": dict(sorted(skipped.items())),
        "files": [entry for writer in writers.values() for entry in writer.files],
        "settings": settings,
        "seconds": round(seconds, 3),
    }
    text = json.dumps(manifest, indent=2) + "\n"
    if isinstance(folder, ObjectPath):
        storage.write_text(folder / MANIFEST_NAME, text)
    else:
        (folder / MANIFEST_NAME).write_text(text, encoding="utf-8")
    return manifest


# ---------------------------------------------------------------------------
# Writing


def check_output_dir(output_dir: StoragePath) -> None:
    """Refuse an ``output_dir`` that holds something other than a dataset written here."""
    # The old folder is replaced wholesale, so a typo in output_dir must not delete a home folder.
    if isinstance(output_dir, ObjectPath):
        _check_output_prefix(output_dir)
        return
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise DataSourceError(f"data.output_dir {str(output_dir)!r} exists and is a file; choose a folder path")
    if any(output_dir.iterdir()) and not (output_dir / MANIFEST_NAME).exists():
        raise DataSourceError(
            f"data.output_dir {str(output_dir)!r} is not empty and holds no {MANIFEST_NAME}, so it is not a dataset "
            "written by this stage; refusing to replace it. Choose a new or empty folder."
        )


def _check_output_prefix(output_dir: ObjectPath) -> None:
    if storage.file_size(output_dir) is not None:
        raise DataSourceError(f"data.output_dir {str(output_dir)!r} is an object, not a prefix; choose a prefix "
                              "that holds nothing or a dataset")
    ours = [output_dir / MANIFEST_NAME, output_dir / WRITING_MARKER]
    if storage.list_files(output_dir, recursive=True, limit=1) and all(storage.file_size(p) is None for p in ours):
        raise DataSourceError(
            f"data.output_dir {str(output_dir)!r} holds objects but no {MANIFEST_NAME}, so it is not a dataset "
            "written by this stage; refusing to replace it. Choose a new or empty prefix."
        )


@contextlib.contextmanager
def new_dataset_folder(output_dir: StoragePath) -> Iterator[StoragePath]:
    """Yield the folder to build the dataset in, which becomes ``output_dir`` when the block succeeds.

    Local disk: a hidden sibling folder, renamed into place on success and removed on failure; what a
    killed run left is tidied first (``jobs.atomic.recover_dir``).
    S3: ``output_dir`` itself, emptied first (manifest first), with the ``_writing`` marker
    until the block (which writes the manifest last) is done; a failed block leaves no manifest.
    """
    if isinstance(output_dir, ObjectPath):
        storage.write_text(output_dir / WRITING_MARKER, "preprocess is writing this dataset\n")
        storage.delete_file(output_dir / MANIFEST_NAME)
        for old in storage.list_files(output_dir, recursive=True):
            if old.name != WRITING_MARKER:
                storage.delete_file(old)
        yield output_dir
        storage.delete_file(output_dir / WRITING_MARKER)
        return
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    atomic.recover_dir(output_dir)
    building = atomic.staging_dir(output_dir)
    try:
        yield building
        atomic.replace_dir(building, output_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def write_part(path: StoragePath, table: pa.Table, rows_per_file: int, image_compression: str = "NONE") -> None:
    """Write one Parquet part (one row group)."""
    filesystem, where = (None, path)
    if isinstance(path, ObjectPath):
        filesystem, where = storage.filesystem_and_path(path)
    storage.call_storage(path, lambda: pq.write_table(
        table,
        where,
        filesystem=filesystem,
        row_group_size=rows_per_file,
        compression={"image": image_compression, "label": "SNAPPY", "class_name": "SNAPPY", "split": "SNAPPY",
                     "path": "SNAPPY"},
        use_dictionary=["class_name", "split"],
        write_statistics=["label", "class_name", "split"],
    ))


class SplitWriter:
    """Buffers rows of one split and writes them as part files of ``rows_per_file`` rows."""

    def __init__(self, directory: StoragePath, split: str, rows_per_file: int, class_names: list[str],
                 raw: bool = False):
        # JPEG bytes do not compress, so spending CPU on them only slows readers; raw
        # pixel arrays (mostly black MNIST digits) shrink several times.
        self.image_compression = "SNAPPY" if raw else "NONE"
        self.directory = directory
        self.split = split
        self.rows_per_file = rows_per_file
        self.class_names = class_names
        self.columns: dict[str, list] = {name: [] for name in PARQUET_SCHEMA.names}
        self.files: list[dict] = []
        self.rows = 0
        self.per_class: Counter = Counter()
        storage.make_folder(directory)

    def add(self, image: bytes, label: int, path: str) -> None:
        """Buffer one row; a full buffer becomes a part file."""
        self.columns["image"].append(image)
        self.columns["label"].append(label)
        self.columns["class_name"].append(self.class_names[label])
        self.columns["split"].append(self.split)
        self.columns["path"].append(path)
        self.per_class[self.class_names[label]] += 1
        if len(self.columns["image"]) >= self.rows_per_file:
            self._flush()

    def close(self) -> None:
        """Write the rows still buffered."""
        # An empty split still gets one (empty) part so readers find the schema.
        if self.columns["image"] or not self.files:
            self._flush()

    def _flush(self) -> None:
        table = pa.table(self.columns, schema=PARQUET_SCHEMA)
        name = f"part-{len(self.files):05d}.parquet"
        target = self.directory / name
        write_part(target, table, self.rows_per_file, self.image_compression)
        size = storage.file_size(target) if isinstance(target, ObjectPath) else target.stat().st_size
        self.files.append({"path": f"{self.split}/{name}", "rows": table.num_rows, "bytes": size})
        self.rows += table.num_rows
        self.columns = {name: [] for name in PARQUET_SCHEMA.names}
