"""Small on-disk image datasets for tests, in the real formats the vision sources read.

Every image is a real JPEG written with PIL. Images of one class share a colour
(:func:`class_colour`) under light noise, so a test can decode a processed image
and check that its label still matches its pixels.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from workloads.vision.sources.photos import FOOD101_CLASSES

# Colours far apart in RGB, so a class survives JPEG noise and resizing.
_PALETTE = [
    (220, 40, 40), (40, 180, 60), (40, 80, 220), (230, 200, 40), (200, 60, 200),
    (40, 200, 210), (240, 130, 30), (120, 60, 20), (150, 150, 150), (20, 20, 20),
]


# The Food-101-Lite folders get one palette colour each, so they never collide.
_LITE_FOLDERS = [
    "pizza", "hamburger", "sushi", "ramen", "fried_rice",
    "steak", "hot_dog", "pancakes", "breakfast_burrito", "caesar_salad",
]


def class_colour(name: str) -> tuple[int, int, int]:
    """The fill colour of every fixture image of class ``name`` (Food-101 folder name)."""
    if name in _LITE_FOLDERS:
        return _PALETTE[_LITE_FOLDERS.index(name)]
    return _PALETTE[int(hashlib.md5(name.encode()).hexdigest(), 16) % len(_PALETTE)]


def nearest_class(rgb, names: list[str]) -> str:
    """The class in ``names`` whose colour is closest to ``rgb``."""
    return min(names, key=lambda n: sum((a - b) ** 2 for a, b in zip(class_colour(n), rgb)))


def jpeg_bytes(colour: tuple[int, int, int], size: tuple[int, int] = (48, 36), seed: int = 0, quality: int = 90) -> bytes:
    """A JPEG of ``size`` (width, height): flat ``colour`` with mild noise."""
    rng = np.random.default_rng(seed)
    width, height = size
    pixels = np.clip(np.array(colour, np.float32) + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def photo_like_jpeg(size: tuple[int, int] = (512, 384), seed: int = 0, quality: int = 90) -> bytes:
    """A photo-sized JPEG with gradients, blobs and noise (costs about as much to decode as a photo)."""
    rng = np.random.default_rng(seed)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((height, width, 3), np.float32)
    for channel in range(3):
        fx, fy = rng.uniform(0.5, 4, size=2) * 2 * np.pi
        image[..., channel] = 128 + 60 * np.sin(fx * xx / width + rng.uniform(0, 6)) * np.cos(fy * yy / height)
    for _ in range(6):
        cx, cy, radius = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, 120)
        inside = (xx - cx) ** 2 + (yy - cy) ** 2 < radius**2
        image[inside] = image[inside] * 0.5 + rng.uniform(0, 255, 3) * 0.5
    image += rng.normal(0, 14, image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_truncated_jpeg(path: Path, colour=(200, 100, 50), size=(64, 48)) -> Path:
    """A JPEG cut off in the middle of its scan data (a partial download)."""
    data = jpeg_bytes(colour, size, seed=99)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) // 2])
    return path


def write_text_as_jpeg(path: Path) -> Path:
    """A text file with a .jpg name (e.g. an HTML error page saved by a downloader)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("<html><body>404 Not Found</body></html>\n", encoding="utf-8")
    return path


def _image_ids(name: str, count: int) -> list[str]:
    rng = random.Random(name)
    return [str(i) for i in sorted(rng.sample(range(100_000, 4_000_000), count))]


