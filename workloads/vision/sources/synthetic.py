"""The ``synthetic`` source: generated photo-like images, for the offline quickstart.

Nothing is read from disk. Each listed item carries a seed; the preprocess stage's
tasks draw the image from it with :func:`render_synthetic`, so a listing is tiny and
the same seed always gives the same pixels.
"""

from __future__ import annotations

import colorsys

import numpy as np
from PIL import Image

from workloads.vision.config import DataConfig
from workloads.vision.sources.listing import (
    SourceItem,
    SourceListing,
    cap_per_class,
    display_name,
    food101_folder,
    seeded_rng,
    split_train_val,
)

# Bumped when the synthetic images change, so that earlier datasets are not reused.
SYNTHETIC_VERSION = 1


def list_synthetic(data: DataConfig) -> SourceListing:
    """``data.synthetic_per_class`` generated images per class, split and capped like files."""
    folders = [food101_folder(name) for name in data.classes]
    items: list[SourceItem] = []
    for label, folder in enumerate(folders):
        indices = list(range(data.synthetic_per_class))
        train, val = split_train_val(indices, data.val_fraction, data.seed, folder)
        for split, chosen in (("train", train), ("val", val)):
            for index in cap_per_class(chosen, data.max_per_class, data.seed, split, folder):
                seed = seeded_rng(data.seed, "synthetic", folder, index).getrandbits(63)
                items.append(
                    SourceItem(split=split, label=label, path=f"synthetic/{folder}/{index:05d}", synthetic_seed=seed)
                )
    signature = [("synthetic", SYNTHETIC_VERSION, data.synthetic_per_class)]
    return SourceListing("synthetic", None, [display_name(n) for n in data.classes], folders, items, signature)


def render_synthetic(label: int, num_classes: int, seed: int, height: int) -> Image.Image:
    """A photo-sized RGB image (PIL) whose class shows in colour and stripe direction.

    Class ``label`` gets its own hue and stripe angle; position, size, stripe
    period, background and noise vary per image so that no two are alike.
    """
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
