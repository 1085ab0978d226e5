"""Preprocess stage: source images → square JPEGs → Parquet, in parallel on Ray.

This module drives the stage: it lists the source, skips the work when the dataset
at ``data.output_dir`` was written from the same inputs and settings, schedules the
encoding tasks and writes their results. What the dataset holds is in
:mod:`workloads.vision.reading.manifest`, how it is written in
:mod:`workloads.vision.preprocess.writing`; the pixel work in
:mod:`workloads.vision.images`; the per-image task in
:mod:`workloads.vision.preprocess.payloads`; the sources in :mod:`workloads.vision.sources`.

Work is split into Ray tasks over small chunks of images. On a multi-node cluster
the driver reads the source bytes and ships them with the task, so workers on other
nodes need no access to the driver's disk (on one node, workers read the files
themselves). The driver writes the output, in a fixed (seeded, shuffled) order, so
a run is reproducible and row groups mix classes. MNIST and CIFAR-10 arrays need no
decoding and are written straight from the driver.

``python -m workloads.vision.preprocess [--params FILE]`` runs the stage alone.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import ray

from workloads import storage
from workloads.placement import nodes_phrase
from workloads.storage import StoragePath
from workloads.vision.config import ARRAY_SOURCES, DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.images import ImageLayout
from workloads.vision.preprocess.payloads import PayloadReader, Skip, encode_chunk
from workloads.vision.preprocess.writing import (
    SplitWriter,
    check_output_dir,
    dataset_fingerprint,
    dataset_settings,
    write_manifest,
)
from workloads.vision.reading.manifest import (
    MANIFEST_NAME,
    DatasetInfo,
    info_from_manifest,
    manifest_intact,
    read_manifest,
)
from workloads.vision.sources.arrays import ArraySource, load_array_source, source_signature
from workloads.vision.sources.listing import SPLITS, SourceItem, SourceListing, source_description
from workloads.vision.sources.photos import list_source


def _encode_chunk_on_a_node(payloads, image_size: int, jpeg_quality: int):
    """:func:`encode_chunk`, and the id of the node that ran it (the summary counts the nodes that worked)."""
    return ray.get_runtime_context().get_node_id(), encode_chunk(payloads, image_size, jpeg_quality)


# SPREAD: Ray's default placement prefers the driver's node until it is half busy; spread, each new worker
# lease goes to the next node with a free CPU, so a cluster's nodes share a large stage from its first tasks.
# A leased worker takes the next chunk as soon as it is done, so a stage that one worker finishes before
# another node's worker has started (a few hundred small images) runs on one node.
_encode_chunk_remote = ray.remote(num_cpus=1, max_retries=3, scheduling_strategy="SPREAD")(_encode_chunk_on_a_node)


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


def _summary(output_dir: StoragePath, classes: list[str], writers: dict[str, SplitWriter], skipped: Counter,
             seconds: float, nodes: set[str]) -> str:
    processed = sum(w.rows for w in writers.values()) + sum(skipped.values())
    width = max(12, *(len(c) for c in classes))
    # Arrays are written by the driver alone; encoded images by tasks on the nodes counted.
    where = f", on {nodes_phrase(nodes)}" if nodes else ""
    lines = [
        f"preprocess: wrote {output_dir} in {seconds:.1f} s, {processed} images "
        f"({processed / max(seconds, 1e-9):.1f} images/s{where})",
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


def run_preprocess(data: DataConfig, *, progress: bool = True) -> DatasetInfo:
    """Turn the configured source into the Parquet dataset at ``data.output_dir``.

    Needs Ray for photo sources (the caller runs ``ray.init``). Reuses an earlier
    identical run unless ``data.force``; raises :class:`DataSourceError` for bad input.
    """
    started = time.perf_counter()
    output_dir = storage.storage_path(data.output_dir)
    check_output_dir(output_dir)
    arrays = listing = None
    if data.source in ARRAY_SOURCES:
        # Arrays are loaded only when the dataset must be written: the files' sizes and
        # times are enough to tell whether an earlier run already did.
        root, classes, folders = Path(data.root).expanduser(), list(data.classes), list(data.classes)
        signature = source_signature(data)
        description = f"source {data.source} at {root}"
    else:
        listing = list_source(data)
        root, classes, folders, signature = listing.root, listing.classes, listing.folders, listing.signature
        description = source_description(listing)
    settings = dataset_settings(data, root, folders)
    fingerprint = dataset_fingerprint(settings, signature)
    _log(f"preprocess: {description}")

    existing = read_manifest(output_dir)
    if existing is not None and not data.force:
        if existing.get("fingerprint") == fingerprint and manifest_intact(output_dir, existing):
            _log(
                f"preprocess: reusing {output_dir}: same inputs and settings as the run that wrote it "
                f"(fingerprint {fingerprint[:12]}); set workload.data.force=true to rebuild"
            )
            return info_from_manifest(output_dir, existing, reused=True)

    if data.source in ARRAY_SOURCES:
        arrays = load_array_source(data)
        classes, folders, layout = arrays.classes, arrays.folders, arrays.layout
        counts = {split: len(part.labels) for split, part in arrays.splits.items()}
        description += f": {counts.get('train', 0)} train + {counts.get('val', 0)} val images, {len(classes)} classes"
        _log(f"preprocess: {description}")
    else:
        layout = ImageLayout.photos(data.image_size)
    skipped: Counter = Counter(listing.skipped if listing else {})
    nodes: set[str] = set()
    # In S3 the old manifest goes first: the prefix stops being a dataset before any of its parts goes.
    with storage.replacing_folder(output_dir, index=MANIFEST_NAME) as building:
        writers = {split: SplitWriter(building / split, split, data.rows_per_file, classes, raw=layout.encoding == "raw")
                   for split in SPLITS}
        if arrays is not None:
            _write_arrays(arrays, writers, data.seed)
        else:
            nodes = _encode_listing(listing, data, writers, skipped, progress)
        for writer in writers.values():
            writer.close()
        if writers["train"].rows == 0:
            raise DataSourceError(f"no usable training images from {description}; skipped: {dict(skipped) or 'none'}")
        manifest = write_manifest(building, fingerprint=fingerprint, settings=settings, classes=classes,
                                  folders=folders, writers=writers, layout=layout, skipped=skipped,
                                  seconds=time.perf_counter() - started)
    _log(_summary(output_dir, classes, writers, skipped, time.perf_counter() - started, nodes))
    return info_from_manifest(output_dir, manifest, reused=False)


def _write_arrays(arrays: ArraySource, writers: dict[str, SplitWriter], seed: int) -> None:
    """Write decoded arrays as raw rows, each split in a seeded shuffled order (row groups mix classes)."""
    for split in SPLITS:
        part = arrays.splits.get(split)
        if part is None:
            continue
        order = np.random.default_rng([abs(seed), SPLITS.index(split)]).permutation(len(part.labels))
        for index in order.tolist():
            writers[split].add(part.images[index].tobytes(), int(part.labels[index]), part.paths[index])


def _encode_listing(listing: SourceListing, data: DataConfig, writers: dict[str, SplitWriter], skipped: Counter,
                    progress: bool) -> set[str]:
    """Decode, resize and re-encode every listed image in Ray tasks; write the rows in a fixed order.

    Returns the ids of the nodes whose tasks did the work.
    """
    ordered = _ordered_items(listing, data.seed)
    if not ray.is_initialized():
        ray.init()  # callers normally have; this keeps the stage usable on its own
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    chunk_size = max(4, min(64, math.ceil(len(ordered) / (cpus * 12))))
    chunks = _plan_chunks(ordered, chunk_size)
    return _run_chunks(ordered, chunks, listing, data, writers, skipped, cpus, progress)


def _run_chunks(
    ordered: list[SourceItem],
    chunks: list[list[int]],
    listing: SourceListing,
    data: DataConfig,
    writers: dict[str, SplitWriter],
    skipped: Counter,
    cpus: int,
    progress: bool,
) -> set[str]:
    """Process all chunks with a bounded number of tasks in flight; write rows in order.

    Returns the ids of the nodes the tasks ran on.
    """
    alive_nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    reader = PayloadReader(len(listing.classes), ship_file_bytes=alive_nodes > 1)
    tracker = _Progress(len(ordered), progress)
    results: dict[int, tuple[bytes | None, str | None]] = {}
    next_to_write = 0
    max_in_flight = cpus * 3  # enough to keep every CPU busy while the driver waits on one result
    pending: dict = {}
    nodes: set[str] = set()
    chunk_iter = iter(chunks)

    def submit(positions: list[int]) -> None:
        payloads, sent = [], []
        for position in positions:
            payload = reader.payload(ordered[position])
            if isinstance(payload, Skip):
                results[position] = (None, payload.reason)
            else:
                payloads.append(payload)
                sent.append(position)
        if len(sent) < len(positions):
            tracker.update(len(positions) - len(sent))
        if sent:
            pending[_encode_chunk_remote.remote(payloads, data.image_size, data.jpeg_quality)] = sent

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
            node, outcomes = ray.get(ref)
            nodes.add(node)
            for position, outcome in zip(sent, outcomes):
                results[position] = outcome
            tracker.update(len(sent))
        drain()
    drain()  # rows skipped while reading, after the last task
    return nodes
