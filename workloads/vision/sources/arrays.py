"""Sources that hold decoded pixel arrays: MNIST (IDX files) and CIFAR-10.

They are small enough to load whole on the driver (MNIST: 55 MB, CIFAR-10:
180 MB), and need no decoding, so the preprocess stage writes them straight to
Parquet as raw uint8 arrays instead of fanning the work out to Ray tasks.

On-disk formats read here:

- MNIST, torchvision's layout: ``<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``,
  plain or ``.gz``, read with torchvision's IDX reader. With ``data.download``,
  torchvision fetches the files first.
- CIFAR-10 python batches: ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``.
- CIFAR-10 Parquet shards as on the Hugging Face hub: ``train-*.parquet`` and
  ``test-*.parquet`` with an ``img`` (or ``image``) struct of PNG bytes and a ``label``.
"""

from __future__ import annotations

import gzip
import io
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads.vision.config import ARRAY_SOURCES, DataConfig
from workloads.vision.images import CIFAR10_MEAN, CIFAR10_STD, MNIST_MEAN, MNIST_STD, ImageLayout
from workloads.vision.errors import DataSourceError
from workloads.vision.sources.listing import cap_per_class, resolve_classes, shard_split, stat_signature

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]


@dataclass
class ArraySplit:
    """One split: images ``N×H×W×C`` uint8, labels (0-based, in ``classes`` order) and where each row came from."""

    images: np.ndarray
    labels: np.ndarray
    paths: list[str]


@dataclass
class ArraySource:
    """A loaded array source, ready to be written."""

    source: str
    root: Path
    classes: list[str]
    folders: list[str]  # the source's own class names, same order
    layout: ImageLayout
    splits: dict[str, ArraySplit]


def source_signature(data: DataConfig) -> list[tuple]:
    """Size and modification time of every file the source would read, to tell whether a
    dataset written earlier still matches its inputs without loading them."""
    root = Path(data.root).expanduser()
    if data.source == "mnist":
        raw = _mnist_raw_dir(root)
        names = [name for pair in MNIST_FILES.values() for name in pair]
        files = [path for name in names for path in (raw / name, raw / f"{name}.gz") if path.is_file()]
    elif (batches := _cifar_batches_dir(root)) is not None:
        files = sorted(path for path in batches.iterdir() if path.is_file())
    else:
        files = sorted(root.rglob("*.parquet")) if root.is_dir() else []
    return [stat_signature(path, root) for path in files]


def load_array_source(data: DataConfig) -> ArraySource:
    """Load ``data.source`` ('mnist' or 'cifar10') from ``data.root``; raises :class:`DataSourceError` on bad input."""
    root = Path(data.root).expanduser()
    if data.source == "mnist":
        return _load_mnist(root, data)
    return _load_cifar10(root, data)


def _select(source: str, root: Path, data: DataConfig, all_classes: list[str], layout: ImageLayout,
            splits: dict[str, tuple[np.ndarray, np.ndarray, str | list[str]]]) -> ArraySource:
    """Keep the requested classes (relabelled in their order), capped per class, and name every row.

    Each split is (images, labels, where): ``where`` is the file every row comes
    from (rows are named ``file#index``) or a list naming each row.
    """
    folders = resolve_classes(data.classes, all_classes, str(root), "class {folder!r}")
    wanted = [all_classes.index(folder) for folder in folders]
    out: dict[str, ArraySplit] = {}
    for split, (images, labels, where) in splits.items():
        keep: list[int] = []
        new_labels: list[int] = []
        for new_label, original in enumerate(wanted):
            rows = np.flatnonzero(labels == original).tolist()
            rows = cap_per_class(rows, data.max_per_class, data.seed, split, all_classes[original])
            keep.extend(rows)
            new_labels.extend([new_label] * len(rows))
        order = np.argsort(np.asarray(keep, dtype=np.int64), kind="stable")
        kept = np.asarray(keep, dtype=np.int64)[order]
        names = [where[row] if isinstance(where, list) else f"{where}#{row}" for row in kept.tolist()]
        out[split] = ArraySplit(images[kept], np.asarray(new_labels, dtype=np.int64)[order], names)
    for label, name in enumerate(data.classes):
        if not any((part.labels == label).any() for part in out.values()):
            raise DataSourceError(f"class {name!r} has no images in {str(root)!r}")
    return ArraySource(source, root, [str(c) for c in folders], folders, layout, out)


# --------------------------------------------------------------------------- MNIST


def _mnist_raw_dir(root: Path) -> Path:
    for candidate in (root / "MNIST" / "raw", root / "raw", root):
        if any((candidate / name).exists() or (candidate / f"{name}.gz").exists()
               for name in MNIST_FILES["train"]):
            return candidate
    return root / "MNIST" / "raw"


