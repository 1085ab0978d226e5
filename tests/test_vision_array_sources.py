"""MNIST and CIFAR-10 sources, the raw-array Parquet layout, and the shared image operations (no Ray)."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tests.support.arrays import (
    CIFAR_CLASSES,
    idx_bytes,
    write_cifar_batches,
    write_cifar_parquet,
    write_mnist,
    write_pattern_mnist,
)
from workloads.vision.config import DataConfig, VisionParams
from workloads.vision.errors import DataSourceError


def _load(source: str, root: Path, **settings):
    from workloads.vision.sources.arrays import load_array_source

    return load_array_source(DataConfig(source=source, root=root, output_dir=root.parent / "out", **settings))


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped"])
def test_mnist_idx_files_are_read_with_their_labels(tmp_path, gz):
    images = np.random.default_rng(0).integers(0, 256, (30, 28, 28), dtype=np.uint8)
    labels = np.arange(30, dtype=np.uint8) % 10
    write_mnist(tmp_path / "mnist", {"train": (images, labels), "test": (images[:10], labels[:10])}, gz=gz)

    loaded = _load("mnist", tmp_path / "mnist")
    assert loaded.classes == [str(d) for d in range(10)]
    assert loaded.layout.encoding == "raw" and loaded.layout.channels == 1 and loaded.layout.augment == "shift"
    train = loaded.splits["train"]
    assert train.images.shape == (30, 28, 28, 1) and train.images.dtype == np.uint8
    for row, name in zip(range(30), train.paths):
        index = int(name.rsplit("#", 1)[1])
        assert np.array_equal(train.images[row, ..., 0], images[index]) and train.labels[row] == labels[index]
    assert train.paths[0].startswith("MNIST/raw/train-images-idx3-ubyte" + (".gz" if gz else ""))
    assert len(loaded.splits["val"].labels) == 10


def test_mnist_class_subset_is_relabelled_in_the_order_asked_and_capped(tmp_path):
    write_pattern_mnist(tmp_path / "m", {"train": 6, "test": 3})
    loaded = _load("mnist", tmp_path / "m", classes=["7", "2"], max_per_class=4)
    assert loaded.classes == ["7", "2"]
    train = loaded.splits["train"]
    assert sorted(train.labels.tolist()) == [0] * 4 + [1] * 4
    # The bar of a "7" sits lower than the bar of a "2": label 0 must be the 7s.
    bar_rows = {int(label): int(np.argmax(image[:, :, 0].mean(axis=1))) for image, label in zip(train.images, train.labels)}
    assert bar_rows[0] > bar_rows[1]
    assert len(loaded.splits["val"].labels) == 6


def test_mnist_missing_or_damaged_files_are_clear_errors(tmp_path):
    with pytest.raises(DataSourceError, match=r"train-images-idx3-ubyte.*MNIST/raw.*download=true"):
        _load("mnist", tmp_path / "empty")

    raw = tmp_path / "bad" / "MNIST" / "raw"
    write_pattern_mnist(tmp_path / "bad", {"train": 2, "test": 1})
    (raw / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    with pytest.raises(DataSourceError, match="not a valid MNIST IDX file"):
        _load("mnist", tmp_path / "bad")
    # Images of the wrong shape are refused rather than reshaped.
    (raw / "train-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((20, 10, 10), dtype=np.uint8)))
    with pytest.raises(DataSourceError, match="N×28×28"):
        _load("mnist", tmp_path / "bad")
    (raw / "t10k-labels-idx1-ubyte").unlink()
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    (raw / "train-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((20, 28, 28), dtype=np.uint8)))
    with pytest.raises(DataSourceError, match="not a readable gzip file"):
        _load("mnist", tmp_path / "bad")



def test_an_mnist_download_that_fails_offline_is_one_clear_message(tmp_path, monkeypatch):
    # download=true asks torchvision's MNIST for the files; offline, its failure becomes one clear message. The
    # one seam faked is torchvision's module (importing torchvision costs a process about 5 CPU-s): its MNIST
    # fails as the real one does without a network.
    import types
    from urllib.error import URLError

    class OfflineMNIST:
        def __init__(self, root: str, train: bool = True, download: bool = False):
            if download:
                raise URLError("no route to host")

    monkeypatch.setitem(sys.modules, "torchvision.datasets.mnist",
                        types.SimpleNamespace(MNIST=OfflineMNIST))
    with pytest.raises(DataSourceError, match=r"downloading MNIST .* failed .*download=false"):
        _load("mnist", tmp_path / "nowhere", download=True)


def test_cifar_python_batches_and_parquet_shards_give_the_same_images(tmp_path):
    batches = _load("cifar10", write_cifar_batches(tmp_path / "py", 4, 2))
    shards = _load("cifar10", write_cifar_parquet(tmp_path / "hf", 4, 2))
    assert batches.classes == shards.classes == CIFAR_CLASSES
    assert batches.layout.channels == 3 and batches.layout.augment == "shift_flip"
    for split, rows in (("train", 40), ("val", 20)):
        a, b = batches.splits[split], shards.splits[split]
        assert a.images.shape == b.images.shape == (rows, 32, 32, 3)
        # Same generator, two on-disk formats: the same set of images with the same labels.
        order_a = np.lexsort((a.images.reshape(rows, -1).sum(axis=1), a.labels))
        order_b = np.lexsort((b.images.reshape(rows, -1).sum(axis=1), b.labels))
        assert np.array_equal(a.images[order_a], b.images[order_b])
        assert np.array_equal(a.labels[order_a], b.labels[order_b])
    assert batches.splits["train"].paths[0].startswith("cifar-10-batches-py/data_batch_")
    assert shards.splits["val"].paths[0].startswith("plain_text/test-00000-of-00001.parquet#")


def test_cifar_planar_rows_become_height_width_channel(tmp_path):
    folder = tmp_path / "c" / "cifar-10-batches-py"
    write_cifar_batches(tmp_path / "c", 1, 1)
    planar = np.zeros((1, 3072), dtype=np.uint8)
    planar[0, 0] = 200          # red of pixel (0, 0)
    planar[0, 1024 + 33] = 100  # green of pixel (1, 1)
    planar[0, 2048 + 1023] = 50  # blue of pixel (31, 31)
    with open(folder / "test_batch", "wb") as handle:
        pickle.dump({"data": planar, "labels": [3]}, handle, protocol=2)
    val = _load("cifar10", tmp_path / "c").splits["val"]
    image = val.images[0]
    assert (image[0, 0, 0], image[1, 1, 1], image[31, 31, 2]) == (200, 100, 50)
    assert val.labels.tolist() == [3]


def test_cifar_batch_that_would_run_code_is_refused(tmp_path):
    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, ("echo owned > " + str(tmp_path / "owned"),))

    write_cifar_batches(tmp_path / "c", 1, 1)
    with open(tmp_path / "c" / "cifar-10-batches-py" / "data_batch_2", "wb") as handle:
        pickle.dump({"data": Exploit(), "labels": []}, handle, protocol=2)
    with pytest.raises(DataSourceError, match=r"data_batch_2 is not a CIFAR-10 python batch.*not allowed"):
        _load("cifar10", tmp_path / "c")
    assert not (tmp_path / "owned").exists()


def test_cifar_missing_data_names_both_formats(tmp_path):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataSourceError, match=r"python batches .* Parquet shards"):
        _load("cifar10", tmp_path / "nothing")


def test_array_sources_keep_their_native_size_and_classes():
    mnist = DataConfig(source="mnist", root="/data/m")
    assert (mnist.image_size, mnist.classes) == (28, [str(d) for d in range(10)])
    assert DataConfig(source="cifar10", root="/data/c").classes == CIFAR_CLASSES
    assert DataConfig(source="synthetic").image_size == 224
    assert DataConfig(source="mnist", root="/data/m", image_size=28).image_size == 28
    with pytest.raises(ValidationError, match="mnist images are 28x28"):
        DataConfig(source="mnist", root="/data/m", image_size=32)
    with pytest.raises(ValidationError, match="download is only for source 'mnist'"):
        DataConfig(source="cifar10", root="/data/c", download=True)
    with pytest.raises(ValidationError, match="patch_size .* must divide"):
        VisionParams.model_validate({"data": {"source": "mnist", "root": "/m"},
                                     "train": {"model": "vit", "vit": {"patch_size": 5}}})
    with pytest.raises(ValidationError, match="multiple of num_heads"):
        VisionParams.model_validate({"train": {"model": "vit", "vit": {"hidden_dim": 100, "num_heads": 8}}})


def test_preprocess_writes_raw_arrays_that_decode_to_the_source_pixels(tmp_path):
    import pyarrow.parquet as pq

    from workloads.vision.images import decode_batch
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.preprocess.stage import run_preprocess

    write_pattern_mnist(tmp_path / "m", {"train": 5, "test": 2}, gz=True)
    data = DataConfig(source="mnist", root=tmp_path / "m", output_dir=tmp_path / "out", rows_per_file=16)
    info = run_preprocess(data, progress=False)
    assert info.counts == {"train": 50, "val": 20} and info.image_size == 28
    assert info.layout.encoding == "raw" and info.layout.mean == (0.1307,)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["layout"]["encoding"] == "raw" and manifest["source"]["type"] == "mnist"
    assert load_dataset_info(tmp_path / "out").layout == info.layout

    table = pq.read_table(tmp_path / "out" / "train")
    assert pq.ParquetFile(sorted((tmp_path / "out" / "train").glob("*.parquet"))[0]).metadata.num_row_groups == 1
    loaded = _load("mnist", tmp_path / "m")
    by_path = {p: img for p, img in zip(loaded.splits["train"].paths, loaded.splits["train"].images)}
    decoded = decode_batch(table.column("image").to_pylist(), info.layout)
    assert decoded.shape == (50, 1, 28, 28)
    for image, path in zip(decoded, table.column("path").to_pylist()):
        assert np.array_equal(image.numpy()[0], by_path[path][..., 0])
    assert sorted(set(table.column("label").to_pylist())) == list(range(10))
    assert run_preprocess(data, progress=False).reused


def test_augmentations_are_per_image_and_keep_shape_and_dtype():
    import torch

    from workloads.vision.images import ImageLayout, augment_batch, normalize

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 3, 24, 24), dtype=torch.uint8, generator=generator)
    for augment in ("crop_flip", "shift_flip", "shift", "none"):
        out = augment_batch(images, augment, torch.Generator().manual_seed(1))
        assert out.shape == images.shape and out.dtype == torch.uint8
    assert torch.equal(augment_batch(images, "none"), images)

    # A shift moves content by at most 2 pixels, and different images move differently.
    single = torch.zeros(8, 1, 28, 28, dtype=torch.uint8)
    single[:, :, 14, 14] = 255
    shifted = augment_batch(single, "shift", torch.Generator().manual_seed(3))
    spots = {tuple(torch.nonzero(image[0]).flatten().tolist()) for image in shifted}
    assert len(spots) > 1 and all(abs(y - 14) <= 2 and abs(x - 14) <= 2 for y, x in spots)

    # Flips are drawn per image: some of a batch of asymmetric images come back mirrored.
    ramp = torch.arange(32, dtype=torch.uint8).repeat(32, 3, 32, 1)
    flipped = augment_batch(ramp, "shift_flip", torch.Generator().manual_seed(4))
    left_brighter = [(image[:, 10, :8].float().mean() > image[:, 10, -8:].float().mean()).item() for image in flipped]
    assert 0 < sum(left_brighter) < 32

    layout = ImageLayout("raw", 2, 2, 1, (0.5,), (0.25,), "shift")
    values = normalize(torch.tensor([[[[0, 255], [128, 64]]]], dtype=torch.uint8), layout)
    assert values[0, 0, 0, 0].item() == pytest.approx(-2.0) and values[0, 0, 0, 1].item() == pytest.approx(2.0)


def test_resized_crops_are_torchvisions_bilinear_resize_and_keep_an_uncropped_image_sharp():
    import torch
    import torchvision.transforms.v2.functional as F

    from workloads.vision.images import resized_crops

    generator = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=generator)
    whole = torch.tensor([[0.0, 0.0, 64.0, 64.0]] * 2)
    assert torch.equal(resized_crops(noise, whole), noise)

    # A smooth image (a blurred field of noise), so the comparison is about the resize and
    # not about which pixel just outside the crop's edge each method reads.
    smooth = F.gaussian_blur(noise.float(), kernel_size=9, sigma=3.0).round().to(torch.uint8)
    top, left, crop_h, crop_w = 5, 7, 40, 50
    ours = resized_crops(smooth, torch.tensor([[left, top, left + crop_w, top + crop_h]] * 2, dtype=torch.float32))
    expected = F.resized_crop(smooth, top, left, crop_h, crop_w, [64, 64], antialias=True)
    assert (ours.float() - expected.float()).abs().mean() < 0.5


def test_vision_transformer_is_built_to_the_configured_shape():
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.model import build_model

    cfg = TrainConfig(model="vit", vit={"patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 32,
                                        "mlp_dim": 64})
    model = build_model(cfg, 10, ImageLayout("raw", 32, 32, 3, (0.5,) * 3, (0.5,) * 3, "shift_flip"))
    assert len(model.encoder.layers) == 2 and model.hidden_dim == 32 and model.patch_size == 4
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    grey = build_model(cfg, 10, ImageLayout("raw", 28, 28, 1, (0.5,), (0.5,), "shift"))
    assert grey.conv_proj.in_channels == 1 and grey(torch.zeros(1, 1, 28, 28)).shape == (1, 10)
