"""Where the vision workload's images come from.

Each source turns a :class:`DataConfig` into a :class:`SourceListing`: the classes
that were asked for, one :class:`SourceItem` per image to process (with its split
and label) and a signature of the inputs used to decide whether an earlier run can
be reused. Listing is cheap (file names, sizes, label columns); decoding happens
later, in parallel, in :mod:`workloads.vision.preprocess`.

Sources never download anything: a missing dataset is an error that says where to
point ``workload.data.root``.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from workloads.vision.config import DataConfig

# Folder names of the 101 Food-101 classes, in the order of the official
# meta/classes.txt. Hugging Face's ``food101`` labels index into this list. It is
# alphabetical except that "cheesecake" precedes "cheese_plate" (the original list
# was sorted ignoring the underscore), so it must not be re-sorted.
FOOD101_CLASSES: tuple[str, ...] = (
    "apple_pie", "baby_back_ribs", "baklava", "beef_carpaccio", "beef_tartare", "beet_salad",
    "beignets", "bibimbap", "bread_pudding", "breakfast_burrito", "bruschetta", "caesar_salad",
    "cannoli", "caprese_salad", "carrot_cake", "ceviche", "cheesecake", "cheese_plate",
    "chicken_curry", "chicken_quesadilla", "chicken_wings", "chocolate_cake", "chocolate_mousse",
    "churros", "clam_chowder", "club_sandwich", "crab_cakes", "creme_brulee", "croque_madame",
    "cup_cakes", "deviled_eggs", "donuts", "dumplings", "edamame", "eggs_benedict", "escargots",
    "falafel", "filet_mignon", "fish_and_chips", "foie_gras", "french_fries", "french_onion_soup",
    "french_toast", "fried_calamari", "fried_rice", "frozen_yogurt", "garlic_bread", "gnocchi",
    "greek_salad", "grilled_cheese_sandwich", "grilled_salmon", "guacamole", "gyoza", "hamburger",
    "hot_and_sour_soup", "hot_dog", "huevos_rancheros", "hummus", "ice_cream", "lasagna",
    "lobster_bisque", "lobster_roll_sandwich", "macaroni_and_cheese", "macarons", "miso_soup",
    "mussels", "nachos", "omelette", "onion_rings", "oysters", "pad_thai", "paella", "pancakes",
    "panna_cotta", "peking_duck", "pho", "pizza", "pork_chop", "poutine", "prime_rib",
    "pulled_pork_sandwich", "ramen", "ravioli", "red_velvet_cake", "risotto", "samosa", "sashimi",
    "scallops", "seaweed_salad", "shrimp_and_grits", "spaghetti_bolognese", "spaghetti_carbonara",
    "spring_rolls", "steak", "strawberry_shortcake", "sushi", "tacos", "takoyaki", "tiramisu",
    "tuna_tartare", "waffles",
)

# Display names whose Food-101 folder is not simply the name with underscores.
_DISPLAY_TO_FOLDER = {"pancake": "pancakes", "burrito": "breakfast_burrito"}

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

# Bumped when the synthetic images change, so that earlier datasets are not reused.
SYNTHETIC_VERSION = 1

SPLITS = ("train", "val")

_ROOT_HINT = "point the spec at local data, e.g. --set workload.data.root=/path/to/{example} (nothing is downloaded)"


class DataSourceError(ValueError):
    """The configured data cannot be read as asked (missing root, unknown class, ...)."""


@dataclass(frozen=True)
class SourceItem:
    """One image to preprocess. Exactly one way of getting its pixels is set:
    ``file`` (a file on disk), ``shard``/``row_group``/``row`` (a row of a Parquet
    shard) or ``synthetic_seed`` (generated)."""

    split: str
    label: int
    path: str
    file: Path | None = None
    shard: Path | None = None
    row_group: int = -1
    row: int = -1
    synthetic_seed: int | None = None


@dataclass
class SourceListing:
    """Everything a source found, before any image is decoded."""

    source: str
    root: Path | None
    classes: list[str]  # display names, in label order
    folders: list[str]  # the source's own class names, same order
    items: list[SourceItem]
    signature: list[tuple]  # what identifies the inputs (files with size and mtime)
    skipped: Counter = field(default_factory=Counter)  # inputs dropped while listing

    def count(self, split: str) -> int:
        return sum(1 for item in self.items if item.split == split)


def food101_folder(name: str) -> str:
    """Food-101 folder name for a display name ("fried rice" → "fried_rice")."""
    key = " ".join(name.strip().lower().replace("_", " ").split())
    return _DISPLAY_TO_FOLDER.get(key, key.replace(" ", "_"))


def display_name(name: str) -> str:
    """Human-readable class name ("fried_rice" → "fried rice"); display names pass unchanged."""
    return " ".join(name.strip().replace("_", " ").split())


def list_source(data: DataConfig) -> SourceListing:
    """List the images ``data`` asks for; raises :class:`DataSourceError` on bad input."""
    _check_requested_classes(data.classes)
    listers = {
        "food101": _list_food101,
        "hf_parquet": _list_hf_parquet,
        "imagefolder": _list_imagefolder,
        "synthetic": _list_synthetic,
    }
    return listers[data.source](data)


# ---------------------------------------------------------------------------
# Class names


def _check_requested_classes(classes: list[str]) -> None:
    seen: dict[str, str] = {}
    for name in classes:
        if not name.strip():
            raise DataSourceError("data.classes contains an empty class name")
        folder = food101_folder(name)
        if folder in seen:
            raise DataSourceError(
                f"data.classes names the same class twice: {seen[folder]!r} and {name!r} both mean {folder!r}"
            )
        seen[folder] = name


def _resolve_classes(requested: list[str], available: list[str], where: str, looked_for: str) -> list[str]:
    """Map each requested name onto one of ``available`` (the source's own names)."""
    by_lower = {name.lower(): name for name in available}
    resolved = []
    for name in requested:
        candidates = [food101_folder(name), name.strip(), name.strip().replace(" ", "_"), display_name(name)]
        match = next((by_lower[c.lower()] for c in candidates if c.lower() in by_lower), None)
        if match is None:
            raise DataSourceError(
                f"class {name!r} was not found in {where}: looked for {looked_for.format(folder=food101_folder(name))}. "
                f"Available classes: {_preview(available)}. Fix data.classes or data.root."
            )
        resolved.append(match)
    return resolved


def _preview(names: list[str], limit: int = 25) -> str:
    if not names:
        return "(none)"
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in total)" if len(names) > limit else "")