def _load_mnist(root: Path, data: DataConfig) -> ArraySource:
    if data.download:
        from torchvision.datasets.mnist import MNIST

        try:
            MNIST(str(root), train=True, download=True)
            MNIST(str(root), train=False, download=True)
        except Exception as exc:  # noqa: BLE001 - urllib and torchvision raise several types offline
            raise DataSourceError(
                f"downloading MNIST into {str(root)!r} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
                "Without internet, copy the four IDX files into that folder's MNIST/raw/ and set data.download=false."
            ) from None
    raw = _mnist_raw_dir(root)
    splits: dict[str, tuple[np.ndarray, np.ndarray, str]] = {}
    with tempfile.TemporaryDirectory(prefix="rayjobs-mnist-") as scratch:
        for split, (images_name, labels_name) in MNIST_FILES.items():
            paths = [_mnist_file(raw, name, Path(scratch)) for name in (images_name, labels_name)]
            try:
                images = read_idx(paths[0][0], ndim=3)
                labels = read_idx(paths[1][0], ndim=1)
            except (OSError, ValueError) as exc:
                raise DataSourceError(
                    f"{paths[0][1]} or {paths[1][1]} is not a valid MNIST IDX file "
                    f"({type(exc).__name__}: {str(exc)[:200] or 'bad header'})"
                ) from None
            if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
                raise DataSourceError(
                    f"{paths[0][1]} holds images of shape {tuple(images.shape)} and {paths[1][1]} "
                    f"{labels.shape[0]} labels; MNIST is N×28×28 images with N labels"
                )
            splits[split] = (images[..., None], labels.astype(np.int64), paths[0][1].relative_to(root).as_posix())
    layout = ImageLayout("raw", 28, 28, 1, MNIST_MEAN, MNIST_STD, "shift")
    return _select("mnist", root, data, list(ARRAY_SOURCES["mnist"][1]), layout, splits)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """The unsigned bytes of an IDX file (MNIST's format: two zero bytes, the type code 0x08 for unsigned bytes,
    the number of dimensions, each dimension's size as a big-endian 32-bit integer, then the values), as an array
    of ``ndim`` dimensions.

    Read with numpy rather than torchvision's reader: importing torchvision costs a process about 5 CPU-s,
    far more than reading the files. Raises ValueError on a header or size that is not MNIST's."""
    data = bytearray(path.read_bytes())  # writable, as the arrays torchvision's reader returned were
    if len(data) < 4 + 4 * ndim or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] != ndim:
        raise ValueError(f"bad header: not {ndim}-dimensional unsigned bytes")
    shape = tuple(int(size) for size in np.frombuffer(data, ">i4", count=ndim, offset=4))
    values = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"has {values.size} values where its header says {' x '.join(map(str, shape))}")
    return values.reshape(shape)


def _mnist_file(raw: Path, name: str, scratch: Path) -> tuple[Path, Path]:
    """(path to read, path as found) for one IDX file; a ``.gz`` is unpacked into ``scratch``."""
    plain, packed = raw / name, raw / f"{name}.gz"
    if plain.is_file():
        return plain, plain
    if packed.is_file():
        target = scratch / name
        try:
            with gzip.open(packed, "rb") as source, open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
        except (OSError, EOFError) as exc:
            raise DataSourceError(f"{packed} is not a readable gzip file ({exc})") from None
        return target, packed
    raise DataSourceError(
        f"MNIST file {name} (or {name}.gz) not found in {str(raw)!r}: torchvision's layout is "
        "<root>/MNIST/raw/ with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
        "t10k-labels-idx1-ubyte. Point --set workload.data.root=... at the folder holding MNIST/, or set "
        "workload.data.download=true on a machine with internet."
    )


