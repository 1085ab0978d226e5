"""What every source produces, and the rules all sources share.

A photo source lists its images as a :class:`SourceListing` of :class:`SourceItem`;
an array source (:mod:`workloads.vision.sources.arrays`) loads its pixels whole. Both pick
their images the same way, with the helpers here:

- class names: a spec names classes by display name ("fried rice") or folder name
  ("fried_rice"); :func:`resolve_classes` maps them onto the source's own names;
- selection: :func:`split_train_val` and :func:`cap_per_class` are seeded, so every
  machine and every run picks the same images;
- reuse: :func:`stat_signature` identifies an input file by size and modification time.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from workloads.vision.config import DataConfig
from workloads.vision.errors import DataSourceError

SPLITS = ("train", "val")

# Display names whose Food-101 folder is not simply the name with underscores.
_DISPLAY_TO_FOLDER = {"pancake": "pancakes", "burrito": "breakfast_burrito"}

_ROOT_HINT = "point the spec at local data, e.g. --set workload.data.root=/path/to/{example} (nothing is downloaded)"


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
        """How many items belong to ``split``."""
        return sum(1 for item in self.items if item.split == split)


def source_description(listing: SourceListing) -> str:
    """One line naming the source, for logs."""
    where = f" at {listing.root}" if listing.root is not None else ""
    return (
        f"source {listing.source}{where}: {listing.count('train')} train + {listing.count('val')} val images, "
        f"{len(listing.classes)} classes"
    )


# ---------------------------------------------------------------------------
# Class names


def food101_folder(name: str) -> str:
    """Food-101 folder name for a display name ("fried rice" → "fried_rice")."""
    key = " ".join(name.strip().lower().replace("_", " ").split())
    return _DISPLAY_TO_FOLDER.get(key, key.replace(" ", "_"))


def display_name(name: str) -> str:
    """Human-readable class name ("fried_rice" → "fried rice"); display names pass unchanged."""
    return " ".join(name.strip().replace("_", " ").split())


def check_requested_classes(classes: list[str]) -> None:
    """Refuse empty class names and two names for the same class."""
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


def resolve_classes(requested: list[str], available: list[str], where: str, looked_for: str) -> list[str]:
    """Map each requested name onto one of ``available`` (the source's own names).

    ``looked_for`` says what was searched for a name, with ``{folder}`` standing for
    its Food-101 folder name; it goes into the error for a class that is not there.
    """
    by_lower = {name.lower(): name for name in available}
    resolved = []
    for name in requested:
        candidates = [food101_folder(name), name.strip(), name.strip().replace(" ", "_"), display_name(name)]
        match = next((by_lower[c.lower()] for c in candidates if c.lower() in by_lower), None)
        if match is None:
            raise DataSourceError(
                f"class {name!r} was not found in {where}: looked for {looked_for.format(folder=food101_folder(name))}. "
                f"Available classes: {preview_names(available)}. Fix data.classes or data.root."
            )
        resolved.append(match)
    return resolved


def preview_names(names: list[str], limit: int = 25) -> str:
    """The first ``limit`` names, comma-separated, with the total when there are more."""
    if not names:
        return "(none)"
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in total)" if len(names) > limit else "")


# ---------------------------------------------------------------------------
# Finding the data and choosing images


def root_hint(example: str) -> str:
    """The advice every "data not found" error ends with."""
    return _ROOT_HINT.format(example=example)


def require_root(data: DataConfig, example: str) -> Path:
    """``data.root``, expanded; raises :class:`DataSourceError` when it does not exist."""
    root = Path(data.root).expanduser()
    if not root.exists():
        raise DataSourceError(
            f"data.root {str(root)!r} does not exist (source {data.source!r}); " + root_hint(example)
        )
    return root


def seeded_rng(seed: int, *parts: object) -> random.Random:
    """A random generator determined by ``seed`` and ``parts``."""
    # String seeds hash deterministically (unlike hash()), so splits and caps are
    # the same on every machine and every run.
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def cap_per_class(entries: list, max_per_class: int | None, seed: int, *key: object) -> list:
    """Keep at most ``max_per_class`` entries, a seeded sample, in their original order."""
    if max_per_class is None or len(entries) <= max_per_class:
        return entries
    keep = set(seeded_rng(seed, "cap", *key).sample(range(len(entries)), max_per_class))
    return [e for i, e in enumerate(entries) if i in keep]


def split_train_val(entries: list, val_fraction: float, seed: int, key: object) -> tuple[list, list]:
    """Seeded split of one class's entries; at least one on each side when there are two or more."""
    order = list(range(len(entries)))
    seeded_rng(seed, "split", key).shuffle(order)
    n_val = round(len(entries) * val_fraction)
    if len(entries) >= 2:
        n_val = min(max(n_val, 1), len(entries) - 1)
    else:
        n_val = 0
    val_idx = set(order[:n_val])
    train = [e for i, e in enumerate(entries) if i not in val_idx]
    val = [e for i, e in enumerate(entries) if i in val_idx]
    return train, val


def stat_signature(path: Path, base: Path) -> tuple | None:
    """(path relative to ``base``, size, mtime in ns) of a file, or None when it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (path.relative_to(base).as_posix(), st.st_size, st.st_mtime_ns)


_SHARD_SPLIT_PATTERN = re.compile(r"(?:^|[-_/.])(train|training|validation|valid|val|test)(?=$|[-_/.])", re.IGNORECASE)


def shard_split(relative: str) -> str | None:
    """'train'/'val'/'test' for a Hugging Face shard path like data/train-00000-of-00008.parquet."""
    found = _SHARD_SPLIT_PATTERN.findall(relative.lower())
    if not found:
        return None
    word = found[-1]
    if word.startswith("train"):
        return "train"
    return "test" if word == "test" else "val"