# ---------------------------------------------------------------------------
# Shared helpers


def _require_root(data: DataConfig, example: str) -> Path:
    root = Path(data.root).expanduser()
    if not root.exists():
        raise DataSourceError(
            f"data.root {str(root)!r} does not exist (source {data.source!r}); " + _ROOT_HINT.format(example=example)
        )
    return root


def _rng(seed: int, *parts: object) -> random.Random:
    # String seeds hash deterministically (unlike hash()), so splits and caps are
    # the same on every machine and every run.
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def _cap(entries: list, max_per_class: int | None, seed: int, *key: object) -> list:
    """Keep at most ``max_per_class`` entries, a seeded sample, in their original order."""
    if max_per_class is None or len(entries) <= max_per_class:
        return entries
    keep = set(_rng(seed, "cap", *key).sample(range(len(entries)), max_per_class))
    return [e for i, e in enumerate(entries) if i in keep]


def split_train_val(entries: list, val_fraction: float, seed: int, key: object) -> tuple[list, list]:
    """Seeded split of one class's entries; at least one on each side when there are two or more."""
    order = list(range(len(entries)))
    _rng(seed, "split", key).shuffle(order)
    n_val = round(len(entries) * val_fraction)
    if len(entries) >= 2:
        n_val = min(max(n_val, 1), len(entries) - 1)
    else:
        n_val = 0
    val_idx = set(order[:n_val])
    train = [e for i, e in enumerate(entries) if i not in val_idx]
    val = [e for i, e in enumerate(entries) if i in val_idx]
    return train, val


