"""Decoding and augmenting on the training worker's device (``train.decode``), run here on the CPU.

On a GPU the same functions decode with nvJPEG; the CPU runs every line of them but the decoder's
device, so these tests hold the path's pixels and randomness to the DataLoader's.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.images import photo_like_jpeg, write_tiny_dataset
from tests.support.tiny_run import dataset_info, tiny_params
from workloads.ray_train.metrics import read_metrics_csv
from workloads.vision.config import TrainConfig
from workloads.vision.images import ImageLayout, augment_batch, decode_batch, decode_jpegs_on, square_jpeg_from_bytes
from workloads.vision.reading.torch_dataset import EncodedCollate

SIZE = 64


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    """Square JPEGs as the preprocess stage stores them, of photo-like content (edges and texture)."""
    return [square_jpeg_from_bytes(photo_like_jpeg(seed=seed), SIZE, quality=90) for seed in range(6)]


def test_the_device_decodes_the_pixels_the_loader_decodes(jpegs):
    layout = ImageLayout.photos(SIZE)
    encoded, labels = EncodedCollate()([(data, index) for index, data in enumerate(jpegs)])
    on_device = decode_jpegs_on(torch.device("cpu"), encoded.files(), layout)
    by_loader = decode_batch(jpegs, layout)
    assert on_device.shape == by_loader.shape == (len(jpegs), 3, SIZE, SIZE)
    assert on_device.dtype == torch.uint8 and labels.tolist() == list(range(len(jpegs)))
    # Both are libjpeg-turbo on the CPU, to the bit; nvJPEG's IDCT may differ by a level or two, as any two decoders do.
    assert torch.equal(on_device, by_loader)


def test_a_seeded_augmentation_is_the_same_whatever_the_device_and_batch_layout(jpegs):
    images = decode_batch(jpegs, ImageLayout.photos(SIZE))
    for augment in ("crop_flip", "shift_flip", "shift"):
        first = augment_batch(images, augment, torch.Generator().manual_seed(7))
        again = augment_batch(images.clone(), augment, torch.Generator().manual_seed(7))
        assert torch.equal(first, again)
        assert not torch.equal(first, images), "an augmentation changed nothing"


def test_an_empty_batch_decodes_to_an_empty_tensor_of_the_layouts_shape():
    empty = decode_jpegs_on(torch.device("cpu"), [], ImageLayout.photos(SIZE))
    assert empty.shape == (0, 3, SIZE, SIZE)


def test_grey_datasets_decode_to_one_channel(jpegs):
    layout = ImageLayout("jpeg", SIZE, SIZE, 1, (0.5,), (0.25,), "crop_flip")
    encoded, _ = EncodedCollate()([(jpegs[0], 0)])
    assert decode_jpegs_on(torch.device("cpu"), encoded.files(), layout).shape == (1, 1, SIZE, SIZE)


def test_a_batch_of_files_leaves_a_loader_process_as_two_tensors_and_arrives_intact(jpegs):
    """Each tensor crosses from a loader process in a shared-memory segment of its own: one per batch, not one
    per file, is what keeps a GPU fed (docs/benchmarks.md, the GPU path)."""
    from torch.utils.data import DataLoader

    samples = [(data, index % 3) for index, data in enumerate(jpegs * 5)]
    files, _ = EncodedCollate()(samples)
    assert sum(isinstance(part, torch.Tensor) for part in files) == 2
    loader = DataLoader(samples, batch_size=8, num_workers=2, collate_fn=EncodedCollate())
    arrived = [(bytes(file.numpy()), int(label)) for files, labels in loader
               for file, label in zip(files.files(), labels)]
    assert arrived == samples
    empty, no_labels = EncodedCollate()([])
    assert empty.files() == [] and no_labels.numel() == 0


@pytest.mark.parametrize(("decode", "device", "encoding", "ingest", "expected"), [
    ("auto", "cuda", "jpeg", "torch", True),
    ("auto", "cpu", "jpeg", "torch", False),
    ("auto", "cuda", "raw", "torch", False),  # mnist, cifar10: nothing to decode
    ("device", "cpu", "jpeg", "torch", True),
    ("loader", "cuda", "jpeg", "torch", False),
    ("auto", "cuda", "jpeg", "ray_data", False),
])
def test_where_decoding_happens(decode, device, encoding, ingest, expected):
    cfg = TrainConfig(decode=decode, ingest=ingest)
    assert cfg.decodes_on_device(device, encoding) is expected


def test_decoding_on_the_device_with_ray_data_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="ray_data"):
        TrainConfig(decode="device", ingest="ray_data")


def test_two_workers_decoding_on_their_device_train_exactly_as_when_the_loader_decodes(workload_ray, tmp_path):
    """The whole path through Ray Train: files left on the CPU, labels moved, augmentation drawn in the same order."""
    from workloads.vision.training.stage import run_training

    root = write_tiny_dataset(tmp_path / "data", ["red", "green"], {"train": 12, "val": 5}, image_size=16)
    curves = {}
    for decode in ("loader", "device"):
        params = tiny_params(root, tmp_path / "runs", f"decode-{decode}", epochs=2, decode=decode, num_to_keep=1)
        params = params.model_copy(update={"data": params.data.model_copy(update={"image_size": 16})})
        outcome = run_training(params, dataset_info(root))
        assert outcome.best_metrics["decode"] == decode, "the run's record says where it decoded"
        curves[decode] = [(row["train_loss"], row["val_loss"], row["val_accuracy"])
                          for row in read_metrics_csv(outcome.metrics_csv)]
    assert len(curves["device"]) == 2
    assert curves["device"] == curves["loader"]