# --------------------------------------------------------------------------- CIFAR-10


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR batches (dicts of lists, bytes and numpy arrays) and nothing else.

    A pickle can run arbitrary code when loaded; the batches need only these few
    globals, so anything else in a file means it is not a CIFAR batch.
    """

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")


def _read_cifar_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            loaded = _ArrayUnpickler(handle, encoding="latin1").load()
    except FileNotFoundError:
        raise DataSourceError(f"CIFAR-10 batch {path} is missing; the archive's cifar-10-batches-py/ holds "
                              "data_batch_1..5, test_batch and batches.meta") from None
    except Exception as exc:  # noqa: BLE001 - unpickling damaged data raises many types
        raise DataSourceError(f"{path} is not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(loaded, dict):
        raise DataSourceError(f"{path} is not a CIFAR-10 python batch (it holds a {type(loaded).__name__})")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in loaded.items()}


def _cifar_batches_dir(root: Path) -> Path | None:
    for candidate in (root / "cifar-10-batches-py", root):
        if (candidate / "data_batch_1").is_file() or (candidate / "batches.meta").is_file():
            return candidate
    return None


def _load_cifar10(root: Path, data: DataConfig) -> ArraySource:
    layout = ImageLayout("raw", 32, 32, 3, CIFAR10_MEAN, CIFAR10_STD, "shift_flip")
    batches = _cifar_batches_dir(root)
    if batches is not None:
        splits, classes = _read_cifar_batches(root, batches)
    else:
        shards = sorted(root.rglob("*.parquet")) if root.is_dir() else []
        if not shards:
            raise DataSourceError(
                f"no CIFAR-10 data under {str(root)!r}: looked for the python batches (cifar-10-batches-py/"
                "data_batch_1..5, test_batch) and for Parquet shards (train-*.parquet, test-*.parquet). Point "
                "--set workload.data.root=... at the folder holding either (nothing is downloaded)."
            )
        splits, classes = _read_cifar_parquet(root, shards)
    return _select("cifar10", root, data, classes, layout, splits)


def _read_cifar_batches(root: Path, batches: Path):
    meta_path = batches / "batches.meta"
    classes = list(ARRAY_SOURCES["cifar10"][1])
    if meta_path.is_file():
        names = _read_cifar_pickle(meta_path).get("label_names")
        if isinstance(names, list) and len(names) == 10:
            classes = [str(n) for n in names]
    splits = {}
    for split, names in (("train", CIFAR_TRAIN_BATCHES), ("val", ["test_batch"])):
        images, labels, where = [], [], []
        for name in names:
            path = batches / name
            batch = _read_cifar_pickle(path)
            pixels, batch_labels = batch.get("data"), batch.get("labels")
            if not isinstance(pixels, np.ndarray) or batch_labels is None or pixels.ndim != 2 \
                    or pixels.shape[1] != 3072 or len(batch_labels) != pixels.shape[0]:
                raise DataSourceError(f"{path} is not a CIFAR-10 python batch: expected 'data' of shape N×3072 "
                                      "and N 'labels'")
            # Rows are planar (1024 red, 1024 green, 1024 blue values); the dataset stores H×W×C.
            images.append(pixels.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(np.asarray(batch_labels, dtype=np.int64))
            relative = path.relative_to(root).as_posix()
            where.extend(f"{relative}#{row}" for row in range(pixels.shape[0]))
        splits[split] = (np.concatenate(images), np.concatenate(labels), where)
    return splits, classes


def _read_cifar_parquet(root: Path, shards: list[Path]):
    import pyarrow.parquet as pq
    from PIL import Image

    classes = list(ARRAY_SOURCES["cifar10"][1])
    by_split: dict[str, list[Path]] = {"train": [], "val": []}
    for shard in shards:
        split = shard_split(shard.relative_to(root).as_posix())
        if split is not None:
            by_split["train" if split == "train" else "val"].append(shard)
    if not by_split["train"] or not by_split["val"]:
        raise DataSourceError(f"CIFAR-10 Parquet shards under {str(root)!r} need both train-*.parquet and "
                              f"test-*.parquet files; found {[s.name for s in shards]}")
    splits = {}
    for split, files in by_split.items():
        images, labels, where = [], [], []
        for shard in files:
            table = pq.read_table(shard)
            column = next((c for c in ("img", "image") if c in table.column_names), None)
            if column is None or "label" not in table.column_names:
                raise DataSourceError(f"{shard} is not a CIFAR-10 shard: expected an 'img' (or 'image') column of "
                                      f"encoded images and a 'label' column, found {table.column_names}")
            for cell in table.column(column).to_pylist():
                encoded = cell.get("bytes") if isinstance(cell, dict) else cell
                try:
                    with Image.open(io.BytesIO(encoded)) as image:
                        pixels = np.asarray(image.convert("RGB"))
                except Exception as exc:  # noqa: BLE001 - PIL raises several types for bad data
                    raise DataSourceError(f"{shard} holds an image that cannot be decoded ({exc})") from None
                if pixels.shape != (32, 32, 3):
                    raise DataSourceError(f"{shard} holds a {pixels.shape} image; CIFAR-10 images are 32×32 RGB")
                images.append(pixels)
            labels.append(np.asarray(table.column("label").to_pylist(), dtype=np.int64))
            relative = shard.relative_to(root).as_posix()
            where.extend(f"{relative}#{row}" for row in range(table.num_rows))
        splits[split] = (np.stack(images), np.concatenate(labels), where)
    return splits, classes
