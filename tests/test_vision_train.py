"""Training stage of the vision workload: Parquet reading, Ray Train loop, checkpoints, resume, recovery.

The Ray Train tests, fine-tuning from ImageNet weights included, read the session's shared run
(tests/support/tiny_run.py) instead of training their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.tensorboard_events import tensorboard_scalars
from tests.support.tiny_run import CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS, copy_run, dataset_info, tiny_params
from tests.support.tiny_run import write_tiny_data
from workloads.ray_train.metrics import read_metrics_csv


def _params(dataset: Path, storage: Path, run_name: str, **train):
    return tiny_params(dataset, storage, run_name, **train)


@pytest.fixture(scope="module")
def tiny_dataset(workdir) -> Path:
    return write_tiny_data(workdir / "data")


# --------------------------------------------------------------------------- dataset (no Ray)


def test_parquet_dataset_maps_indices_to_row_groups_lazily(tiny_dataset):
    import pyarrow.parquet as pq
    import torch

    from workloads.vision.reading.torch_dataset import ParquetImageDataset, split_files
    from workloads.vision.images import ImageLayout

    files = split_files(tiny_dataset, "train")
    expected_labels = [label for f in files for label in pq.read_table(f).column("label").to_pylist()]
    dataset = ParquetImageDataset(files, ImageLayout.photos(16), cache_groups=2)
    assert len(dataset) == len(expected_labels) == TRAIN_PER_CLASS * len(CLASSES)
    assert len(files) == 2 and len(dataset.groups) == 6  # 18 rows per file, 8-row groups: 8 + 8 + 2
    assert dataset.group_reads == 0  # nothing read until a row is asked for

    image, label = dataset[0]
    assert isinstance(image, torch.Tensor) and image.shape == (3, 16, 16) and image.dtype == torch.uint8
    assert label == expected_labels[0]
    assert dataset.group_reads == 1
    dataset[7]  # same row group
    assert dataset.group_reads == 1
    dataset[8]  # next group
    assert dataset.group_reads == 2
    assert dataset.raw(len(dataset) - 1)[1] == expected_labels[-1]  # last group of the second file
    assert dataset.group_reads == 3
    assert [dataset.raw(i)[1] for i in range(len(dataset))] == expected_labels
    assert dataset.labels() == expected_labels
    with pytest.raises(IndexError):
        dataset.raw(len(dataset))


def test_sampler_shards_cover_every_row_once_and_keep_group_locality(tiny_dataset):
    from workloads.vision.reading.torch_dataset import GroupedShardSampler, ParquetImageDataset, split_files
    from workloads.vision.images import ImageLayout

    dataset = ParquetImageDataset(split_files(tiny_dataset, "val"), ImageLayout.photos(16))
    exact = [list(GroupedShardSampler(dataset, num_replicas=2, rank=r, shuffle=False, pad=False)) for r in (0, 1)]
    assert sorted(exact[0] + exact[1]) == list(range(len(dataset)))
    assert [len(s) for s in exact] == [8, 7]

    train = ParquetImageDataset(split_files(tiny_dataset, "train"), ImageLayout.photos(16), cache_groups=4)
    orders = []
    for rank in (0, 1):
        sampler = GroupedShardSampler(train, num_replicas=2, rank=rank, shuffle=True, seed=3, window=4, pad=True)
        sampler.set_epoch(1)
        orders.append(list(sampler))
    assert len(orders[0]) == len(orders[1]) == len(train) // 2
    assert sorted(orders[0] + orders[1]) == list(range(len(train)))
    assert orders[0] + orders[1] != list(range(len(train)))  # shuffled
    for i in orders[0] + orders[1]:
        train.raw(i)
    assert train.group_reads <= len(train.groups)  # each group read at most once per epoch

    sampler = GroupedShardSampler(train, num_replicas=2, rank=0, shuffle=True, seed=3)
    sampler.set_epoch(2)
    assert list(sampler) != orders[0]  # a new order every epoch


def test_learning_rate_schedule_warmup_and_cosine():
    from workloads.vision.config import TrainConfig
    from workloads.vision.training.recipe import lr_factor

    cfg = TrainConfig(epochs=4, warmup_epochs=1, lr_schedule="cosine")
    factors = [lr_factor(step, 10, cfg) for step in range(40)]
    assert factors[0] < factors[5] < factors[9] <= 1.0  # linear warmup over the first epoch
    assert factors[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))  # then decays
    assert factors[-1] < 0.01
    step_cfg = TrainConfig(epochs=4, lr_schedule="step", warmup_epochs=0)
    assert [lr_factor(s, 10, step_cfg) for s in (0, 19, 20, 30)] == pytest.approx([1, 1, 0.1, 0.01])


def test_missing_or_invalid_weights_and_missing_dataset_are_clear_errors(tmp_path, tiny_dataset):
    from workloads.ray_train.trainer import TrainingError
    from workloads.vision.errors import DatasetMissingError
    from workloads.vision.training.stage import run_training

    missing = tmp_path / "resnet18.pth"
    with pytest.raises(TrainingError, match=r"does not exist.*nothing is downloaded"):
        run_training(_params(tiny_dataset, tmp_path, "w", weights=str(missing)), dataset_info(tiny_dataset))
    missing.write_text("not a state dict")
    with pytest.raises(TrainingError, match="not a torchvision ResNet-18 state dict"):
        run_training(_params(tiny_dataset, tmp_path, "w", weights=str(missing)), dataset_info(tiny_dataset))
    missing_dataset = dataset_info(tiny_dataset)
    missing_dataset.root = tmp_path / "no-dataset"
    with pytest.raises(DatasetMissingError, match="preprocess stage"):
        run_training(_params(tiny_dataset, tmp_path, "w"), missing_dataset)


@pytest.mark.processes
def test_weights_file_is_loaded_and_head_replaced(tmp_path):
    import torch
    from torchvision.models import resnet18

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.model import build_model, load_pretrained_state

    pretrained = resnet18(weights=None)
    torch.save(pretrained.state_dict(), tmp_path / "r18.pth")
    state = load_pretrained_state(TrainConfig(weights=str(tmp_path / "r18.pth")))
    model = build_model(TrainConfig(), 3, ImageLayout.photos(32), state)
    assert model.fc.out_features == 3
    assert torch.equal(model.conv1.weight, pretrained.conv1.weight)
    # One-channel images: the pretrained stem's colour filters are summed, not dropped.
    grey = ImageLayout("raw", 28, 28, 1, (0.5,), (0.5,), "shift")
    model = build_model(TrainConfig(), 10, grey, state)
    assert model.conv1.in_channels == 1
    assert torch.allclose(model.conv1.weight, pretrained.conv1.weight.sum(dim=1, keepdim=True))
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert load_pretrained_state(TrainConfig(weights="none")) is None
    (tmp_path / "r18.pth").unlink()  # 45 MB


# --------------------------------------------------------------------------- Ray Train


def test_a_worker_lost_mid_run_is_restored_from_the_last_checkpoint(tiny_run):
    outcome = tiny_run.outcome
    marker = outcome.run_dir / ".test-fail-marker"
    assert marker.exists() and "rank 1" in marker.read_text()
    # The attempt that finished started after the checkpoint of epoch 1 (index 0): every epoch once.
    assert outcome.epochs_trained == [2] and not outcome.skipped
    assert [int(r["epoch"]) for r in tiny_run.rows] == [1, 2]
    assert outcome.final_metrics["epoch"] == 2


def test_artifacts_and_checkpoint_contents(tiny_run):
    import torch

    outcome, rows = tiny_run.outcome, tiny_run.rows
    assert set(rows[0]) == {"epoch", "train_loss", "val_loss", "val_accuracy", "images_per_s", "epoch_s",
                            "data_wait_s", "compute_s", "lr"}
    assert all(r["images_per_s"] > 0 and r["epoch_s"] > 0 and r["data_wait_s"] >= 0 and r["compute_s"] > 0
               for r in rows)
    assert outcome.loss_curve.stat().st_size > 1000
    assert outcome.best_checkpoint.parent == outcome.run_dir
    # TensorBoard has every epoch once, the one before the lost worker included.
    assert tensorboard_scalars(outcome.run_dir / "tensorboard")["val_accuracy"] == [
        (int(row["epoch"]), pytest.approx(row["val_accuracy"])) for row in rows]

    latest = outcome.run_dir / "checkpoint_epoch_0002"
    state = torch.load(latest / "state.pt", map_location="cpu", weights_only=False)
    assert set(state) >= {"model", "optimizer", "scheduler", "epoch", "config", "classes"}
    assert state["epoch"] == 1 and state["classes"] == CLASSES and state["config"]["image_size"] == 16
    assert state["config"]["train"]["num_workers"] == 2
    assert not any(key.startswith("module.") for key in state["model"])  # saved unwrapped from DDP
    assert state["scheduler"]["last_epoch"] > 0
    meta = json.loads((latest / "meta.json").read_text())
    assert meta["epoch"] == 2 and meta["val_rows"] == len(CLASSES) * VAL_PER_CLASS


def test_validation_metrics_over_two_workers_equal_full_split_figures(tiny_run):
    import torch
    from torch.utils.data import DataLoader

    from workloads.vision.config import TrainConfig
    from workloads.vision.reading.torch_dataset import ParquetImageDataset, split_files
    from workloads.vision.images import ImageLayout, normalize
    from workloads.vision.training.model import build_model

    state = torch.load(tiny_run.outcome.run_dir / "checkpoint_epoch_0002" / "state.pt", map_location="cpu",
                       weights_only=False)
    layout = ImageLayout.photos(16)
    model = build_model(TrainConfig(), len(CLASSES), layout)
    model.load_state_dict(state["model"])
    model.eval()
    dataset = ParquetImageDataset(split_files(tiny_run.dataset, "val"), layout)
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in DataLoader(dataset, batch_size=5):
            logits = model(normalize(images, layout))
            loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(1) == labels).sum())
    reported = tiny_run.rows[1]
    assert reported["val_accuracy"] == pytest.approx(correct / len(dataset), abs=1e-12)
    assert reported["val_loss"] == pytest.approx(loss_sum / len(dataset), rel=1e-4)


def test_a_finished_run_is_not_trained_again(tiny_run, tmp_path, monkeypatch):
    """Resuming after a checkpoint (epochs raised, the schedule stretched) is the S3 quickstart's test
    (tests/test_vision_e2e_cluster.py); here, what needs no cluster: a run already at its last epoch is left as it
    is."""
    from workloads.vision.training.stage import run_training

    monkeypatch.setenv("TORCH_HOME", str(tiny_run.torch_home))  # the run's ImageNet weights are read first
    params = copy_run(tiny_run, tmp_path / "runs")
    again = run_training(params, dataset_info(tiny_run.dataset))
    assert again.skipped and again.epochs_trained == []
    assert read_metrics_csv(again.run_dir / "metrics.csv") == tiny_run.rows
    assert again.best_checkpoint is not None and again.best_checkpoint.parent == again.run_dir


# --------------------------------------------------------------------------- the recipe


def test_learning_rate_follows_the_global_batch_size():
    from workloads.vision.config import TrainConfig

    assert TrainConfig().peak_lr() == pytest.approx(0.002)  # the default recipe at its reference batch of 64
    # batch_size auto: 64 on CPU; 256 per GPU worker, the learning rate following it.
    assert TrainConfig().global_batch == 64 and TrainConfig().with_resolved_batch().batch_size == 64
    on_gpus = TrainConfig(use_gpu=True, num_workers=2)
    assert on_gpus.global_batch == 512 and on_gpus.peak_lr() == pytest.approx(0.002 * 8 ** 0.5)
    assert TrainConfig(use_gpu=True).global_batch == 256  # the layout not yet resolved: one worker's
    assert TrainConfig(batch_size=32, use_gpu=True).with_resolved_batch().batch_size == 32  # a number is kept
    assert TrainConfig(batch_size=256).peak_lr() == pytest.approx(0.004)  # AdamW: square root of 4x
    assert TrainConfig(optimizer="sgd", batch_size=128).peak_lr() == pytest.approx(0.2)  # SGD: linear
    assert TrainConfig(lr=0.01, lr_batch_size=128, batch_size=512, lr_scaling="linear").peak_lr() == pytest.approx(0.04)
    assert TrainConfig(lr=0.01, batch_size=512, lr_scaling="none").peak_lr() == pytest.approx(0.01)
    assert TrainConfig(weights="imagenet").peak_lr() == pytest.approx(0.0005)  # fine-tuning takes smaller steps
    assert TrainConfig(epochs=12).warmup() == pytest.approx(2.4) and TrainConfig(epochs=100).warmup() == 5


@pytest.mark.processes
def test_residual_branches_start_at_zero_for_sgd_and_at_full_strength_for_adamw():
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.model import build_model

    def last_gammas(cfg: TrainConfig) -> torch.Tensor:
        model = build_model(cfg, 10, ImageLayout.photos(64))
        return torch.cat([block.bn2.weight.detach() for block in model.layer1])

    assert torch.all(last_gammas(TrainConfig()) == 1)  # adamw: zeroed gammas would grow only ~lr per step
    assert torch.all(last_gammas(TrainConfig(optimizer="sgd")) == 0)
    assert torch.all(last_gammas(TrainConfig(zero_init_residual=True)) == 0)
    assert torch.all(last_gammas(TrainConfig(optimizer="sgd", zero_init_residual=False)) == 1)


def test_imagenet_weights_are_for_resnet18_only():
    from pydantic import ValidationError

    from workloads.vision.config import TrainConfig

    with pytest.raises(ValidationError, match="resnet18 only"):
        TrainConfig(model="vit", weights="imagenet")


def test_an_exploding_validation_loss_at_chance_two_epochs_in_a_row_is_a_warning():
    from workloads.vision.training.recipe import epoch_warning

    exploded = {"val_loss": 22426.1, "val_accuracy": 0.10}
    warning = epoch_warning(exploded, 10, previous={"val_loss": 8.2, "val_accuracy": 0.118})
    assert "WARNING" in warning and "2.243e+04" in warning and "the epoch before: 8.2" in warning
    assert epoch_warning(exploded, 10) == ""  # the first epoch: no epoch before it
    # One such epoch, before or after a sane one, as the food101 spec had on a GPU after its first epoch.
    assert epoch_warning(exploded, 10, previous={"val_loss": 2.2, "val_accuracy": 0.12}) == ""
    assert epoch_warning({"val_loss": 2.2, "val_accuracy": 0.23}, 10, previous=exploded) == ""
    overconfident_yet_learning = {"val_loss": 9.0, "val_accuracy": 0.45}
    assert epoch_warning(overconfident_yet_learning, 10, previous=exploded) == ""


def test_imagenet_weights_missing_offline_name_the_cache_and_how_to_seed_it(tmp_path, monkeypatch):
    from workloads.ray_train.trainer import TrainingError
    from workloads.vision.training import model
    from workloads.vision.config import TrainConfig

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    # A closed loopback port stands in for a cluster without internet.
    monkeypatch.setitem(model.IMAGENET_WEIGHTS_URL, "resnet18", "http://127.0.0.1:9/models/resnet18-f37072fd.pth")
    with pytest.raises(TrainingError) as failure:
        model.load_pretrained_state(TrainConfig(weights="imagenet"))
    message = str(failure.value)
    assert str(tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in message
    assert "TORCH_HOME" in message and "IMAGENET1K_V1" in message and "downloading them" in message
    assert not (tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth").exists()


def test_imagenet_weights_from_a_pre_seeded_cache_fine_tune_with_a_frozen_backbone(tiny_run):
    # The shared run starts from "ImageNet" weights seeded into torch.hub's cache (tests/support/tiny_run.py),
    # which nothing downloads, with the backbone frozen for its first epoch.
    import torch

    pretrained, run_dir = tiny_run.pretrained, tiny_run.outcome.run_dir
    assert tiny_run.params.train.weights == "imagenet" and tiny_run.params.train.freeze_epochs == 1
    frozen = torch.load(run_dir / "checkpoint_epoch_0001" / "state.pt", map_location="cpu", weights_only=False)
    unfrozen = torch.load(run_dir / "checkpoint_epoch_0002" / "state.pt", map_location="cpu", weights_only=False)
    # Epoch 1 trained the new head only; epoch 2 the whole network.
    assert torch.equal(frozen["model"]["layer4.1.conv2.weight"], pretrained["layer4.1.conv2.weight"])
    assert frozen["model"]["fc.weight"].shape == (len(CLASSES), 512)
    assert not torch.equal(unfrozen["model"]["layer4.1.conv2.weight"], pretrained["layer4.1.conv2.weight"])
    assert unfrozen["config"]["layout"]["mean"] == pytest.approx([0.485, 0.456, 0.406])


def test_loader_processes_never_outnumber_the_cpus_beside_the_training_process():
    from workloads.vision.config import TrainConfig
    from workloads.vision.reading.batches import effective_loader_workers

    assert effective_loader_workers(TrainConfig(loader_workers=2, cpus_per_worker=1)) == 0
    assert effective_loader_workers(TrainConfig(loader_workers=2, cpus_per_worker=4)) == 2
    assert effective_loader_workers(TrainConfig(loader_workers=4, cpus_per_worker=3)) == 2
    assert effective_loader_workers(TrainConfig(loader_workers=2, cpus_per_worker=1, use_gpu=True)) == 2


def test_batch_norm_statistics_are_estimated_again_from_the_last_training_batches_with_the_weights_fixed():
    from collections import deque
    from types import SimpleNamespace

    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.training.recipe import recalibrate_batch_norm

    # Statistics gathered step by step, far from what the model's inputs look like now.
    norm = torch.nn.BatchNorm2d(3)
    norm.running_mean.fill_(50.0)
    norm.running_var.fill_(900.0)
    generator = torch.Generator().manual_seed(0)
    batches = deque((torch.rand(8, 3, 4, 4, generator=generator) * 4 + 2 for _ in range(5)), maxlen=32)
    expected_mean = torch.stack([batch.mean(dim=(0, 2, 3)) for batch in batches]).mean(dim=0)
    expected_var = torch.stack([batch.var(dim=(0, 2, 3)) for batch in batches]).mean(dim=0)  # unbiased per batch
    model = torch.nn.Sequential(norm).eval()
    worker = SimpleNamespace(recent_batches=batches, unwrapped_model=model, world_size=1, use_amp=False,
                             device=torch.device("cpu"), normalize=lambda images: images.float())
    recalibrate_batch_norm(worker)
    assert torch.allclose(norm.running_mean, expected_mean, atol=1e-5)
    assert torch.allclose(norm.running_var, expected_var, atol=1e-4)
    assert norm.momentum == 0.1 and not batches, "the training's momentum is back; the batches are used up"

    # On by default only where a worker's batch is small.
    assert TrainConfig(batch_size=16).recalibration_batches(world_size=2) == 32
    assert TrainConfig(batch_size=64).recalibration_batches(world_size=2) == 0
    assert TrainConfig(batch_size=64, batch_norm_recalibration=4).recalibration_batches(world_size=2) == 4
