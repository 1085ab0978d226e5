"""The split a sweep chooses its best trial on: a share of the training photos, held out class by class.

A sweep that picked its best trial by accuracy on the validation split would report a figure it
had already chosen for: the best of eight trials on one split flatters the winner. So trials
train on the rest of the training split and are compared on the held-out share, and the dataset's
own validation split stays unseen until the infer stage measures the best trial on it.

The carved dataset lives in the sweep's run folder, ``<run>/selection/``, laid out like the
preprocessed one (``train/``, ``val/``, ``_manifest.json``), so both ways of reading it
(``ingest: torch`` and ``ray_data``) need nothing new. It is written once; a sweep submitted
again finds it and reuses it, as long as the training split and the share are unchanged.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict

from workloads import storage
from workloads.storage import StoragePath
from workloads.vision.reading.manifest import MANIFEST_NAME, DatasetInfo, info_from_manifest, manifest_intact, read_manifest

SELECTION_DIR = "selection"


def carve_selection_split(info: DatasetInfo, run_dir: StoragePath, share: float, seed: int) -> DatasetInfo:
    """The dataset a sweep's trials train and are compared on: ``info``'s training split divided into a
    training part and a held-out ``share`` of each class (seeded by ``seed``); written under
    ``run_dir/selection`` unless an identical carve is already there."""
    import pyarrow.parquet as pq

    from workloads.vision.preprocess.writing import write_part
    from workloads.vision.reading.torch_dataset import split_files

    source = list(split_files(info.root, "train"))
    target = run_dir / SELECTION_DIR
    source_manifest = read_manifest(info.root) or {}
    # What the carve depends on: a sweep submitted again reuses it only if all of this is unchanged.
    wanted = {"source": str(info.root), "fingerprint": source_manifest.get("fingerprint"),
              "rows": int(info.counts.get("train", 0)), "share": share, "seed": seed}
    existing = read_manifest(target)
    if existing is not None and existing.get("carved_from") == wanted and manifest_intact(target, existing):
        return info_from_manifest(target, existing, reused=True)

    # Labels first, a column at a time; then one part file in memory at a time, however large the split.
    label_columns = [pq.read_table(storage.open_input_file(path), columns=["label"]).column("label").to_pylist()
                     for path in source]
    held_out = held_out_rows([label for column in label_columns for label in column], share, seed)
    # As the preprocess stage writes them: JPEG bytes do not compress, raw pixel arrays do.
    image_compression = "SNAPPY" if info.layout.encoding == "raw" else "NONE"
    counts: Counter = Counter()
    per_class: dict[str, Counter] = defaultdict(Counter)
    files: list[dict] = []
    start = 0
    with storage.replacing_folder(target, index=MANIFEST_NAME) as building:
        for number, path in enumerate(source):
            table = pq.read_table(storage.open_input_file(path))
            rows = range(start, start + table.num_rows)
            start += table.num_rows
            rows_per_file = max(1, table.num_rows)
            for split, keep in (("train", [row not in held_out for row in rows]),
                                ("val", [row in held_out for row in rows])):
                part = table.filter(keep)
                if part.num_rows == 0 and any(entry["path"].startswith(f"{split}/") for entry in files):
                    continue
                name = f"{split}/part-{number:05d}.parquet"
                storage.make_folder(building / split)
                write_part(building / name, part, rows_per_file, image_compression)
                files.append({"path": name, "rows": part.num_rows, "bytes": storage.file_size(building / name)})
                counts[split] += part.num_rows
                for class_name in part.column("class_name").to_pylist():
                    per_class[split][class_name] += 1
        manifest = {**_kept_from(source_manifest, info), "counts": {"train": counts["train"], "val": counts["val"]},
                    "counts_per_class": {split: {c: per_class[split][c] for c in info.classes}
                                         for split in ("train", "val")},
                    "files": files, "carved_from": wanted}
        storage.write_text(building / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    return info_from_manifest(target, manifest, reused=False)


def held_out_rows(labels: list[int], share: float, seed: int) -> set[int]:
    """Row indices held out: ``share`` of each class's rows (rounded, at least one of a class with two or more),
    drawn with ``seed``; every class keeps at least one row to train on."""
    by_class: dict[int, list[int]] = defaultdict(list)
    for row, label in enumerate(labels):
        by_class[label].append(row)
    rng = random.Random(seed)
    held: set[int] = set()
    for label in sorted(by_class):
        rows = by_class[label]
        if len(rows) < 2:
            continue
        take = min(len(rows) - 1, max(1, round(share * len(rows))))
        held.update(rng.sample(rows, take))
    return held


def _kept_from(manifest: dict, info: DatasetInfo) -> dict:
    kept = {key: manifest[key] for key in ("format_version", "fingerprint", "source", "folders", "settings")
            if key in manifest}
    return {**kept, "classes": list(info.classes), "image_size": info.image_size, "layout": info.layout.to_dict(),
            "skipped": {}}
