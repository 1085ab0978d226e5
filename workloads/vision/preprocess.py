"""Preprocess stage: source images → square JPEGs → Parquet, in parallel on Ray.

Output layout under ``data.output_dir``::

    train/part-00000.parquet ...   one row group of ``rows_per_file`` rows per file
    val/part-00000.parquet ...
    _manifest.json                 classes, counts, skipped, fingerprint, files

Each row is ``image`` (JPEG bytes, RGB, image_size × image_size; or, for MNIST
and CIFAR-10, the raw uint8 H×W×C array), ``label``, ``class_name``, ``split`` and
``path`` (where the image came from). The manifest's ``layout`` says which.

Work is split into Ray tasks over small chunks of images. On a multi-node cluster
the driver reads the source bytes and ships them with the task, so workers on other
nodes need no access to the driver's disk (on one node, workers read the files
themselves). The driver writes the output, in a fixed (seeded, shuffled) order, so
a run is reproducible and row groups mix classes.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import shutil
import sys
import time
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from PIL import Image, UnidentifiedImageError

from jobs import atomic
from workloads.vision.config import ARRAY_SOURCES, DataConfig
from workloads.vision.images import ImageLayout
from workloads.vision.sources import (
    SPLITS,
    DataSourceError,
    SourceItem,
    SourceListing,
    list_source,
    render_synthetic,
    source_description,
)

MANIFEST_NAME = "_manifest.json"
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

    root: Path
    classes: list[str]
    counts: dict[str, int]
    image_size: int
    skipped: dict[str, int] = field(default_factory=dict)
    reused: bool = False
    layout: ImageLayout | None = None

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = ImageLayout.photos(self.image_size)


def load_dataset_info(root: Path) -> DatasetInfo:
    """Read ``<root>/_manifest.json`` written by :func:`run_preprocess`.

    ``reused`` is False: it describes a preprocess run, not a dataset on disk.
    """
    root = Path(root).expanduser()
    manifest = _read_manifest(root)
    if manifest is None:
        raise DataSourceError(
            f"no preprocessed dataset at {str(root)!r} ({MANIFEST_NAME} is missing or unreadable): run the "
            "'preprocess' stage first, or point workload.data.output_dir at the folder it wrote"
        )
    return _info_from_manifest(root, manifest, reused=False)


# ---------------------------------------------------------------------------
# Image work (runs in Ray workers)


def square_jpeg_from_image(image: Image.Image, size: int, quality: int) -> bytes:
    """Resize the shorter side to ``size``, crop the centre square, encode as RGB JPEG."""
    if image.mode != "RGB":
        image = _to_rgb(image)
    width, height = image.size
    side = min(width, height)
    # Resizing only the centre box does the crop and the resize in one pass, so
    # no time goes into pixels that would be cropped away.
    box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
    square = image.resize((size, size), Image.Resampling.BICUBIC, box=box)
    out = io.BytesIO()
    square.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def square_jpeg_from_bytes(data: bytes, size: int, quality: int) -> bytes:
    """Decode an encoded image and return it as a ``size``×``size`` JPEG.

    Raises ``UnidentifiedImageError`` for data that is not an image and ``OSError``
    (or another decoder error) for a damaged one.
    """
    with Image.open(io.BytesIO(data)) as image:
        orientation = image.getexif().get(0x0112, 1)
        if image.format == "JPEG" and image.mode == "RGB" and image.size == (size, size) and orientation == 1:
            # Already what this stage writes: encoding again would only lose detail. Decoding
            # still checks that the file is whole.
            image.load()
            return data
        if image.format == "JPEG":
            width, height = image.size
            scale = size / min(width, height)
            if scale < 1:
                # Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the result still
                # covers the target: much less work for large photos.
                image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        image.load()
        if orientation != 1:
            from PIL import ImageOps

            image = ImageOps.exif_transpose(image)
        return square_jpeg_from_image(image, size, quality)


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        # Transparent areas become white rather than whatever colour the hidden
        # pixels happen to hold.
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _process_payload(payload, size: int, quality: int) -> tuple[bytes | None, str | None]:
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


def _process_chunk(payloads: list, size: int, quality: int) -> list[tuple[bytes | None, str | None]]:
    return [_process_payload(p, size, quality) for p in payloads]


_process_chunk_remote = ray.remote(num_cpus=1, max_retries=3)(_process_chunk)


# ---------------------------------------------------------------------------
# Writing


def _write_part(path: Path, table: pa.Table, rows_per_file: int, image_compression: str = "NONE") -> None:
    """Write one Parquet part (one row group). Kept separate so tests can fail it."""
    pq.write_table(
        table,
        path,
        row_group_size=rows_per_file,
        compression={"image": image_compression, "label": "SNAPPY", "class_name": "SNAPPY", "split": "SNAPPY",
                     "path": "SNAPPY"},
        use_dictionary=["class_name", "split"],
        write_statistics=["label", "class_name", "split"],
    )


class _SplitWriter:
    """Buffers rows of one split and writes them as part files of ``rows_per_file`` rows."""

    def __init__(self, directory: Path, split: str, rows_per_file: int, class_names: list[str], raw: bool = False):
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
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, image: bytes, label: int, path: str) -> None:
        self.columns["image"].append(image)
        self.columns["label"].append(label)
        self.columns["class_name"].append(self.class_names[label])
        self.columns["split"].append(self.split)
        self.columns["path"].append(path)
        self.per_class[self.class_names[label]] += 1
        if len(self.columns["image"]) >= self.rows_per_file:
            self._flush()

    def close(self) -> None:
        # An empty split still gets one (empty) part so readers find the schema.
        if self.columns["image"] or not self.files:
            self._flush()

    def _flush(self) -> None:
        table = pa.table(self.columns, schema=PARQUET_SCHEMA)
        name = f"part-{len(self.files):05d}.parquet"
        target = self.directory / name
        _write_part(target, table, self.rows_per_file, self.image_compression)
        self.files.append({"path": f"{self.split}/{name}", "rows": table.num_rows, "bytes": target.stat().st_size})
        self.rows += table.num_rows
        self.columns = {name: [] for name in PARQUET_SCHEMA.names}


# ---------------------------------------------------------------------------
# Manifest, fingerprint, atomic replace


def _read_manifest(root: Path) -> dict | None:
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "classes" in manifest and "counts" in manifest else None


def _manifest_intact(root: Path, manifest: dict) -> bool:
    """True when every part file the manifest lists is there with its recorded size."""
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return False
    for entry in files:
        try:
            if (root / entry["path"]).stat().st_size != entry["bytes"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def _info_from_manifest(root: Path, manifest: dict, *, reused: bool) -> DatasetInfo:
    return DatasetInfo(
        root=root,
        classes=list(manifest["classes"]),
        counts={split: int(n) for split, n in manifest["counts"].items()},
        image_size=int(manifest["image_size"]),
        skipped={reason: int(n) for reason, n in manifest.get("skipped", {}).items()},
        reused=reused,
        layout=ImageLayout.from_manifest(manifest),
    )


def _settings(data: DataConfig, root: Path | None, folders: list[str]) -> dict:
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


def _fingerprint(settings: dict, signature: list[tuple]) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for entry in signature:
        digest.update(json.dumps(entry).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _check_output_dir(output_dir: Path) -> None:
    # The old folder is replaced wholesale, so refuse anything that is not a
    # dataset this stage wrote: a typo in output_dir must not delete a home folder.
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise DataSourceError(f"data.output_dir {str(output_dir)!r} exists and is a file; choose a folder path")
    if any(output_dir.iterdir()) and not (output_dir / MANIFEST_NAME).exists():
        raise DataSourceError(
            f"data.output_dir {str(output_dir)!r} is not empty and holds no {MANIFEST_NAME}, so it is not a dataset "
            "written by this stage; refusing to replace it. Choose a new or empty folder."
        )


# ---------------------------------------------------------------------------
# Progress and summary


class _Progress:
    """Plain periodic lines (they survive job log capture, unlike a redrawn bar)."""

    def __init__(self, total: int, enabled: bool, every_fraction: float = 0.1, every_seconds: float = 15.0):
        self.total, self.enabled = total, enabled
        self.done = 0
        self.started = self.last_time = time.perf_counter()
        self.step = max(1, int(total * every_fraction))
        self.next_mark = self.step
        self.every_seconds = every_seconds

    def update(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (self.done >= self.next_mark or now - self.last_time >= self.every_seconds or self.done == self.total):
            rate = self.done / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            _log(
                f"preprocess: {self.done}/{self.total} images ({100 * self.done / max(self.total, 1):.0f}%), "
                f"{rate:.1f} images/s, eta {eta:.0f} s"
            )
            self.last_time = now
            while self.next_mark <= self.done:
                self.next_mark += self.step


def _log(line: str) -> None:
    print(line, flush=True, file=sys.stdout)


def _summary(output_dir: Path, classes: list[str], writers: dict[str, _SplitWriter], skipped: Counter, seconds: float) -> str:
    processed = sum(w.rows for w in writers.values()) + sum(skipped.values())
    width = max(12, *(len(c) for c in classes))
    lines = [
        f"preprocess: wrote {output_dir} in {seconds:.1f} s, {processed} images ({processed / max(seconds, 1e-9):.1f} images/s)",
        f"  {'class':<{width}} {'train':>7} {'val':>7}",
    ]
    for name in classes:
        lines.append(f"  {name:<{width}} {writers['train'].per_class[name]:>7} {writers['val'].per_class[name]:>7}")
    lines.append(f"  {'total':<{width}} {writers['train'].rows:>7} {writers['val'].rows:>7}")
    lines.append("  skipped: " + (", ".join(f"{k}={v}" for k, v in sorted(skipped.items())) if skipped else "none"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The stage


def _ordered_items(listing: SourceListing, seed: int) -> list[SourceItem]:
    """Train then val, each shuffled with the seed so every row group mixes classes."""
    ordered = []
    for split in SPLITS:
        items = [item for item in listing.items if item.split == split]
        random.Random(f"{seed}:order:{split}").shuffle(items)
        ordered.extend(items)
    return ordered


def _plan_chunks(ordered: list[SourceItem], chunk_size: int) -> list[list[int]]:
    """Positions (into ``ordered``) handled by each task."""
    if ordered and ordered[0].shard is not None:
        # Parquet shards: one task never spans row groups, so the driver reads each
        # row group once, in file order, instead of once per shuffled row.
        by_group: dict[tuple, list[int]] = {}
        for position, item in enumerate(ordered):
            by_group.setdefault((str(item.shard), item.row_group), []).append(position)
        chunks = []
        for key in sorted(by_group):
            positions = sorted(by_group[key], key=lambda p: ordered[p].row)
            chunks.extend(positions[i : i + chunk_size] for i in range(0, len(positions), chunk_size))
        return chunks
    return [list(range(i, min(i + chunk_size, len(ordered)))) for i in range(0, len(ordered), chunk_size)]


class _PayloadReader:
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
        """The path, bytes or synthetic spec to send to a worker, or a :class:`_Skip`."""
        if item.synthetic_seed is not None:
            return ("synthetic", item.label, self.num_classes, item.synthetic_seed)
        if item.file is not None and not self.ship_file_bytes:
            return str(item.file)
        if item.file is not None:
            try:
                return item.file.read_bytes()
            except FileNotFoundError:
                return _Skip("missing")
            except OSError:
                return _Skip("unreadable")
        key = (item.shard, item.row_group)
        if key != self._group_key:
            table = pq.ParquetFile(item.shard).read_row_group(item.row_group, columns=["image"])
            self._group_images = table.column("image").to_pylist()
            self._group_key = key
        cell = self._group_images[item.row]
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        return data if data else _Skip("missing")


@dataclass(frozen=True)
class _Skip:
    reason: str


def run_preprocess(data: DataConfig, *, progress: bool = True) -> DatasetInfo:
    """Turn the configured source into the Parquet dataset at ``data.output_dir``.

    Needs Ray for photo sources (the caller runs ``ray.init``). Reuses an earlier
    identical run unless ``data.force``; raises :class:`DataSourceError` for bad input.
    """
    started = time.perf_counter()
    output_dir = Path(data.output_dir).expanduser()
    _check_output_dir(output_dir)
    arrays = listing = None
    if data.source in ARRAY_SOURCES:
        from workloads.vision.arrays import source_signature

        # Arrays are loaded only when the dataset must be written: the files' sizes and
        # times are enough to tell whether an earlier run already did.
        root, classes, folders = Path(data.root).expanduser(), list(data.classes), list(data.classes)
        signature = source_signature(data)
        description = f"source {data.source} at {root}"
    else:
        listing = list_source(data)
        root, classes, folders, signature = listing.root, listing.classes, listing.folders, listing.signature
        description = source_description(listing)
    settings = _settings(data, root, folders)
    fingerprint = _fingerprint(settings, signature)
    _log(f"preprocess: {description}")

    existing = _read_manifest(output_dir)
    if existing is not None and not data.force:
        if existing.get("fingerprint") == fingerprint and _manifest_intact(output_dir, existing):
            _log(
                f"preprocess: reusing {output_dir}: same inputs and settings as the run that wrote it "
                f"(fingerprint {fingerprint[:12]}); set workload.data.force=true to rebuild"
            )
            return _info_from_manifest(Path(data.output_dir), existing, reused=True)

    if data.source in ARRAY_SOURCES:
        from workloads.vision.arrays import load_array_source

        arrays = load_array_source(data)
        classes, folders, layout = arrays.classes, arrays.folders, arrays.layout
        counts = {split: len(part.labels) for split, part in arrays.splits.items()}
        description += f": {counts.get('train', 0)} train + {counts.get('val', 0)} val images, {len(classes)} classes"
        _log(f"preprocess: {description}")
    else:
        layout = ImageLayout.photos(data.image_size)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    building = output_dir.with_name(f".{output_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    skipped: Counter = Counter(listing.skipped if listing else {})
    try:
        writers = {split: _SplitWriter(building / split, split, data.rows_per_file, classes, raw=layout.encoding == "raw")
                   for split in SPLITS}
        if arrays is not None:
            _write_arrays(arrays, writers, data.seed)
        else:
            _encode_listing(listing, data, writers, skipped, progress)
        for writer in writers.values():
            writer.close()
        if writers["train"].rows == 0:
            raise DataSourceError(f"no usable training images from {description}; skipped: {dict(skipped) or 'none'}")
        seconds = time.perf_counter() - started
        manifest = {
            "format_version": FORMAT_VERSION,
            "fingerprint": fingerprint,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": {"type": data.source, "root": settings["root"]},
            "classes": classes,
            "folders": folders,
            "counts": {split: writers[split].rows for split in SPLITS},
            "counts_per_class": {split: {c: writers[split].per_class[c] for c in classes} for split in SPLITS},
            "image_size": data.image_size,
            "layout": layout.to_dict(),
            "skipped": dict(sorted(skipped.items())),
            "files": [entry for split in SPLITS for entry in writers[split].files],
            "settings": settings,
            "seconds": round(seconds, 3),
        }
        (building / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        atomic.replace_dir(building, output_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _log(_summary(output_dir, classes, writers, skipped, time.perf_counter() - started))
    return _info_from_manifest(Path(data.output_dir), manifest, reused=False)


def _write_arrays(arrays, writers: dict[str, "_SplitWriter"], seed: int) -> None:
    """Write decoded arrays as raw rows, each split in a seeded shuffled order (row groups mix classes)."""
    import numpy as np

    for split in SPLITS:
        part = arrays.splits.get(split)
        if part is None:
            continue
        order = np.random.default_rng([abs(seed), SPLITS.index(split)]).permutation(len(part.labels))
        for index in order.tolist():
            writers[split].add(part.images[index].tobytes(), int(part.labels[index]), part.paths[index])


def _encode_listing(listing: SourceListing, data: DataConfig, writers: dict[str, "_SplitWriter"], skipped: Counter,
                    progress: bool) -> None:
    """Decode, resize and re-encode every listed image in Ray tasks; write the rows in a fixed order."""
    ordered = _ordered_items(listing, data.seed)
    if not ray.is_initialized():
        ray.init()  # callers normally have; this keeps the stage usable on its own
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    chunk_size = max(4, min(64, math.ceil(len(ordered) / (cpus * 12))))
    chunks = _plan_chunks(ordered, chunk_size)
    _run_chunks(ordered, chunks, listing, data, writers, skipped, cpus, progress)


def _run_chunks(
    ordered: list[SourceItem],
    chunks: list[list[int]],
    listing: SourceListing,
    data: DataConfig,
    writers: dict[str, _SplitWriter],
    skipped: Counter,
    cpus: int,
    progress: bool,
) -> None:
    """Process all chunks with a bounded number of tasks in flight; write rows in order."""
    alive_nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    reader = _PayloadReader(len(listing.classes), ship_file_bytes=alive_nodes > 1)
    tracker = _Progress(len(ordered), progress)
    results: dict[int, tuple[bytes | None, str | None]] = {}
    next_to_write = 0
    max_in_flight = cpus * 3  # enough to keep every CPU busy while the driver waits on one result
    pending: dict = {}
    chunk_iter = iter(chunks)

    def submit(positions: list[int]) -> None:
        payloads, sent = [], []
        for position in positions:
            payload = reader.payload(ordered[position])
            if isinstance(payload, _Skip):
                results[position] = (None, payload.reason)
            else:
                payloads.append(payload)
                sent.append(position)
        if len(sent) < len(positions):
            tracker.update(len(positions) - len(sent))
        if sent:
            pending[_process_chunk_remote.remote(payloads, data.image_size, data.jpeg_quality)] = sent

    def drain() -> None:
        # Write the finished prefix in order; with in-order chunks memory stays bounded.
        nonlocal next_to_write
        while next_to_write in results:
            image, reason = results.pop(next_to_write)
            item = ordered[next_to_write]
            if image is None:
                skipped[reason] += 1
            else:
                writers[item.split].add(image, item.label, item.path)
            next_to_write += 1

    exhausted = False
    while True:
        while not exhausted and len(pending) < max_in_flight:
            positions = next(chunk_iter, None)
            if positions is None:
                exhausted = True
            else:
                submit(positions)
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            sent = pending.pop(ref)
            for position, outcome in zip(sent, ray.get(ref)):
                results[position] = outcome
            tracker.update(len(sent))
        drain()
    drain()  # rows skipped while reading, after the last task


def main(argv: list[str] | None = None) -> int:
    """Run only the preprocess stage: ``python -m workloads.vision.preprocess [--params FILE]``."""
    import argparse

    from workloads.params import add_params_argument, load_params
    from workloads.vision.config import VisionParams

    parser = argparse.ArgumentParser(description="Preprocess images into the Parquet dataset of a vision spec.")
    add_params_argument(parser)
    args = parser.parse_args(argv)
    params = load_params(VisionParams, args.params)
    # run_preprocess starts Ray only when there is work: bad input fails fast and a
    # reused dataset needs no cluster. Under rayjobs, ray.init() joins the job's cluster.
    try:
        run_preprocess(params.data)
    except DataSourceError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
