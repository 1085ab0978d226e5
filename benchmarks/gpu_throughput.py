"""The workload's training on a GPU against the bare training step on the same card, at the same batch.

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/gpu_throughput.py \\
        [--data DIR] [--size 224] [--batch 256] [--epochs 6] [--loader-workers 4] [--json PATH]

By hand, on a machine with a CUDA GPU: ``run_all.py`` runs on CPUs, and without a GPU this prints
why it skipped and exits 0. Side by side, on one card:

- **the bare step**: ResNet-18 on random tensors already on the GPU, with the loop's settings
  (bf16 autocast, channels_last, fused AdamW, label smoothing 0.1): the baseline;
- **the workload**: ``specs/food101.yaml`` preprocessed and trained through Ray Train on a private
  Ray instance, one worker with the GPU, at the same global batch, in the spec's defaults
  otherwise (``decode: auto`` decodes the JPEGs on the card).

The workload's rate is the training images of its steady epochs (the second onwards) over their
training pass (``data_wait_s + compute_s`` in ``metrics.csv``); the epoch's wall time, evaluation
and checkpoint included, is printed beside it. GPU utilisation is ``nvidia-smi`` sampled every
200 ms over the steady epochs. Goal: the workload at ≥ 0.7× the bare step, the card ≥ 85 % busy.

``--device cpu`` runs the same comparison on the CPU, to check the harness on a machine without
a GPU; its figures are not the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import start_private_ray  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "food101-64px-dev"


class GpuSampler:
    """``nvidia-smi``'s utilisation and memory in use, sampled every 200 ms while the block runs.

    ``steady_from(t)`` keeps the samples taken after ``time.monotonic()`` reached ``t``. Without
    ``nvidia-smi`` (the CPU check) it samples nothing.
    """

    def __enter__(self) -> "GpuSampler":
        self.samples: list[tuple[float, float, float]] = []
        self.process = None
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 "-lms", "200"], stdout=subprocess.PIPE, text=True)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                utilisation, memory = (float(value) for value in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), utilisation, memory))

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    def steady_from(self, since: float) -> dict:
        """Mean utilisation (%) and the most memory in use (MiB) over the samples after ``since``."""
        kept = [sample for sample in self.samples if sample[0] >= since]
        if not kept:
            return {"utilisation": None, "memory_mib": None}
        return {"utilisation": sum(sample[1] for sample in kept) / len(kept),
                "memory_mib": max(sample[2] for sample in kept)}


def load_resnet_module():
    """``resnet.py`` by its path: the training package's ``__init__`` chain would import Ray."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("workload_resnet", REPO_ROOT / "workloads/vision/training/resnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_step(batch: int, device: str, classes: int = 10):
    """One training step of a fresh ResNet-18 with the workload's loop settings, on ``device``."""
    import torch
    import torch.nn.functional as F

    model = load_resnet_module().ResNet18(num_classes=classes).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    labels = torch.randint(0, classes, (batch,), device=device)

    def step(images) -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def bare_step(batch: int, size: int, device: str, warmup: int, steps: int) -> dict:
    """The bare step's images/s at ``batch`` on tensors already on ``device``, and the card's use meanwhile."""
    import torch

    step = training_step(batch, device)
    images = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    for _ in range(warmup):
        step(images)
    synchronize(device)
    with GpuSampler() as gpu:
        started, since = time.perf_counter(), time.monotonic()
        for _ in range(steps):
            step(images)
        synchronize(device)
        seconds = time.perf_counter() - started
    return {"images_s": batch * steps / seconds, **gpu.steady_from(since)}


def workload_settings(data: Path, scratch: Path, size: int, batch: int, epochs: int, loader_workers: int,
                      device: str) -> list[str]:
    """The changes to specs/food101.yaml for one GPU worker at ``batch``, and nothing else of the recipe."""
    classes = (data / "meta" / "classes.txt").read_text(encoding="utf-8").split()
    cpus = os.cpu_count() or 2
    return [
        f"workload.data.root={data}", f"workload.data.classes=[{', '.join(classes)}]",
        f"workload.data.image_size={size}", f"workload.data.output_dir={scratch / 'data'}",
        f"workload.storage_path={scratch / 'results'}", "workload.stages=[preprocess, train]",
        f"workload.train.epochs={epochs}", f"workload.train.batch_size={batch}",
        "workload.train.num_workers=1", f"workload.train.cpus_per_worker={max(1, cpus - 1)}",
        f"workload.train.loader_workers={loader_workers}", f"workload.train.use_gpu={str(device == 'cuda').lower()}",
    ]


