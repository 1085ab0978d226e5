"""Batch-inference throughput of the vision workload against two baselines.

- Ray Data actor pool (the workload's ``BatchPredictor``, 2 actors x 1 CPU, each
  loading the model once) over the validation Parquet, end to end (read, decode,
  classify, collect), against
- per-image Ray tasks that each load the model (the single-image path used for a
  whole split; target: the pool is >= 5x faster), and
- one process running the same batched loop with 2 threads (target: the pool
  reaches >= 0.8x of it). The pool's figure includes starting its actor processes;
  the seconds until its first predictions and its rate after them are printed too.

Beside them, what the stage does with ``num_actors: auto`` (the quickstart's default) where the
split is small: ``predictions_in_process``, the same ``BatchPredictor`` in the job's own process
with 2 threads, model loading included (goals: >= 1.0x the single process end to end, first
predictions <= 3 s after the call).

The data is in the preprocess stage's layout (one 256-row group per file).

Each side is warmed up once (Ray's worker processes exist afterwards, as they do on a
cluster that has run anything), then the rounds alternate their order; medians are
reported with the lowest and highest round. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/inference_throughput.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Spread, Stamp, add_json_option, alternate, plural,  # noqa: E402
                               start_private_ray)
from benchmarks.train_throughput import write_dataset  # noqa: E402


def make_checkpoint(directory: Path, size: int) -> Path:
    """A checkpoint in the training stage's format (random weights: speed does not depend on them)."""
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.model import STATE_FILE, build_model

    directory.mkdir(parents=True, exist_ok=True)
    layout = ImageLayout.photos(size)
    model = build_model(TrainConfig(), 10, layout)
    torch.save({"model": model.state_dict(), "classes": [f"class{i}" for i in range(10)],
                "config": {"image_size": size, "layout": layout.to_dict()}, "epoch": 0}, directory / STATE_FILE)
    return directory


def actor_pool(files: list[str], checkpoint: Path, batch: int, actors: int) -> tuple[float, float, float]:
    """(images/s end to end, seconds until the first predictions, images/s after them)."""
    from workloads.vision.config import InferConfig
    from workloads.vision.inference.stage import prediction_dataset

    start = time.perf_counter()
    config = InferConfig(batch_size=batch, num_actors=actors, cpus_per_actor=1)
    rows, first, rows_at_first = 0, None, 0
    for predictions in prediction_dataset(files, checkpoint, config).iter_batches(batch_size=None):
        if first is None:
            first, rows_at_first = time.perf_counter(), rows
        rows += len(predictions["label"])
    end = time.perf_counter()
    return rows / (end - start), first - start, (rows - rows_at_first) / max(end - first, 1e-9)


def in_process(files: list[str], checkpoint: Path, batch: int, threads: int) -> tuple[float, float]:
    """(images/s end to end, seconds until the first predictions) of the stage's in-process path."""
    from workloads.vision.inference.stage import predictions_in_process

    start = time.perf_counter()
    rows, first = 0, None
    for predictions in predictions_in_process(files, checkpoint, batch, threads):
        if first is None:
            first = time.perf_counter()
        rows += len(predictions["label"])
    return rows / (time.perf_counter() - start), first - start


def per_image_tasks(files: list[str], checkpoint: Path, count: int) -> float:
    """Images/s of one ``classify_image_task`` per image, each loading the model, over ``count`` images."""
    import pyarrow.parquet as pq
    import ray

    from workloads.vision.inference.classify import classify_image_task

    images = pq.read_table(files[0], columns=["image"]).column("image").to_pylist()[:count]
    start = time.perf_counter()
    ray.get([classify_image_task.remote(str(checkpoint), image) for image in images])
    return len(images) / (time.perf_counter() - start)