def make_food101_tree(
    base: Path,
    counts: dict[str, tuple[int, int]],
    *,
    size: tuple[int, int] = (48, 36),
    meta_format: str = "txt",
) -> Path:
    """Official layout under ``base/food-101``: images/<class>/<id>.jpg and meta/.

    ``counts`` maps folder name → (train, test) images. ``meta_format`` is "txt"
    (classes.txt, train.txt, test.txt) or "json" (classes.txt, train.json, test.json).
    Returns the ``food-101`` folder.
    """
    root = base / "food-101"
    (root / "meta").mkdir(parents=True, exist_ok=True)
    splits: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    for name, (n_train, n_test) in counts.items():
        ids = _image_ids(name, n_train + n_test)
        folder = root / "images" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i, image_id in enumerate(ids):
            (folder / f"{image_id}.jpg").write_bytes(jpeg_bytes(class_colour(name), size, seed=i))
        splits["train"][name] = [f"{name}/{i}" for i in ids[:n_train]]
        splits["test"][name] = [f"{name}/{i}" for i in ids[n_train:]]
    names = sorted(counts)
    (root / "meta" / "classes.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    (root / "meta" / "labels.txt").write_text("\n".join(n.replace("_", " ").capitalize() for n in names) + "\n")
    for split, by_class in splits.items():
        if meta_format == "json":
            (root / "meta" / f"{split}.json").write_text(json.dumps(by_class), encoding="utf-8")
        else:
            lines = [image_id for name in names for image_id in by_class[name]]
            (root / "meta" / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def food101_image_path(root: Path, name: str, split: str = "train", index: int = 0) -> Path:
    """Path of the ``index``-th image of class ``name`` in ``split`` ("train"/"test") of a fixture tree."""
    lines = (root / "meta" / f"{split}.txt").read_text().split()
    ids = [line for line in lines if line.startswith(name + "/")]
    return root / "images" / f"{ids[index]}.jpg"


def make_hf_shards(
    base: Path,
    counts: dict[str, tuple[int, int]],
    *,
    train_shards: int = 2,
    val_shards: int = 1,
    rows_per_group: int = 4,
    size: tuple[int, int] = (48, 36),
    extra_rows: dict[str, list[tuple[bytes, int]]] | None = None,
) -> Path:
    """Hugging Face ``food101`` Parquet shards under ``base/data``.

    Columns ``image`` (struct ``{bytes, path}``) and ``label`` (index into the 101
    Food-101 class names), rows grouped by class like the published files, written
    as ``train-0000i-of-0000n.parquet`` and ``validation-...``. ``extra_rows``
    appends raw ``(bytes, label)`` rows to a split ("train"/"validation").
    Returns ``base``.
    """
    image_type = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
    schema = pa.schema([pa.field("image", image_type), pa.field("label", pa.int64())])
    (base / "data").mkdir(parents=True, exist_ok=True)
    for split, column, n_shards in (("train", 0, train_shards), ("validation", 1, val_shards)):
        rows = []
        for name, split_counts in counts.items():
            label = FOOD101_CLASSES.index(name)
            for i in range(split_counts[column]):
                path = f"food-101/images/{name}/{split}{i}.jpg"
                rows.append(({"bytes": jpeg_bytes(class_colour(name), size, seed=i + 50 * column), "path": path}, label))
        for data, label in (extra_rows or {}).get(split, []):
            rows.append(({"bytes": data, "path": None}, label))
        per_shard = -(-len(rows) // n_shards)
        for shard in range(n_shards):
            part = rows[shard * per_shard : (shard + 1) * per_shard]
            table = pa.table({"image": [r[0] for r in part], "label": [r[1] for r in part]}, schema=schema)
            target = base / "data" / f"{split}-{shard:05d}-of-{n_shards:05d}.parquet"
            pq.write_table(table, target, row_group_size=rows_per_group)
    return base


def make_imagefolder_tree(
    base: Path,
    counts: dict[str, int],
    *,
    size: tuple[int, int] = (48, 36),
    extensions: tuple[str, ...] = (".jpg", ".png"),
) -> Path:
    """``base/<class>/<n>.<ext>`` with ``counts[class]`` images, cycling through ``extensions``."""
    for name, count in counts.items():
        folder = base / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            ext = extensions[i % len(extensions)]
            if ext in (".jpg", ".jpeg"):
                (folder / f"{i:04d}{ext}").write_bytes(jpeg_bytes(class_colour(name), size, seed=i))
            else:
                pixels = Image.open(io.BytesIO(jpeg_bytes(class_colour(name), size, seed=i))).convert("RGB")
                pixels.save(folder / f"{i:04d}{ext}")
    return base


PALETTE = [(220, 40, 40), (40, 200, 60), (40, 60, 220), (230, 200, 30), (160, 40, 200)]


def write_tiny_dataset(root: Path, classes: list[str], per_class: dict[str, int], image_size: int = 16,
                       rows_per_group: int = 8, seed: int = 0) -> Path:
    """Write a small dataset in the preprocess stage's layout: ``<root>/{train,val}/part-*.parquet`` and
    ``_manifest.json``. Each class is a noisy flat colour, so a network can learn it in an epoch or two."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    for split, n_per_class in per_class.items():
        rows = []
        for label, name in enumerate(classes):
            for i in range(n_per_class):
                base = PALETTE[label % len(PALETTE)]
                image = Image.new("RGB", (image_size, image_size),
                                  tuple(max(0, min(255, c + rng.randint(-30, 30))) for c in base))
                buffer = io.BytesIO()
                image.save(buffer, format="JPEG", quality=90)
                rows.append({"image": buffer.getvalue(), "label": label, "class_name": name, "split": split,
                             "path": f"{split}/{name}/{i:04d}.jpg"})
        counts[split] = len(rows)
        out = root / split
        out.mkdir(parents=True, exist_ok=True)
        schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("class_name", pa.string()),
                            ("split", pa.string()), ("path", pa.string())])
        # Two files, so the dataset has to map indices across files as well as row groups.
        half = (len(rows) + 1) // 2
        for part, chunk in enumerate([rows[:half], rows[half:]]):
            if chunk:
                pq.write_table(pa.Table.from_pylist(chunk, schema=schema), out / f"part-{part:05d}.parquet",
                               row_group_size=rows_per_group)
    (root / "_manifest.json").write_text(json.dumps({
        "classes": classes, "counts": counts, "image_size": image_size, "skipped": {},
        "fingerprint": "test", "source": "synthetic"}), encoding="utf-8")
    return root
