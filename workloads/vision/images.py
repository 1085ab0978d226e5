"""Pixel work: how photos enter the dataset, how the dataset holds them, how they become model input.

The preprocess stage and single-image prediction turn any photo into the square
JPEG the dataset holds with :func:`square_jpeg_from_bytes`; :class:`ImageLayout`
records how the ``image`` column is encoded. Both ingestion modes of training, the
validation pass and batch inference then go through the same three steps, so they
see identical pixels:

1. :func:`decode_batch`: the ``image`` column (JPEG bytes, or raw uint8 arrays for
   MNIST and CIFAR-10) → a uint8 tensor ``N×C×H×W``; for training on a GPU,
   :func:`decode_jpegs_on` decodes the JPEGs on the device instead.
2. :func:`augment_batch` (training only): random crops, shifts and flips drawn
   per image, applied to the whole batch at once, on whichever device holds it.
3. :func:`normalize`: uint8 → float32 with the dataset's mean and std, on the
   device that runs the model (a uint8 batch is a quarter of the bytes to move).
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Iterable, Literal

import numpy as np
from PIL import Image

# torch is imported inside the functions that use it: the preprocess stage's tasks and Ray Data's
# coordinators load this module for the layout and the JPEG helpers alone, and importing torch
# would cost each of those processes about 2 CPU-seconds.
if TYPE_CHECKING:
    import torch

# ImageNet statistics: the values torchvision's pretrained models were trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

Augment = Literal["crop_flip", "shift_flip", "shift", "none"]


@dataclass(frozen=True)
class ImageLayout:
    """Encoding and shape of the ``image`` column, and the statistics to normalize with."""

    encoding: Literal["jpeg", "raw"]
    height: int
    width: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: Augment  # what ``train.augment: auto`` means for this data

    @classmethod
    def photos(cls, size: int) -> "ImageLayout":
        """Square RGB JPEGs written by the preprocess stage from photos or synthetic images."""
        return cls("jpeg", size, size, 3, IMAGENET_MEAN, IMAGENET_STD, "crop_flip")

    @classmethod
    def from_manifest(cls, manifest: dict) -> "ImageLayout":
        """The layout recorded in a dataset manifest (datasets from before layouts were recorded are JPEG photos)."""
        stored = manifest.get("layout")
        if not stored:
            return cls.photos(int(manifest["image_size"]))
        return cls(
            encoding=stored["encoding"], height=int(stored["height"]), width=int(stored["width"]),
            channels=int(stored["channels"]), mean=tuple(stored["mean"]), std=tuple(stored["std"]),
            augment=stored["augment"],
        )

    def to_dict(self) -> dict:
        """JSON-ready form, for manifests and checkpoints."""
        return {**asdict(self), "mean": list(self.mean), "std": list(self.std)}

    def with_imagenet_statistics(self) -> "ImageLayout":
        """This layout normalized as torchvision's ImageNet models expect (grey: the channel average)."""
        if self.channels == 3:
            return replace(self, mean=IMAGENET_MEAN, std=IMAGENET_STD)
        return replace(self, mean=(sum(IMAGENET_MEAN) / 3,) * self.channels, std=(sum(IMAGENET_STD) / 3,) * self.channels)

    def resolve_augment(self, requested: str) -> Augment:
        """``train.augment`` with ``auto`` replaced by the data's own choice."""
        return self.augment if requested == "auto" else requested  # type: ignore[return-value]


def decode_one(data: bytes, layout: ImageLayout) -> np.ndarray:
    """One stored image → uint8 array ``H×W×C``."""
    # Writable arrays (bytearray, np.array): torch refuses to wrap read-only memory without a warning.
    if layout.encoding == "raw":
        return np.frombuffer(bytearray(data), dtype=np.uint8).reshape(layout.height, layout.width, layout.channels)
    with Image.open(io.BytesIO(data)) as image:
        pixels = np.array(image.convert("L" if layout.channels == 1 else "RGB"))
    return pixels.reshape(pixels.shape[0], pixels.shape[1], layout.channels)


def decode_batch(column: Iterable[bytes], layout: ImageLayout) -> torch.Tensor:
    """A column of stored images → uint8 tensor ``N×C×H×W``."""
    import torch

    column = list(column)
    if layout.encoding == "raw":
        # One copy for the whole batch instead of one array per image.
        flat = np.frombuffer(bytearray(b"".join(column)), dtype=np.uint8)
        pixels = flat.reshape(len(column), layout.height, layout.width, layout.channels)
    else:
        pixels = np.stack([decode_one(data, layout) for data in column]) if column else np.zeros(
            (0, layout.height, layout.width, layout.channels), dtype=np.uint8)
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous()