def single_process(files: list[str], checkpoint: Path, batch: int, threads: int) -> float:
    """Images/s of the same batched loop in this process, with ``threads`` torch threads, model loading included."""
    import pyarrow.parquet as pq
    import torch

    from workloads.vision.images import decode_batch
    from workloads.vision.inference.classify import classify_tensors, load_checkpoint_model

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        loaded = load_checkpoint_model(checkpoint)
        rows = 0
        for path in files:
            parquet_file = pq.ParquetFile(path)
            for group in range(parquet_file.num_row_groups):
                images = parquet_file.read_row_group(group, columns=["image"]).column("image").to_pylist()
                for first in range(0, len(images), batch):
                    chunk = images[first:first + batch]
                    classify_tensors(loaded, decode_batch(chunk, loaded.layout))
                    rows += len(chunk)
        return rows / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=3000, help="validation images for the batched runs")
    parser.add_argument("--task-images", type=int, default=40, help="images for the per-image-task baseline")
    # 128 px: small enough for CPU inference, large enough that classifying costs
    # more than the pool's fixed start-up (see docs/benchmarks.md for 64 and 224 px).
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--actors", type=int, default=2)
    add_json_option(parser)
    args = parser.parse_args()

    import ray
    from ray.data import DataContext

    stamp = Stamp.begin()
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-infer-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", 16, args.images, args.size)
        files = [str(f) for f in sorted((data / "val").glob("*.parquet"))]
        checkpoint = make_checkpoint(scratch / "checkpoint", args.size)
        start_private_ray(2)
        DataContext.get_current().enable_progress_bars = False
        print(f"{args.images} images of {args.size}px, batch {args.batch}, {args.actors} actors x 1 CPU, "
              f"{args.rounds} rounds", flush=True)

        def show(index: int, last: dict) -> None:
            rate, to_first, after = last["pool"]
            print(f"  round {index + 1}: actor pool {rate:.1f} (first predictions after {to_first:.1f} s, then "
                  f"{after:.1f}), per-image tasks {last['tasks']:.1f}, single process {last['local']:.1f}, "
                  f"in the job's process {last['auto'][0]:.1f} (first after {last['auto'][1]:.2f} s) images/s",
                  flush=True)

        results = alternate({
            "pool": lambda: actor_pool(files, checkpoint, args.batch, args.actors),
            "tasks": lambda: per_image_tasks(files, checkpoint, args.task_images),
            "local": lambda: single_process(files, checkpoint, args.batch, 2),
            "auto": lambda: in_process(files, checkpoint, args.batch, 2),
        }, args.rounds, show=show)
        ray.shutdown()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = Result(f"inference_{args.size}", f"Batch inference at {args.size} px",
                    ["setup", "actor pool", "per-image tasks", "single process, 2 threads", "pool / tasks",
                     "pool / single", "in the job's process (auto)", "auto / single"], [], stamp)
    pool = result.figure("pool_images_per_s", Spread.of([r[0] for r in results["pool"]]), "images/s")
    startup = result.figure("pool_first_predictions_s", Spread.of([r[1] for r in results["pool"]]), "s")
    steady = result.figure("pool_after_first_images_per_s", Spread.of([r[2] for r in results["pool"]]), "images/s")
    tasks = result.figure("tasks_images_per_s", Spread.of(results["tasks"]), "images/s")
    local = result.figure("local_images_per_s", Spread.of(results["local"]), "images/s")
    pool_rates = [r[0] for r in results["pool"]]
    vs_tasks = result.figure("pool_vs_tasks", Spread.ratio(pool_rates, results["tasks"]), "x")
    vs_local = result.figure("pool_vs_local", Spread.ratio(pool_rates, results["local"]), "x")
    steady_vs_local = result.figure("steady_vs_local", Spread.ratio([r[2] for r in results["pool"]],
                                                                     results["local"]), "x")
    auto = result.figure("auto_images_per_s", Spread.of([r[0] for r in results["auto"]]), "images/s")
    auto_first = result.figure("auto_first_predictions_s", Spread.of([r[1] for r in results["auto"]]), "s")
    auto_vs_local = result.figure("auto_vs_local", Spread.ratio([r[0] for r in results["auto"]], results["local"]),
                                  "x")
    print(f"[auto, in the job's process] {auto.text()} images/s -> {auto_vs_local.text(2)}x the single process "
          f"(target >= 1.0x); first predictions after {auto_first.text(2)} s (target <= 3 s)")
    print(f"[vs per-image tasks] actor pool {pool.text()} vs {tasks.text()} images/s -> {vs_tasks.text()}x "
          "(target >= 5x)")
    print(f"[vs single process] actor pool {pool.text()} vs {local.text()} images/s -> {vs_local.text(2)}x "
          "(target >= 0.80x)")
    print(f"[steady state] after its first predictions ({startup.text()} s: actor processes start and load the "
          f"model) the pool runs at {steady.text()} images/s -> {steady_vs_local.text(2)}x of the single process")
    setup = f"{args.size} px, {args.images} images ({args.task_images} for the tasks), {plural(args.rounds, 'round')}"
    result.rows.append([setup,
                        pool.text(1, " images/s"), tasks.text(1, " images/s"), local.text(1, " images/s"),
                        vs_tasks.times(1), vs_local.times(), auto.text(1, " images/s"), auto_vs_local.times()])
    result.notes.append(f"The pool's first predictions came after {startup.text(1, ' s')}; after them it ran at "
                        f"{steady.text(1, ' images/s')}, {steady_vs_local.times()} the single process. "
                        f"Batch {args.batch}, {args.actors} actors × 1 CPU; each side warmed up once. In the job's process "
                        f"(`num_actors: auto` on a split this small) the first predictions came after "
                        f"{auto_first.text(2, ' s')}, model loading included; the goals are ≥ 1.0× the single "
                        "process and ≤ 3 s.")
    print(f"total {time.perf_counter() - started:.0f}s")
    result.save(args.json)


if __name__ == "__main__":
    main()
