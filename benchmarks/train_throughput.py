"""Training throughput of the vision workload: Ray Train's overhead, and the data path's.

1. Ray Train: the workload's own ``run_training`` (TorchTrainer, 2 workers x 1 CPU)
   against the same workers launched by ``torchrun --nproc_per_node 2`` as plain PyTorch
   DDP over gloo. The baseline is not a copy of the loop: it runs the workload's own
   ``setup_worker`` and ``train_one_epoch`` on the config that ``run_training`` builds,
   with only Ray Train's calls swapped for plain PyTorch (benchmarks/plain_torch.py).
   So both sides train with the same optimisations (channels_last, the bf16 gradient
   all-reduce hook, fused AdamW, whatever the workload does next), and the ratio is Ray
   Train's overhead. ``--set channels_last=false --set gradient_allreduce=fp32`` turns
   them off on both sides. The figure is the images/s of the last epoch's training pass.
2. Data path: the workload's ``train_one_epoch`` in one process with one thread, with
   batches from the Parquet dataset (decode + augment in the loop) against the same
   batches decoded once and held in memory. Steps/s of one epoch each.

Each side is warmed up once, then the rounds alternate their order; medians are
reported with the lowest and highest round. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/train_throughput.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Spread, Stamp, add_json_option, alternate, plural,  # noqa: E402
                               start_private_ray)
from benchmarks.plain_torch import (InMemoryBatches, describe, run_torchrun, setup_plain_worker,  # noqa: E402
                                    workload_loop_config)


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


def vision_params(storage: Path, name: str, args, **train):
    """The workload's parameters for one run: its defaults, 2 workers x 1 CPU, and the ``--set`` overrides."""
    from workloads.vision.config import VisionParams

    settings = {"epochs": args.epochs, "batch_size": args.batch, "num_workers": 2, "cpus_per_worker": 1,
                "num_to_keep": 1, "max_failures": 0, **args.overrides, **train}
    return VisionParams.model_validate({"run_name": name, "storage_path": str(storage), "train": settings})


