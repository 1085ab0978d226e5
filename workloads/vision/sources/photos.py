"""Where the vision workload's photos come from: Food-101, ImageFolder trees and Hugging Face shards.

:func:`list_source` turns a :class:`DataConfig` into a :class:`SourceListing`: the
classes that were asked for, one :class:`SourceItem` per image to process (with its
split and label) and a signature of the inputs used to decide whether an earlier run
can be reused. Listing is cheap (file names, sizes, label columns); decoding happens
later, in parallel, in the preprocess stage's tasks.

The listing types and the rules every source shares (class names, seeded splits and
caps) are in :mod:`workloads.vision.sources.listing`; generated images in
:mod:`workloads.vision.sources.synthetic`; MNIST and CIFAR-10, which hold pixel arrays
rather than files to decode, in :mod:`workloads.vision.sources.arrays`.

Sources never download anything: a missing dataset is an error that says where to
point ``workload.data.root``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError
from workloads.vision.sources.listing import (
    SourceItem,
    SourceListing,
    cap_per_class,
    check_requested_classes,
    display_name,
    preview_names,
    require_root,
    resolve_classes,
    root_hint,
    shard_split,
    split_train_val,
    stat_signature,
)
from workloads.vision.sources.synthetic import list_synthetic

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

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def list_source(data: DataConfig) -> SourceListing:
    """List the images ``data`` asks for; raises :class:`DataSourceError` on bad input."""
    check_requested_classes(data.classes)
    listers = {
        "food101": _list_food101,
        "hf_parquet": _list_hf_parquet,
        "imagefolder": _list_imagefolder,
        "synthetic": list_synthetic,
    }
    return listers[data.source](data)


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
    root = require_root(data, "food-101")
    base = _find_food101_dir(root)
    if base is None:
        raise DataSourceError(
            f"no Food-101 dataset under {str(root)!r}: looked for images/<class>/<id>.jpg and meta/classes.txt, "
            f"meta/train.txt, meta/test.txt in that folder and in {str(root / 'food-101')!r}; "
            + root_hint(example="food-101")
        )
    meta, images = base / "meta", base / "images"
    classes_txt = meta / "classes.txt"
    if classes_txt.is_file():
        available = [line.strip() for line in classes_txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        available = sorted(p.name for p in images.iterdir() if p.is_dir())
    folders = resolve_classes(data.classes, available, str(base), "images/{folder}/ listed in meta/classes.txt")

    # Official split: train → "train", test → "val".
    ids_by_split = {"train": _read_food101_split(meta, "train"), "val": _read_food101_split(meta, "test")}
    label_of = {folder: label for label, folder in enumerate(folders)}
    items: list[SourceItem] = []
    signature: list[tuple] = []
    skipped: Counter = Counter()
    for meta_file in sorted(meta.iterdir()):
        if meta_file.suffix in (".txt", ".json"):
            signature.append(stat_signature(meta_file, base))
    per_class_found = Counter()
    for split, ids in ids_by_split.items():
        by_class: dict[str, list[str]] = {folder: [] for folder in folders}
        for image_id in ids:
            folder = image_id.split("/", 1)[0]
            if folder in by_class:
                by_class[folder].append(image_id)
        for folder in folders:
            for image_id in cap_per_class(by_class[folder], data.max_per_class, data.seed, split, folder):
                path = images / f"{image_id}.jpg"
                sig = stat_signature(path, base)
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
                f"{preview_names(_food101_classes_with_images(images, available))}."
            )
    return SourceListing("food101", base, [display_name(n) for n in data.classes], folders, items, signature, skipped)


def _food101_classes_with_images(images: Path, available: list[str]) -> list[str]:
    return [name for name in available if (images / name).is_dir() and any((images / name).glob("*.jpg"))]


# ---------------------------------------------------------------------------
# ImageFolder: <root>/<class>/<image>


def _list_imagefolder(data: DataConfig) -> SourceListing:
    root = require_root(data, "images")
    if not root.is_dir():
        raise DataSourceError(f"data.root {str(root)!r} is not a directory; the imagefolder source expects <root>/<class>/<image files>")
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not available:
        raise DataSourceError(
            f"no class folders in {str(root)!r}: the imagefolder source expects <root>/<class>/<image files> "
            f"({', '.join(sorted(IMAGE_EXTENSIONS))}); " + root_hint(example="images")
        )
    folders = resolve_classes(data.classes, available, str(root), "a folder named {folder!r} (or the name as written)")
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
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}. Classes in {str(root)!r}: {preview_names(available)}."
            )
        train, val = split_train_val(files, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train), ("val", val)):
            for path in cap_per_class(chosen, data.max_per_class, data.seed, split, folder):
                sig = stat_signature(path, root)
                if sig is None:
                    continue
                signature.append(sig)
                items.append(SourceItem(split=split, label=label, path=str(path), file=path))
    return SourceListing("imagefolder", root, [display_name(n) for n in data.classes], folders, items, signature)


# ---------------------------------------------------------------------------
# Hugging Face food101 Parquet shards


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

    root = require_root(data, "food101 (the folder holding data/train-*.parquet)")
    shards = [root] if root.is_file() else sorted(p for p in root.rglob("*.parquet") if p.is_file())
    base = root.parent if root.is_file() else root
    by_split: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
    for shard in shards:
        split = shard_split(shard.relative_to(base).as_posix())
        if split is not None:
            by_split[split].append(shard)
    if not by_split["val"]:
        # food101 ships "validation"; accept "test" shards when that is all there is.
        by_split["val"] = by_split["test"]
    if not by_split["train"]:
        raise DataSourceError(
            f"no Hugging Face Parquet shards under {str(root)!r}: looked for files like data/train-00000-of-00008.parquet "
            f"and data/validation-00000-of-00003.parquet (found {len(shards)} .parquet file(s) without a train split); "
            + root_hint(example="food101")
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
            signature.append(stat_signature(shard, base))
            for group in range(parquet.num_row_groups):
                labels = parquet.read_row_group(group, columns=["label"]).column("label").to_pylist()
                for row, label in enumerate(labels):
                    if label is not None:
                        rows.setdefault((split, int(label)), []).append((shard, group, row))

    names = label_names or list(FOOD101_CLASSES)
    folders = resolve_classes(data.classes, names, str(root), "label {folder!r} among the food101 class names")
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
                f"label {hf_label} ({folder}). Classes present: {preview_names(present)}."
            )
        if not have_val:
            train_rows, val_rows = split_train_val(train_rows, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train_rows), ("val", val_rows)):
            for shard, group, row in cap_per_class(chosen, data.max_per_class, data.seed, split, folder):
                ref = f"{shard.relative_to(base).as_posix()}#{group}:{row}"
                items.append(SourceItem(split=split, label=label, path=ref, shard=shard, row_group=group, row=row))
    unknown = sorted({lab for (_, lab) in rows if not 0 <= lab < len(names)})
    if unknown:
        raise DataSourceError(
            f"labels {unknown[:10]} in {str(root)!r} are outside the {len(names)} food101 class names; "
            "these shards are not the Hugging Face food101 dataset"
        )
    return SourceListing("hf_parquet", base, [display_name(n) for n in data.classes], folders, items, signature)