def decode_jpegs_on(device: torch.device, encoded: list[torch.Tensor], layout: ImageLayout) -> torch.Tensor:
    """JPEG files (1-D uint8 tensors on the CPU) → uint8 tensor ``N×C×H×W`` on ``device``, decoded there.

    On a CUDA device this is nvJPEG (``torchvision.io.decode_jpeg``), which frees the CPU from the
    work that bounds a GPU's training: one CPU process decodes and augments about 180 photos of
    224 px a second (``docs/benchmarks.md``). On the CPU it is libjpeg-turbo, as PIL uses.
    """
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return torch.zeros((0, layout.channels, layout.height, layout.width), dtype=torch.uint8, device=device)
    mode = ImageReadMode.GRAY if layout.channels == 1 else ImageReadMode.RGB
    return torch.stack(decode_jpeg(list(encoded), mode=mode, device=device))


def augment_batch(images: torch.Tensor, augment: Augment, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random training augmentation of a uint8 ``N×C×H×W`` batch, drawn independently per image."""
    import torch

    if augment == "none" or images.shape[0] == 0:
        return images
    if augment == "crop_flip":
        images = _random_resized_crop(images, generator)
    else:
        images = _random_shift(images, pad=4 if augment == "shift_flip" else 2, generator=generator)
    if augment in ("crop_flip", "shift_flip"):
        # Drawn on the CPU, like every random choice here, so a seeded generator gives the same
        # augmentation whichever device holds the pixels.
        flip = (torch.rand(images.shape[0], generator=generator) < 0.5).to(images.device)
        images = torch.where(flip[:, None, None, None], images.flip(3), images)
    return images


def _random_resized_crop(images: torch.Tensor, generator: torch.Generator | None,
                         scale: tuple[float, float] = (0.6, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """Inception-style crops (area share in ``scale``, aspect in ``ratio``) resized back to the input size."""
    import torch

    n, _, height, width = images.shape
    area = torch.empty(n).uniform_(*scale, generator=generator) * height * width
    log_ratio = torch.empty(n).uniform_(float(np.log(ratio[0])), float(np.log(ratio[1])), generator=generator)
    aspect = torch.exp(log_ratio)
    crop_w = torch.sqrt(area * aspect).clamp(1, width)
    crop_h = torch.sqrt(area / aspect).clamp(1, height)
    x0 = torch.rand(n, generator=generator) * (width - crop_w)
    y0 = torch.rand(n, generator=generator) * (height - crop_h)
    boxes = torch.stack([x0, y0, x0 + crop_w, y0 + crop_h], dim=1)
    return resized_crops(images, boxes.to(images.device))


def resized_crops(images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Crop box ``i`` (``x0, y0, x1, y1`` in pixels) out of image ``i`` and resize it bilinearly to the input's size.

    The boxes never exceed the image, so every crop is enlarged or kept as it is, and
    one bilinear sample per output pixel is the resize of torchvision's
    RandomResizedCrop. Averaging 2×2 samples per pixel instead blurred every training
    image by about half a pixel, even uncropped ones, while validation images stayed sharp.
    """
    import torch
    from torchvision.ops import roi_align

    n, _, height, width = images.shape
    indexed = torch.cat([torch.arange(n, dtype=torch.float32, device=images.device)[:, None], boxes.float()], dim=1)
    resized = roi_align(images.float(), indexed, output_size=(height, width), spatial_scale=1.0,
                        sampling_ratio=1, aligned=True)
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def _random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """Zero-pad by ``pad`` pixels and crop back at a random offset: the CIFAR/MNIST recipe."""
    import torch

    n, _, height, width = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator).tolist()
    return torch.stack([padded[i, :, dy:dy + height, dx:dx + width] for i, (dy, dx) in enumerate(offsets)])


def normalize(images: torch.Tensor, layout: ImageLayout, memory_format: torch.memory_format | None = None
              ) -> torch.Tensor:
    """uint8 ``N×C×H×W`` → float32 scaled to [0, 1] and standardized with the layout's mean and std."""
    import torch

    mean = torch.tensor(layout.mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    std = torch.tensor(layout.std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return ((images.float() - mean) / std).contiguous(memory_format=memory_format or torch.contiguous_format)


def fit_external_image(data: bytes, layout: ImageLayout) -> np.ndarray:
    """An arbitrary encoded image (any size, JPEG/PNG/...) → uint8 ``H×W×C`` in the layout's size and colour mode.

    The resize and centre crop are the preprocess stage's, so a photo classified
    later looks like the images the model was trained on.
    """
    square = square_jpeg_from_bytes(data, layout.height, quality=95)
    with Image.open(io.BytesIO(square)) as image:
        pixels = np.asarray(image.convert("L" if layout.channels == 1 else "RGB"))
    return pixels.reshape(layout.height, layout.width, layout.channels)


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
            # Already what the preprocess stage writes: encoding again would only lose detail.
            # Decoding still checks that the file is whole.
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