def run_workload(settings: list[str], cpus: int) -> dict:
    """Preprocess and train the spec; the steady epochs' training-pass rate, epoch rate and the card's use."""
    import ray

    from jobs.loader import load_spec
    from workloads.ray_train.metrics import read_metrics_csv
    from workloads.vision.preprocess.stage import run_preprocess
    from workloads.vision.training.stage import run_training

    params = load_spec(REPO_ROOT / "specs" / "food101.yaml", settings).workload
    start_private_ray(cpus, log_to_driver=True)
    try:
        info = run_preprocess(params.data)
        with GpuSampler() as gpu:
            outcome = run_training(params, info)
            ended = time.monotonic()
    finally:
        ray.shutdown()
    rows = read_metrics_csv(outcome.metrics_csv)
    steady = rows[1:] or rows
    images = sum(row["images_per_s"] * row["epoch_s"] for row in steady)  # images_per_s counts the epoch's wall time
    pass_seconds = sum(row["data_wait_s"] + row["compute_s"] for row in steady)
    epoch_seconds = sum(row["epoch_s"] for row in steady)
    return {"train_pass_images_s": images / pass_seconds if pass_seconds else float("nan"),
            "epoch_images_s": images / epoch_seconds if epoch_seconds else float("nan"),
            "data_wait_share": sum(row["data_wait_s"] for row in steady) / pass_seconds if pass_seconds else None,
            "epochs": len(rows),
            # The steady epochs are the run's last epoch_seconds (less the few ms of its end).
            **gpu.steady_from(ended - epoch_seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="a Food-101 subset in the official layout (default: the 64 px dev set beside the project)")
    parser.add_argument("--size", type=int, default=224, help="the image side the spec trains at")
    parser.add_argument("--batch", type=int, default=256, help="global batch of both sides (the spec's GPU default)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--loader-workers", type=int, default=4, help="DataLoader processes of the GPU worker")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps of the bare step")
    parser.add_argument("--steps", type=int, default=40, help="timed steps of the bare step")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the same comparison on the CPU, to check the harness without a GPU")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a further change to the spec, as `rayjobs submit --set` takes it (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA GPU here"
        print(f"gpu_throughput: skipped, {reason}")
        if args.json:
            args.json.write_text(json.dumps({"skipped": reason}))
        return 0
    if not (args.data / "meta" / "classes.txt").is_file():
        print(f"gpu_throughput: {args.data} is not a Food-101 subset in the official layout", file=sys.stderr)
        return 2
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"{card}, torch {torch.__version__}; global batch {args.batch} at {args.size} px", flush=True)
    bare = bare_step(args.batch, args.size, args.device, args.warmup, args.steps)
    print(f"bare step: {bare['images_s']:,.0f} images/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as scratch:
        settings = workload_settings(args.data, Path(scratch), args.size, args.batch, args.epochs,
                                     args.loader_workers, args.device) + args.settings
        workload = run_workload(settings, os.cpu_count() or 2)

    def used(side: dict) -> str:
        if side.get("utilisation") is None:
            return "not sampled"
        return f"{side['utilisation']:.0f} %, {side['memory_mib']:,.0f} MiB"

    ratio = workload["train_pass_images_s"] / bare["images_s"]
    print("| side | images/s | × bare step | GPU utilisation, memory |")
    print("|---|---|---|---|")
    print(f"| bare step, tensors already on the device | {bare['images_s']:,.0f} | 1.00 | {used(bare)} |")
    print(f"| workload, training pass of epochs 2–{workload['epochs']} | {workload['train_pass_images_s']:,.0f} | "
          f"{ratio:.2f} | {used(workload)} |")
    print(f"| workload, whole epochs (evaluation and checkpoint included) | {workload['epoch_images_s']:,.0f} | "
          f"{workload['epoch_images_s'] / bare['images_s']:.2f} | |")
    if workload["data_wait_share"] is not None:
        print(f"waiting for data: {workload['data_wait_share']:.0%} of the training pass")
    if args.json:
        args.json.write_text(json.dumps({"device": card, "torch": torch.__version__, "batch": args.batch,
                                         "size": args.size, "bare": bare, "workload": workload,
                                         "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