def parse_overrides(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs of ``train`` settings, values read as YAML (as ``rayjobs submit --set`` does)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE, e.g. --set gradient_allreduce=fp32")
        overrides[key.removeprefix("train.")] = yaml.safe_load(value)
    return overrides


# --------------------------------------------------------------------------- Ray Train vs torchrun


def ray_train_rate(data: Path, storage: Path, name: str, args) -> float:
    """Train once through ``run_training``; the last epoch's images/s."""
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.training.stage import run_training

    outcome = run_training(vision_params(storage, name, args), load_dataset_info(data))
    shutil.rmtree(outcome.run_dir, ignore_errors=True)
    return outcome.final_metrics["images_per_s"]


def torchrun_rate(config_file: Path, seen: dict) -> float:
    """Train once as plain DDP under torchrun, 2 processes; the last epoch's images/s.

    ``seen["setup"]`` gets what the baseline's workers trained with, as they describe it.
    """
    # One intra-op thread per process, as Ray gives each 1-CPU worker.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    metrics = run_torchrun(config_file, 2, env)
    seen["setup"] = metrics["setup"]
    return metrics["images_per_s"]


# --------------------------------------------------------------------------- data path


def data_path_sides(data: Path, storage: Path, args) -> dict:
    """Two callables, one epoch each of the workload's training pass: from Parquet, and from memory."""
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.training.loop import train_one_epoch

    # One of the two workers of part 1: half the global batch, one thread, no process group.
    params = vision_params(storage, "data-path", args, batch_size=max(1, args.batch // 2), num_workers=1,
                           epochs=10_000)  # the schedule must not reach its end (lr 0) during the benchmark
    worker = setup_plain_worker(workload_loop_config(params, load_dataset_info(data)), rank=0, world_size=1)
    print(f"data path: {describe(worker)}", flush=True)
    parquet = worker.batches
    remembered = InMemoryBatches(list(parquet.train_epoch(0)))
    epochs = iter(range(10_000))

    def steps_per_s(batches) -> float:
        worker.batches = batches
        training = train_one_epoch(worker, next(epochs))
        return batches.steps_per_epoch / training.seconds

    return {"Parquet dataset": lambda: steps_per_s(parquet), "in-memory batches": lambda: steps_per_s(remembered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=640, help="training images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=32, help="global batch size")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per training run; the last one is measured")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a train setting for both sides, e.g. --set gradient_allreduce=fp32")
    parser.add_argument("--skip-ddp", action="store_true", help="measure the data path only")
    add_json_option(parser)
    args = parser.parse_args()
    args.overrides = parse_overrides(args.overrides)

    stamp = Stamp.begin()
    result = Result("train_throughput", "Training: TorchTrainer vs torchrun DDP, Parquet vs in-memory batches",
                    ["comparison", "ours", "baseline", "ratio (rounds)", "target"], [], stamp)
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-train-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", args.images, 64, args.size)
        settings = ", ".join(f"{k}={v}" for k, v in args.overrides.items()) or "the workload's defaults"
        print(f"dataset: {args.images} train images of {args.size}px at {data}; global batch {args.batch}, "
              f"{args.epochs} epochs per run, {args.rounds} rounds; train settings: {settings}", flush=True)

        path = alternate(data_path_sides(data, scratch / "runs", args), args.rounds, show=lambda i, r: print(
            f"  round {i + 1}: " + ", ".join(f"{k} {v:.2f} steps/s" for k, v in r.items()), flush=True))
        real = result.figure("parquet_steps_per_s", Spread.of(path["Parquet dataset"]), "steps/s")
        fake = result.figure("memory_steps_per_s", Spread.of(path["in-memory batches"]), "steps/s")
        ratio = result.figure("data_path_ratio", Spread.ratio(path["Parquet dataset"], path["in-memory batches"]), "x")
        print(f"[data path] Parquet dataset {real.text(2)} steps/s vs in-memory batches {fake.text(2)} steps/s "
              f"-> ratio {ratio.median:.2f} (rounds {ratio.low:.2f}-{ratio.high:.2f}; target >= 0.90)", flush=True)
        data_row = ["the workload's `train_one_epoch`, one process, 1 thread: Parquet dataset (decode + augment in "
                    "the loop) vs the same batches held in memory", real.text(2, " steps/s"), fake.text(2, " steps/s"),
                    ratio.times(), "≥ 0.9×"]

        if not args.skip_ddp:
            import ray

            from workloads.vision.reading.manifest import load_dataset_info

            # Built once: the baseline trains from exactly what run_training would hand Ray Train.
            config_file = scratch / "loop_config.json"
            loop_config = workload_loop_config(vision_params(scratch / "runs", "ddp", args), load_dataset_info(data))
            config_file.write_text(json.dumps(loop_config), encoding="utf-8")
            start_private_ray(2)
            runs, baseline = iter(range(1_000)), {}
            rates = alternate(
                {"TorchTrainer": lambda: ray_train_rate(data, scratch / "runs", f"bench-{next(runs)}", args),
                 "torchrun DDP": lambda: torchrun_rate(config_file, baseline)},
                args.rounds, show=lambda i, r: print(
                    f"  round {i + 1}: " + ", ".join(f"{k} {v:.1f} images/s" for k, v in r.items()), flush=True))
            ray.shutdown()
            print(f"the baseline's workers trained with: {baseline['setup']}", flush=True)
            result.notes.append(f"The baseline's workers reported training with: {baseline['setup']}.")
            ours = result.figure("torchtrainer_images_per_s", Spread.of(rates["TorchTrainer"]), "images/s")
            base = result.figure("torchrun_images_per_s", Spread.of(rates["torchrun DDP"]), "images/s")
            ratio = result.figure("trainer_ratio", Spread.ratio(rates["TorchTrainer"], rates["torchrun DDP"]), "x")
            print(f"[trainer] TorchTrainer 2x1 CPU {ours.text()} images/s vs torchrun DDP 2 procs {base.text()} "
                  f"images/s -> ratio {ratio.median:.2f} (rounds {ratio.low:.2f}-{ratio.high:.2f}; target >= 0.90)",
                  flush=True)
            result.rows.append([
                "Ray Train `TorchTrainer`, 2 workers × 1 CPU, vs plain PyTorch DDP under "
                "`torchrun --nproc_per_node 2` "
                f"(gloo); both run the workload's `setup_worker` and `train_one_epoch` ({settings})",
                ours.text(1, " images/s"), base.text(1, " images/s"), ratio.times(), "≥ 0.9×"])
        result.rows.append(data_row)
        result.notes.append(f"{args.images} training images of {args.size} px, global batch {args.batch}, "
                            f"{args.epochs} epochs per training run (the last one timed), "
                            f"{plural(args.rounds, 'round')} "
                            "after a warm-up of each side.")
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.save(args.json)


if __name__ == "__main__":
    main()
