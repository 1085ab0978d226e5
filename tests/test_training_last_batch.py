"""No dataset size can crash training: a rank's last batch of one image, which batch norm cannot train on, is left
out on both ingest paths (the DataLoader's sampler and Ray Data's shards), said in one line, while evaluation
still counts every validation image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.images import write_tiny_dataset
from tests.support.tiny_run import dataset_info, tiny_params
from workloads.ray_train.metrics import read_metrics_csv

# 18 training rows on two workers of 4 images a batch: 9 a rank under either ingest path, a last batch of one.
CLASSES = ["red", "green"]
TRAIN_PER_CLASS, VAL_PER_CLASS = 9, 5
IMAGE_SIZE = 32  # ResNet-18's last block is 1×1 here: one value per channel and image


def test_a_last_batch_of_one_image_is_left_out_and_any_other_is_kept():
    from workloads.vision.reading.torch_dataset import trained_rows

    assert [trained_rows(rows, 4) for rows in (8, 9, 10, 11, 1)] == [8, 8, 10, 11, 0]


@pytest.mark.processes
def test_the_sampler_leaves_out_one_row_per_rank_only_when_the_last_batch_would_hold_one(tmp_path):
    import torch
    from torch.utils.data import DataLoader

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout, normalize
    from workloads.vision.reading.batches import skipped_images_line
    from workloads.vision.reading.torch_dataset import (AugmentingCollate, GroupedShardSampler, ParquetImageDataset,
                                                        split_files)
    from workloads.vision.training.model import build_model

    root = write_tiny_dataset(tmp_path / "data", CLASSES, {"train": TRAIN_PER_CLASS, "val": VAL_PER_CLASS},
                              image_size=IMAGE_SIZE)
    layout = ImageLayout.photos(IMAGE_SIZE)
    train = ParquetImageDataset(split_files(root, "train"), layout)
    samplers = [GroupedShardSampler(train, num_replicas=2, rank=rank, seed=1, pad=True, batch_size=4)
                for rank in (0, 1)]
    shares = [list(sampler) for sampler in samplers]
    assert [len(share) for share in shares] == [8, 8] and [s.left_out for s in samplers] == [1, 1]
    assert len(set(shares[0]) | set(shares[1])) == 16, "the ranks still train on different images"

    # The batches rank 0's DataLoader makes, through the workload's own ResNet-18 in training mode.
    model = build_model(TrainConfig(), len(CLASSES), layout, None).train()
    sizes = []
    for images, labels in DataLoader(train, batch_size=4, sampler=samplers[0], collate_fn=AugmentingCollate()):
        model(normalize(images, layout, torch.contiguous_format)).sum().backward()
        sizes.append(len(labels))
    assert sizes == [4, 4]
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):  # what was left out
        model(normalize(images[:1], layout, torch.contiguous_format))

    # A batch that divides the share leaves nothing out; neither does validation's unpadded sampler.
    assert GroupedShardSampler(train, num_replicas=2, rank=0, pad=True, batch_size=3).left_out == 0
    assert len(GroupedShardSampler(train, num_replicas=2, rank=0, shuffle=False, pad=False)) == 9

    line = skipped_images_line(2, 4, 2)
    assert line.startswith("Training skips 2 image(s) an epoch") and "evaluation sees every image" in line
    assert skipped_images_line(0, 4, 2) is None


def test_ray_data_training_on_a_size_that_leaves_one_image_per_worker_finishes_and_evaluates_every_image(
        workload_ray, tmp_path):
    from workloads.vision.training.stage import run_training

    # Three classes of 6: the same 18 training rows, and 15 validation rows that two workers cannot split evenly.
    classes = [*CLASSES, "blue"]
    root = write_tiny_dataset(tmp_path / "data", classes, {"train": 6, "val": VAL_PER_CLASS}, image_size=IMAGE_SIZE)
    params = tiny_params(root, tmp_path / "runs", "odd", epochs=1, ingest="ray_data", data_cpus=0, num_to_keep=1)
    params = params.model_copy(update={"data": params.data.model_copy(update={"image_size": IMAGE_SIZE})})
    outcome = run_training(params, dataset_info(root))

    assert [int(row["epoch"]) for row in read_metrics_csv(outcome.metrics_csv)] == [1]
    meta = json.loads((Path(outcome.best_checkpoint) / "meta.json").read_text())
    assert meta["val_rows"] == len(classes) * VAL_PER_CLASS == 15, "evaluation saw every validation image"


@pytest.mark.processes
@pytest.mark.parametrize("decode_on_device", [False, True], ids=["decoded-by-the-loader", "decoded-on-the-device"])
def test_the_dataloader_path_trains_on_batches_of_two_or_more_and_says_once_what_an_epoch_skips(
        tmp_path, monkeypatch, capsys, decode_on_device):
    import ray.train.torch
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.reading.batches import TorchBatches

    root = write_tiny_dataset(tmp_path / "data", CLASSES, {"train": TRAIN_PER_CLASS, "val": VAL_PER_CLASS},
                              image_size=IMAGE_SIZE)
    # Outside a Ray Train worker there is no process group to prepare the loaders for: they are used as built.
    monkeypatch.setattr(ray.train.torch, "prepare_data_loader", lambda loader, **_: loader)
    cfg = TrainConfig(batch_size=8, num_workers=2, loader_workers=0)
    ranks = [TorchBatches(root, cfg, ImageLayout.photos(IMAGE_SIZE), rank, 2, torch.device("cpu"), decode_on_device)
             for rank in (0, 1)]
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("Training skips")] == [
        "Training skips 2 image(s) an epoch: the last batch of each of the 2 worker(s) would hold fewer than 2 images "
        "(batch 4 per worker), too few for batch norm to train on; which images are left out changes every epoch, "
        "and evaluation sees every image."], "one line, from rank 0"
    assert [batches.steps_per_epoch for batches in ranks] == [2, 2]
    assert [[len(labels) for _, labels in batches.train_epoch(1)] for batches in ranks] == [[4, 4], [4, 4]]
    assert sum(len(labels) for batches in ranks for _, labels in batches.val_batches()) == len(CLASSES) * VAL_PER_CLASS
