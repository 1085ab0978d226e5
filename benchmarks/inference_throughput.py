"""Batch-inference throughput of the vision workload against two baselines.

- Ray Data actor pool (the workload's ``BatchPredictor``, 2 actors x 1 CPU, each
  loading the model once) over the validation Parquet, end to end (read, decode,
  classify, collect), against
- per-image Ray tasks that each load the model (the single-image path used for a
  whole split; target: the pool is >= 5x faster), and
- one process running the same batched loop with 2 threads (target: the pool
  reaches >= 0.8x of it). The pool's figure includes starting its actor processes;
  the seconds until its first predictions and its rate after them are printed too.

The data is in the preprocess stage's layout (one 256-row group per file).

Rounds are interleaved and medians reported. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/inference_throughput.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import start_private_ray  # noqa: E402

from benchmarks.train_throughput import write_dataset  # noqa: E402


def make_checkpoint(directory: Path, size: int) -> Path:
    """A checkpoint in the training stage's format (random weights: speed does not depend on them)."""
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.model import STATE_FILE, build_model

    directory.mkdir(parents=True, exist_ok=True)
    layout = ImageLayout.photos(size)
    model = build_model(TrainConfig(), 10, layout)
    torch.save({"model": model.state_dict(), "classes": [f"class{i}" for i in range(10)],
                "config": {"image_size": size, "layout": layout.to_dict()}, "epoch": 0}, directory / STATE_FILE)
    return directory


def actor_pool(files: list[str], checkpoint: Path, batch: int, actors: int) -> tuple[float, float, float]:
    """(images/s end to end, seconds until the first predictions, images/s after them)."""
    from workloads.vision.config import InferConfig
    from workloads.vision.inference import prediction_dataset

    start = time.perf_counter()
    config = InferConfig(batch_size=batch, num_actors=actors, cpus_per_actor=1)
    rows, first, rows_at_first = 0, None, 0
    for predictions in prediction_dataset(files, checkpoint, config).iter_batches(batch_size=None):
        if first is None:
            first, rows_at_first = time.perf_counter(), rows
        rows += len(predictions["label"])
    end = time.perf_counter()
    return rows / (end - start), first - start, (rows - rows_at_first) / max(end - first, 1e-9)


def per_image_tasks(files: list[str], checkpoint: Path, count: int) -> float:
    import pyarrow.parquet as pq
    import ray

    from workloads.vision.inference import classify_image_task

    images = pq.read_table(files[0], columns=["image"]).column("image").to_pylist()[:count]
    start = time.perf_counter()
    ray.get([classify_image_task.remote(str(checkpoint), image) for image in images])
    return len(images) / (time.perf_counter() - start)


def single_process(files: list[str], checkpoint: Path, batch: int, threads: int) -> float:
    import pyarrow.parquet as pq
    import torch

    from workloads.vision.images import decode_batch
    from workloads.vision.inference import classify_tensors, load_checkpoint_model

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
    args = parser.parse_args()

    import ray
    from ray.data import DataContext

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
        pool, tasks, local, startup, steady = [], [], [], [], []

        def run_pool() -> float:
            rate, seconds_to_first, after_first = actor_pool(files, checkpoint, args.batch, args.actors)
            startup.append(seconds_to_first)
            steady.append(after_first)
            return rate

        for round_index in range(args.rounds):
            runs = [("pool", run_pool, pool),
                    ("tasks", lambda: per_image_tasks(files, checkpoint, args.task_images), tasks),
                    ("local", lambda: single_process(files, checkpoint, args.batch, 2), local)]
            if round_index % 2:
                runs.reverse()
            for _, run, sink in runs:
                sink.append(run())
            print(f"  round {round_index + 1}: actor pool {pool[-1]:.1f} (first predictions after {startup[-1]:.1f} s, "
                  f"then {steady[-1]:.1f}), per-image tasks {tasks[-1]:.1f}, single process {local[-1]:.1f} images/s",
                  flush=True)
        ray.shutdown()
        pool_m, tasks_m, local_m = map(statistics.median, (pool, tasks, local))
        print(f"[vs per-image tasks] actor pool {pool_m:.1f} vs {tasks_m:.1f} images/s -> {pool_m / tasks_m:.1f}x "
              "(target >= 5x)")
        print(f"[vs single process] actor pool {pool_m:.1f} vs {local_m:.1f} images/s -> {pool_m / local_m:.2f}x "
              "(target >= 0.80x)")
        steady_m = statistics.median(steady)
        print(f"[steady state] after its first predictions ({statistics.median(startup):.1f} s: actor processes "
              f"start and load the model) the pool runs at {steady_m:.1f} images/s -> {steady_m / local_m:.2f}x "
              "of the single process")
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
