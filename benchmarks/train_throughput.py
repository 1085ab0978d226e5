"""Training throughput of the vision workload against plain-PyTorch baselines.

1. Ray Train: the workload's own ``run_training`` with TorchTrainer, 2 workers x 1 CPU,
   against the same loop written as plain PyTorch DDP and launched with
   ``torchrun --nproc_per_node 2`` (gloo). Same model, data, sampler, batch and
   thread count; the figure is the images/s of the last epoch's training steps.
2. Data path: training steps/s when batches come from the Parquet dataset
   (decode + augment in the loop) against pre-made in-memory tensors.

Rounds are interleaved and medians reported. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/train_throughput.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import start_private_ray  # noqa: E402


def write_dataset(root: Path, train_images: int, val_images: int, size: int, classes: int = 10) -> Path:
    """Noise-textured JPEGs (costly to decode like photos) in the preprocess stage's Parquet layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train_images), ("val", val_images)):
        rows = {"image": [], "label": [], "class_name": [], "split": [], "path": []}
        for i in range(count):
            label = i % classes
            pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
            rows["image"].append(buffer.getvalue())
            rows["label"].append(label)
            rows["class_name"].append(f"class{label}")
            rows["split"].append(split)
            rows["path"].append(f"{split}/{i}.jpg")
        (root / split).mkdir(parents=True, exist_ok=True)
        table = pa.table(rows)
        # The preprocess stage's layout: one 256-row group per part file.
        for part, start in enumerate(range(0, count, 256)):
            pq.write_table(table.slice(start, 256), root / split / f"part-{part:05d}.parquet", row_group_size=256)
    manifest = {"classes": [f"class{i}" for i in range(classes)], "image_size": size,
                "counts": {"train": train_images, "val": val_images}}
    (root / "_manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


# --------------------------------------------------------------------------- plain DDP (torchrun)


def ddp_worker(args) -> None:
    """One torchrun process: the workload's training step as plain PyTorch DDP."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from workloads.vision.config import TrainConfig
    from workloads.vision.dataset import AugmentingCollate, GroupedShardSampler, ParquetImageDataset, split_files
    from workloads.vision.images import ImageLayout, normalize
    from workloads.vision.model import build_model
    from workloads.vision.recipe import make_optimizer, make_scheduler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch, optimizer="sgd", lr=0.05)
    layout = ImageLayout.photos(args.size)
    dataset = ParquetImageDataset(split_files(Path(args.data), "train"), layout)
    sampler = GroupedShardSampler(dataset, num_replicas=world, rank=rank, shuffle=True, pad=True)
    loader = DataLoader(dataset, batch_size=args.batch // world, sampler=sampler,
                        collate_fn=AugmentingCollate(layout.augment))
    model = torch.nn.parallel.DistributedDataParallel(build_model(cfg, 10, layout))
    optimizer = make_optimizer(model.module, cfg)
    scheduler = make_scheduler(optimizer, cfg, len(loader))
    loss_fn = torch.nn.CrossEntropyLoss()
    rates = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss_total = torch.zeros((), dtype=torch.float64)
        seen = 0
        start = time.perf_counter()
        for images, labels in loader:
            loss = loss_fn(model(normalize(images, layout)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_total += loss.detach().double() * labels.shape[0]
            seen += labels.shape[0]
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        rates.append(seen * world / elapsed.item())
    if rank == 0:
        print("RESULT " + json.dumps({"images_per_s": rates[-1]}), flush=True)
    dist.destroy_process_group()


def run_torchrun(data: Path, args) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(29500 + os.getpid() % 1000), __file__, "--ddp-worker", "--data", str(data),
               "--epochs", str(args.epochs), "--batch", str(args.batch), "--size", str(args.size)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])["images_per_s"]
    raise RuntimeError(f"torchrun run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def run_ray_train(data: Path, storage: Path, name: str, args) -> float:
    from workloads.vision.config import VisionParams
    from workloads.vision.preprocess import load_dataset_info
    from workloads.vision.train import run_training

    params = VisionParams.model_validate({
        "run_name": name, "storage_path": str(storage),
        "train": {"epochs": args.epochs, "batch_size": args.batch, "num_workers": 2, "cpus_per_worker": 1,
                  "optimizer": "sgd", "lr": 0.05, "num_to_keep": 1, "max_failures": 0},
    })
    outcome = run_training(params, load_dataset_info(data))
    rate = outcome.final_metrics["images_per_s"]
    shutil.rmtree(outcome.run_dir, ignore_errors=True)
    return rate


# --------------------------------------------------------------------------- data path


def data_path_rates(data: Path, args) -> tuple[float, float]:
    """Training steps/s from the Parquet dataset and from in-memory batches (one process, one thread)."""
    import torch
    from torch.utils.data import DataLoader

    from workloads.vision.config import TrainConfig
    from workloads.vision.dataset import AugmentingCollate, GroupedShardSampler, ParquetImageDataset, split_files
    from workloads.vision.images import ImageLayout, normalize
    from workloads.vision.model import build_model
    from workloads.vision.recipe import make_optimizer

    torch.set_num_threads(1)
    per_worker = args.batch // 2
    layout = ImageLayout.photos(args.size)
    dataset = ParquetImageDataset(split_files(data, "train"), layout)
    loader = DataLoader(dataset, batch_size=per_worker, collate_fn=AugmentingCollate(layout.augment),
                        sampler=GroupedShardSampler(dataset, num_replicas=1, rank=0, shuffle=True))
    synthetic = [(torch.randint(0, 256, (per_worker, 3, args.size, args.size), dtype=torch.uint8),
                  torch.randint(0, 10, (per_worker,))) for _ in range(8)]
    model = build_model(TrainConfig(), 10, layout)
    optimizer = make_optimizer(model, TrainConfig(optimizer="sgd", lr=0.01))
    loss_fn = torch.nn.CrossEntropyLoss()

    def steps_per_s(batches, steps: int) -> float:
        model.train()
        count, start = 0, None
        for images, labels in batches:
            if count == 3:  # skip warm-up steps
                start = time.perf_counter()
            loss = loss_fn(model(normalize(images, layout)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            count += 1
            if count == steps + 3:
                break
        return steps / (time.perf_counter() - start)

    def cycle(items):
        while True:
            yield from items

    real, fake = [], []
    for _ in range(args.rounds):
        real.append(steps_per_s(loader, args.data_steps))
        fake.append(steps_per_s(cycle(synthetic), args.data_steps))
    return statistics.median(real), statistics.median(fake)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=640, help="training images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=32, help="global batch size")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is measured")
    parser.add_argument("--data-steps", type=int, default=25, help="steps per data-path measurement")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ddp_worker:
        ddp_worker(args)
        return

    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-train-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", args.images, 64, args.size)
        print(f"dataset: {args.images} train images of {args.size}px at {data}; global batch {args.batch}, "
              f"{args.epochs} epochs per run, {args.rounds} rounds", flush=True)

        real, fake = data_path_rates(data, args)
        print(f"[data path] Parquet dataset {real:.2f} steps/s vs in-memory batches {fake:.2f} steps/s "
              f"-> ratio {real / fake:.2f} (target >= 0.90)", flush=True)

        if not args.skip_ddp:
            import ray

            start_private_ray(2)
            ray_rates, ddp_rates = [], []
            for round_index in range(args.rounds):
                order = ["ray", "ddp"] if round_index % 2 == 0 else ["ddp", "ray"]
                for which in order:
                    if which == "ray":
                        ray_rates.append(run_ray_train(data, scratch / "runs", f"bench-{round_index}", args))
                    else:
                        ddp_rates.append(run_torchrun(data, args))
                print(f"  round {round_index + 1}: TorchTrainer {ray_rates[-1]:.1f} images/s, "
                      f"torchrun DDP {ddp_rates[-1]:.1f} images/s", flush=True)
            ray.shutdown()
            ray_median, ddp_median = statistics.median(ray_rates), statistics.median(ddp_rates)
            print(f"[trainer] TorchTrainer 2x1 CPU {ray_median:.1f} images/s vs torchrun DDP 2 procs "
                  f"{ddp_median:.1f} images/s -> ratio {ray_median / ddp_median:.2f} (target >= 0.90)", flush=True)
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
