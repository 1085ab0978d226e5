"""Writing the Parquet dataset: its schema, its part files, its manifest, and replacing the old dataset.

What the dataset holds is described in :mod:`workloads.vision.reading.manifest`. The
manifest's fingerprint covers the settings and a signature of the inputs, so a run with
the same inputs can reuse the dataset. A new dataset replaces the old one through
:func:`workloads.storage.replacing_folder`: on local disk it is built beside it and renamed
into place, so a failed run leaves the previous one intact; in S3, which has no rename, the
old manifest goes first, the parts are written in place and the manifest last, so a failed
run leaves no manifest and the prefix is not taken for a dataset.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workloads import storage
from workloads.storage import StoragePath
from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.images import ImageLayout
from workloads.vision.reading.manifest import MANIFEST_NAME

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


# ---------------------------------------------------------------------------
# Manifest and fingerprint


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
    storage.write_text(folder / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---------------------------------------------------------------------------
# Writing


def check_output_dir(output_dir: StoragePath) -> None:
    """Refuse an ``output_dir`` that holds something other than a dataset written here."""
    # The old folder is replaced wholesale, so a typo in output_dir must not delete a home folder.
    if storage.file_size(output_dir) is not None:
        raise DataSourceError(f"data.output_dir {str(output_dir)!r} is a file, not a folder; choose a folder (or S3 "
                              "prefix) that holds nothing or a dataset")
    ours = (output_dir / MANIFEST_NAME, output_dir / storage.WRITING_MARKER)
    if not storage.is_empty(output_dir) and not any(storage.exists(path) for path in ours):
        raise DataSourceError(
            f"data.output_dir {str(output_dir)!r} holds objects but no {MANIFEST_NAME}, so it is not a dataset "
            "written by this stage; refusing to replace it. Choose a new or empty folder (or S3 prefix)."
        )


def write_part(path: StoragePath, table: pa.Table, rows_per_file: int, image_compression: str = "NONE") -> None:
    """Write one Parquet part (one row group)."""
    where, filesystem = storage.arrow_path(path)
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
        self.files.append({"path": f"{self.split}/{name}", "rows": table.num_rows,
                           "bytes": storage.file_size(target)})
        self.rows += table.num_rows
        self.columns = {name: [] for name in PARQUET_SCHEMA.names}
