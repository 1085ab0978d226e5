"""The one small training run the workload tests share: trained once per session, on the in-process Ray.

Three colour classes at 16 px, two Ray Train workers, two epochs, fine-tuned from ImageNet weights read
from a pre-seeded torch.hub cache with the backbone frozen for the first epoch. Rank 1 dies at the start
of the second epoch and Ray Train restores the run from the first epoch's checkpoint, so the same run
proves fine-tuning, recovery, the artefacts of a finished run and (after it) batch inference over its
validation split. Every Ray Train run costs tens of CPU-seconds of processes, so one run serves them all.
Tests that change a run work on a copy (:func:`copy_run`), so none depends on the order they run in.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.images import write_tiny_dataset
from tests.support.train_faults import fail_workers_at_epoch

CLASSES = ["red", "green", "blue"]
TRAIN_PER_CLASS, VAL_PER_CLASS = 12, 5  # 15 validation rows: two ranks cannot split them evenly
IMAGE_SIZE = 16
RUN_NAME = "tiny"
FAILING_EPOCH_INDEX = 1  # rank 1 exits at the start of epoch 2
# torch.hub's cache layout; the hash in the name is only checked when downloading.
IMAGENET_CACHE_FILE = Path("hub") / "checkpoints" / "resnet18-f37072fd.pth"
PRETRAINED_SEED = 7


def tiny_params(dataset: Path, storage: Path, run_name: str = RUN_NAME, **train: Any):
    """The vision parameters of a run on the tiny dataset; ``train`` overrides the training settings."""
    from workloads.vision.config import VisionParams

    # amp false: the tests recompute the validation figures in fp32 and compare them exactly, on any CPU.
    settings = {"epochs": 2, "batch_size": 8, "num_workers": 2, "cpus_per_worker": 1, "lr": 0.01,
                "optimizer": "adamw", "num_to_keep": 5, "max_failures": 0, "amp": False, **train}
    return VisionParams.model_validate({
        "run_name": run_name, "storage_path": str(storage),
        "data": {"output_dir": str(dataset), "image_size": IMAGE_SIZE},
        "train": settings,
        # One model actor: a pool of two (the quickstart's) is run by tests/test_vision_e2e_cluster.py.
        "infer": {"batch_size": 4, "num_actors": 1, "cpus_per_actor": 1},
    })


def dataset_info(dataset: Path):
    """The preprocess stage's description of a dataset folder."""
    from workloads.vision.reading.manifest import load_dataset_info

    return load_dataset_info(dataset)


@dataclass
class TinyRun:
    """What the shared run left, read right after it finished (before any test touched it)."""

    dataset: Path
    params: Any  # VisionParams
    outcome: Any  # the training stage's outcome
    rows: list[dict[str, float]]  # metrics.csv
    inference: dict[str, Any]  # the infer stage's metrics
    infer_printed: str  # what the infer stage, run alone on the finished run, printed
    torch_home: Path  # TORCH_HOME whose torch.hub cache holds the "ImageNet" weights the run started from
    pretrained: dict[str, Any]  # those weights (a ResNet-18 state dict)


def write_tiny_data(directory: Path) -> Path:
    """The tiny dataset, in the preprocess stage's layout."""
    return write_tiny_dataset(directory, CLASSES, {"train": TRAIN_PER_CLASS, "val": VAL_PER_CLASS},
                              image_size=IMAGE_SIZE)


def seed_imagenet_cache(torch_home: Path) -> dict[str, Any]:
    """Put a ResNet-18 state dict where torch.hub caches the ImageNet weights under ``torch_home``; return it.

    Seeded weights, not the published ones: nothing is downloaded, and the tests only need to tell them apart
    from a fresh model's.
    """
    import torch
    from torchvision.models import resnet18

    seeded = torch_home / IMAGENET_CACHE_FILE
    seeded.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(PRETRAINED_SEED)
    pretrained = resnet18(weights=None).state_dict()
    torch.save(pretrained, seeded)
    return pretrained


def train_tiny_run(directory: Path) -> TinyRun:
    """Train the shared run under ``directory`` (losing rank 1 once), then run the infer stage alone on it.

    The infer stage runs as the entry point runs a spec with ``stages: [infer]``, so the same run also
    proves that a stage runs alone on an existing run.
    """
    import contextlib
    import io

    from workloads.ray_train.metrics import read_metrics_csv
    from workloads.vision.__main__ import run_stages
    from workloads.vision.training.stage import run_training

    dataset = write_tiny_data(directory / "data")
    torch_home = directory / "torch"
    pretrained = seed_imagenet_cache(torch_home)
    params = tiny_params(dataset, directory / "runs", max_failures=1, weights="imagenet", freeze_epochs=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(torch_home))
        fail_workers_at_epoch(patch, FAILING_EPOCH_INDEX)
        outcome = run_training(params, dataset_info(dataset))
    rows = read_metrics_csv(outcome.run_dir / "metrics.csv")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        produced = run_stages(params.model_copy(update={"stages": ["infer"]}))
    return TinyRun(dataset=dataset, params=params, outcome=outcome, rows=rows, inference=produced["infer"],
                   infer_printed=printed.getvalue(), torch_home=torch_home, pretrained=pretrained)


def copy_run(run: TinyRun, storage: Path):
    """A copy of the shared run under another storage path; its parameters there."""
    shutil.copytree(run.outcome.run_dir, storage / run.params.run_name)
    return run.params.model_copy(update={"storage_path": storage})


def run_spec_in_process(spec: str, *overrides: str) -> dict[str, Any]:
    """Run the stages of a vision spec (``specs/…``, with ``--set`` overrides) on the in-process Ray.

    What the spec's job would run, without the job around it: the workload tests check what the
    stages produce, and submission and following are the CLI tests' concern.
    """
    from jobs.loader import load_spec
    from tests.support.cli import REPO_ROOT
    from workloads.vision.__main__ import check_params_storage, run_stages

    loaded = load_spec(REPO_ROOT / spec, list(overrides))
    check_params_storage(loaded.workload)
    return run_stages(loaded.workload, loaded.spec.sweep)