def _stat_signature(path: Path, base: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (path.relative_to(base).as_posix(), st.st_size, st.st_mtime_ns)


# ---------------------------------------------------------------------------
# Official Food-101 layout


def _find_food101_dir(root: Path) -> Path | None:
    def looks_like(path: Path) -> bool:
        return (path / "images").is_dir() and (path / "meta").is_dir()

    for candidate in (root, root / "food-101", root / "food101", root / "food-101" / "food-101"):
        if looks_like(candidate):
            return candidate
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if child.is_dir() and looks_like(child):
                return child
    return None


def _read_food101_split(meta: Path, split_file: str) -> list[str]:
    """Image ids ("pizza/1001116") of one official split, from the .txt or .json file."""
    txt, js = meta / f"{split_file}.txt", meta / f"{split_file}.json"
    if txt.is_file():
        return [line.strip() for line in txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    if js.is_file():
        try:
            by_class = json.loads(js.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataSourceError(f"{js} is not valid JSON ({exc}); restore it from the Food-101 archive") from None
        return [image_id for ids in by_class.values() for image_id in ids]
    raise DataSourceError(
        f"Food-101 split file missing: neither {txt} nor {js} exists; the meta/ folder of the Food-101 archive is needed"
    )


def _list_food101(data: DataConfig) -> SourceListing:
    root = _require_root(data, "food-101")
    base = _find_food101_dir(root)
    if base is None:
        raise DataSourceError(
            f"no Food-101 dataset under {str(root)!r}: looked for images/<class>/<id>.jpg and meta/classes.txt, "
            f"meta/train.txt, meta/test.txt in that folder and in {str(root / 'food-101')!r}; "
            + _ROOT_HINT.format(example="food-101")
        )
    meta, images = base / "meta", base / "images"
    classes_txt = meta / "classes.txt"
    if classes_txt.is_file():
        available = [line.strip() for line in classes_txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        available = sorted(p.name for p in images.iterdir() if p.is_dir())
    folders = _resolve_classes(data.classes, available, str(base), "images/{folder}/ listed in meta/classes.txt")

    # Official split: train → "train", test → "val".
    ids_by_split = {"train": _read_food101_split(meta, "train"), "val": _read_food101_split(meta, "test")}
    label_of = {folder: label for label, folder in enumerate(folders)}
    items: list[SourceItem] = []
    signature: list[tuple] = []
    skipped: Counter = Counter()
    for meta_file in sorted(meta.iterdir()):
        if meta_file.suffix in (".txt", ".json"):
            signature.append(_stat_signature(meta_file, base))
    per_class_found = Counter()
    for split, ids in ids_by_split.items():
        by_class: dict[str, list[str]] = {folder: [] for folder in folders}
        for image_id in ids:
            folder = image_id.split("/", 1)[0]
            if folder in by_class:
                by_class[folder].append(image_id)
        for folder in folders:
            for image_id in _cap(by_class[folder], data.max_per_class, data.seed, split, folder):
                path = images / f"{image_id}.jpg"
                sig = _stat_signature(path, base)
                if sig is None:
                    skipped["missing"] += 1
                    continue
                signature.append(sig)
                per_class_found[folder] += 1
                items.append(SourceItem(split=split, label=label_of[folder], path=str(path), file=path))
    for folder, requested in zip(folders, data.classes):
        if per_class_found[folder] == 0:
            raise DataSourceError(
                f"class {requested!r} has no images in {str(base)!r}: looked for {str(images / folder)}/<id>.jpg files "
                f"listed in meta/train and meta/test. Classes with images there: "
                f"{_preview(_food101_classes_with_images(images, available))}."
            )
    return SourceListing("food101", base, [display_name(n) for n in data.classes], folders, items, signature, skipped)


def _food101_classes_with_images(images: Path, available: list[str]) -> list[str]:
    return [name for name in available if (images / name).is_dir() and any((images / name).glob("*.jpg"))]


# ---------------------------------------------------------------------------
# ImageFolder: <root>/<class>/<image>


def _list_imagefolder(data: DataConfig) -> SourceListing:
    root = _require_root(data, "images")
    if not root.is_dir():
        raise DataSourceError(f"data.root {str(root)!r} is not a directory; the imagefolder source expects <root>/<class>/<image files>")
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not available:
        raise DataSourceError(
            f"no class folders in {str(root)!r}: the imagefolder source expects <root>/<class>/<image files> "
            f"({', '.join(sorted(IMAGE_EXTENSIONS))}); " + _ROOT_HINT.format(example="images")
        )
    folders = _resolve_classes(data.classes, available, str(root), "a folder named {folder!r} (or the name as written)")
    items: list[SourceItem] = []
    signature: list[tuple] = []
    for label, (folder, requested) in enumerate(zip(folders, data.classes)):
        files = sorted(
            p for p in (root / folder).rglob("*")
            if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")
        )
        if not files:
            raise DataSourceError(
                f"class {requested!r} has no images: {str(root / folder)!r} holds no files ending in "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}. Classes in {str(root)!r}: {_preview(available)}."
            )
        train, val = split_train_val(files, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train), ("val", val)):
            for path in _cap(chosen, data.max_per_class, data.seed, split, folder):
                sig = _stat_signature(path, root)
                if sig is None:
                    continue
                signature.append(sig)
                items.append(SourceItem(split=split, label=label, path=str(path), file=path))
    return SourceListing("imagefolder", root, [display_name(n) for n in data.classes], folders, items, signature)


# ---------------------------------------------------------------------------
# Hugging Face food101 Parquet shards

_HF_SPLIT_PATTERN = re.compile(r"(?:^|[-_/.])(train|training|validation|valid|val|test)(?=$|[-_/.])", re.IGNORECASE)


def _hf_split_of(relative: str) -> str | None:
    """'train'/'val'/'test' for a shard path like data/train-00000-of-00008.parquet."""
    found = _HF_SPLIT_PATTERN.findall(relative.lower())
    if not found:
        return None
    word = found[-1]
    if word.startswith("train"):
        return "train"
    return "test" if word == "test" else "val"


def _hf_label_names(schema_metadata: dict | None) -> list[str] | None:
    """Class names stored by the ``datasets`` library in the schema metadata, if any."""
    raw = (schema_metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        features = json.loads(raw)["info"]["features"]
        names = features["label"]["names"]
    except (KeyError, TypeError, ValueError):
        return None
    return list(names) if isinstance(names, list) and names else None


def _list_hf_parquet(data: DataConfig) -> SourceListing:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = _require_root(data, "food101 (the folder holding data/train-*.parquet)")
    shards = [root] if root.is_file() else sorted(p for p in root.rglob("*.parquet") if p.is_file())
    base = root.parent if root.is_file() else root
    by_split: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
    for shard in shards:
        split = _hf_split_of(shard.relative_to(base).as_posix())
        if split is not None:
            by_split[split].append(shard)
    if not by_split["val"]:
        # food101 ships "validation"; accept "test" shards when that is all there is.
        by_split["val"] = by_split["test"]
    if not by_split["train"]:
        raise DataSourceError(
            f"no Hugging Face Parquet shards under {str(root)!r}: looked for files like data/train-00000-of-00008.parquet "
            f"and data/validation-00000-of-00003.parquet (found {len(shards)} .parquet file(s) without a train split); "
            + _ROOT_HINT.format(example="food101")
        )

    label_names: list[str] | None = None
    signature: list[tuple] = []
    # (split, label) → [(shard, row_group, row)], in shard order
    rows: dict[tuple[str, int], list[tuple[Path, int, int]]] = {}
    for split in ("train", "val"):
        for shard in by_split[split]:
            try:
                parquet = pq.ParquetFile(shard)
            except Exception as exc:  # pyarrow raises several types for a damaged file
                raise DataSourceError(f"cannot read Parquet shard {str(shard)!r}: {exc}") from None
            schema = parquet.schema_arrow
            if "image" not in schema.names or "label" not in schema.names:
                raise DataSourceError(
                    f"{str(shard)!r} is not a Hugging Face food101 shard: expected columns 'image' "
                    f"(struct of bytes and path) and 'label', found {schema.names}"
                )
            label_type = schema.field("label").type
            if not pa.types.is_integer(label_type):
                raise DataSourceError(
                    f"{str(shard)!r} has a 'label' column of type {label_type}; a Hugging Face food101 shard "
                    "holds integer class indices there"
                )
            label_names = label_names or _hf_label_names(schema.metadata)
            signature.append(_stat_signature(shard, base))
            for group in range(parquet.num_row_groups):
                labels = parquet.read_row_group(group, columns=["label"]).column("label").to_pylist()
                for row, label in enumerate(labels):
                    if label is not None:
                        rows.setdefault((split, int(label)), []).append((shard, group, row))

    names = label_names or list(FOOD101_CLASSES)
    folders = _resolve_classes(data.classes, names, str(root), "label {folder!r} among the food101 class names")
    items: list[SourceItem] = []
    have_val = bool(by_split["val"])
    for label, (folder, requested) in enumerate(zip(folders, data.classes)):
        hf_label = names.index(folder)
        train_rows = rows.get(("train", hf_label), [])
        val_rows = rows.get(("val", hf_label), [])
        if not train_rows and not val_rows:
            present = sorted({names[lab] for (_, lab) in rows if 0 <= lab < len(names)})
            raise DataSourceError(
                f"class {requested!r} has no images in the shards under {str(root)!r}: looked for rows with "
                f"label {hf_label} ({folder}). Classes present: {_preview(present)}."
            )
        if not have_val:
            train_rows, val_rows = split_train_val(train_rows, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train_rows), ("val", val_rows)):
            for shard, group, row in _cap(chosen, data.max_per_class, data.seed, split, folder):
                ref = f"{shard.relative_to(base).as_posix()}#{group}:{row}"
                items.append(SourceItem(split=split, label=label, path=ref, shard=shard, row_group=group, row=row))
    unknown = sorted({lab for (_, lab) in rows if not 0 <= lab < len(names)})
    if unknown:
        raise DataSourceError(
            f"labels {unknown[:10]} in {str(root)!r} are outside the {len(names)} food101 class names; "
            "these shards are not the Hugging Face food101 dataset"
        )
    return SourceListing("hf_parquet", base, [display_name(n) for n in data.classes], folders, items, signature)


# ---------------------------------------------------------------------------
# Synthetic images (offline quickstart)


def _list_synthetic(data: DataConfig) -> SourceListing:
    folders = [food101_folder(name) for name in data.classes]
    items: list[SourceItem] = []
    for label, folder in enumerate(folders):
        indices = list(range(data.synthetic_per_class))
        train, val = split_train_val(indices, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train), ("val", val)):
            for index in _cap(chosen, data.max_per_class, data.seed, split, folder):
                seed = _rng(data.seed, "synthetic", folder, index).getrandbits(63)
                items.append(
                    SourceItem(split=split, label=label, path=f"synthetic/{folder}/{index:05d}", synthetic_seed=seed)
                )
    signature = [("synthetic", SYNTHETIC_VERSION, data.synthetic_per_class)]
    return SourceListing("synthetic", None, [display_name(n) for n in data.classes], folders, items, signature)


def render_synthetic(label: int, num_classes: int, seed: int, height: int):
    """A photo-sized RGB image (PIL) whose class shows in colour and stripe direction.

    Class ``label`` gets its own hue and stripe angle; position, size, stripe
    period, background and noise vary per image so that no two are alike.
    """
    import colorsys

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    height = max(16, height)
    width = round(height * 1.25)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)

    background = rng.uniform(60, 190, size=3).astype(np.float32)
    direction = rng.uniform(0, 2 * np.pi)
    gradient = (np.cos(direction) * xx + np.sin(direction) * yy) / max(width, height) * rng.uniform(-70, 70)
    image = background[None, None, :] + gradient[..., None]

    hue = (label / num_classes + rng.normal(0, 0.012)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.65, 0.95), rng.uniform(0.75, 1.0)), np.float32) * 255
    angle = np.pi * label / num_classes + rng.normal(0, 0.05)
    period = rng.uniform(0.14, 0.22) * height
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period + phase) > 0

    # Keep the shape inside the centre square that survives the crop.
    cx = width / 2 + rng.uniform(-0.18, 0.18) * height
    cy = height / 2 + rng.uniform(-0.18, 0.18) * height
    rx, ry = rng.uniform(0.22, 0.4, size=2) * height
    inside = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1.0
    foreground = np.where(stripes[..., None], colour[None, None, :], colour[None, None, :] * 0.45)
    image = np.where(inside[..., None], foreground, image)
    image += rng.normal(0, 10, size=image.shape).astype(np.float32)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")


def source_description(listing: SourceListing) -> str:
    """One line naming the source, for logs."""
    where = f" at {listing.root}" if listing.root is not None else ""
    return (
        f"source {listing.source}{where}: {listing.count('train')} train + {listing.count('val')} val images, "
        f"{len(listing.classes)} classes"
    )

