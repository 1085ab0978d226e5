"""ResNet-18 without torchvision: torchvision's own, weight for weight, and inference never imports torchvision."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("zero_init_residual", [False, True])
def test_the_same_seed_gives_torchvisions_resnet18_weight_for_weight(zero_init_residual):
    import torch
    from torchvision.models import resnet18

    from workloads.vision.training.resnet import ResNet18

    torch.manual_seed(7)
    theirs = resnet18(weights=None, num_classes=10, zero_init_residual=zero_init_residual)
    torch.manual_seed(7)
    ours = ResNet18(num_classes=10, zero_init_residual=zero_init_residual)

    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)  # torchvision's keys, in its order: its weights load as they are
    for key, value in their_state.items():
        assert torch.equal(our_state[key], value), key

    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for mode in ("train", "eval"):
        getattr(theirs, mode)(), getattr(ours, mode)()
        assert torch.equal(ours(images), theirs(images)), mode
    assert torch.equal(ours.bn1.running_mean, theirs.bn1.running_mean)


@pytest.mark.processes
def test_loading_a_checkpoint_and_classifying_never_import_torchvision(tmp_path):
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.model import STATE_FILE, build_model

    layout = ImageLayout.photos(32)
    torch.save({"model": build_model(TrainConfig(), 10, layout).state_dict(), "classes": [str(i) for i in range(10)],
                "config": {"image_size": 32, "layout": layout.to_dict()}, "epoch": 0}, tmp_path / STATE_FILE)
    # What every inference actor does in its constructor and its first batch, in a fresh process.
    probe = f"""
import sys, torch
import workloads.vision.inference.stage
from workloads.vision.inference.classify import classify_tensors, load_checkpoint_model
loaded = load_checkpoint_model({str(tmp_path)!r})
classify_tensors(loaded, torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
print(sorted(name for name in sys.modules if name.startswith(("torchvision", "torch._dynamo"))))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
