"""Fixtures in the exact on-disk formats of MNIST (IDX), CIFAR-10 (python batches, Parquet shards).

Images are small and learnable: each class has its own pattern, so a network
separates them within an epoch or two. ``write_digits_as_mnist`` turns
scikit-learn's bundled handwritten digits into real MNIST files.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np

MNIST_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def idx_bytes(array: np.ndarray) -> bytes:
    """An uint8 array in the IDX format: magic (0, 0, type 0x08, ndim), big-endian sizes, data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_mnist(root: Path, splits: dict[str, tuple[np.ndarray, np.ndarray]], gz: bool = False) -> Path:
    """Write ``{"train"|"test": (images N×28×28, labels N)}`` as torchvision's ``<root>/MNIST/raw`` files."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, (images, labels) in splits.items():
        for name, array in zip(MNIST_NAMES[split], (images, labels)):
            data = idx_bytes(array)
            if gz:
                (raw / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (raw / name).write_bytes(data)
    return root


def pattern_images(labels: np.ndarray, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """uint8 images whose class shows as a bright bar at a class-dependent row, plus noise."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 40, size=(len(labels), *shape), dtype=np.uint8)
    height = shape[0]
    for i, label in enumerate(labels):
        row = int(label) * (height - 3) // 9
        images[i, row:row + 3] = 230
    return images


def write_pattern_mnist(root: Path, per_class: dict[str, int], gz: bool = False) -> Path:
    """A tiny MNIST of bar patterns: ``per_class`` images of each digit per split."""
    splits = {}
    for index, (split, count) in enumerate(per_class.items()):
        labels = np.repeat(np.arange(10, dtype=np.uint8), count)
        splits[split] = (pattern_images(labels, (28, 28), seed=index), labels)
    return write_mnist(root, splits, gz=gz)


def write_digits_as_mnist(root: Path, test_fraction: float = 0.2, seed: int = 0) -> tuple[int, int]:
    """scikit-learn's 1797 handwritten digits (8×8, 17 grey levels) as MNIST: white 20×20 digits centred in 28×28.

    Returns the train and test counts.
    """
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.zeros((len(digits.images), 28, 28), dtype=np.uint8)
    for i, small in enumerate(digits.images):
        grey = Image.fromarray((small * (255 / 16)).astype(np.uint8))
        images[i, 4:24, 4:24] = np.asarray(grey.resize((20, 20), Image.Resampling.BILINEAR))
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(len(images) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    labels = digits.target.astype(np.uint8)
    write_mnist(root, {"train": (images[train], labels[train]), "test": (images[test], labels[test])})
    return len(train), len(test)


CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _cifar_split(count_per_class: int, seed: int) -> tuple[np.ndarray, list[int]]:
    labels = np.repeat(np.arange(10), count_per_class)
    images = pattern_images(labels, (32, 32, 3), seed=seed)
    images[..., 0] = np.clip(images[..., 0].astype(int) + labels[:, None, None] * 20, 0, 255)  # and a tint
    return images, labels.tolist()


def write_cifar_batches(root: Path, train_per_class: int, test_per_class: int) -> Path:
    """The CIFAR-10 python layout: ``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``.

    Pickled as the originals are: dicts whose ``data`` is an N×3072 uint8 array of
    planar rows (1024 red, then green, then blue values) and ``labels`` a list.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = _cifar_split(train_per_class, seed=1)
    order = np.random.default_rng(0).permutation(len(labels))
    for batch, part in enumerate(np.array_split(order, 5), start=1):
        _dump_batch(folder / f"data_batch_{batch}", images[part], [labels[i] for i in part], f"training batch {batch} of 5")
    test_images, test_labels = _cifar_split(test_per_class, seed=2)
    _dump_batch(folder / "test_batch", test_images, test_labels, "testing batch 1 of 1")
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"num_cases_per_batch": len(labels) // 5, "label_names": CIFAR_CLASSES, "num_vis": 3072}, handle,
                    protocol=2)
    return root


def _dump_batch(path: Path, images: np.ndarray, labels: list[int], name: str) -> None:
    planar = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    batch = {"batch_label": name, "labels": labels, "data": planar,
             "filenames": [f"img_{i:05d}.png" for i in range(len(labels))]}
    with open(path, "wb") as handle:
        pickle.dump(batch, handle, protocol=2)


def write_cifar_parquet(root: Path, train_per_class: int, test_per_class: int) -> Path:
    """The Hugging Face cifar10 layout: ``plain_text/{train,test}-00000-of-00001.parquet`` with ``img``
    (struct of PNG ``bytes`` and ``path``) and ``label``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    folder = root / "plain_text"
    folder.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", train_per_class, 1), ("test", test_per_class, 2)):
        images, labels = _cifar_split(count, seed)
        cells = []
        for pixels in images:
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            cells.append({"bytes": buffer.getvalue(), "path": None})
        table = pa.table({"img": pa.array(cells, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          "label": pa.array(labels, type=pa.int64())})
        pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")
    return root
