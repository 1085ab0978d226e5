"""Training throughput with ``ingest: ray_data`` against ``ingest: torch``, same data and workers.

Both runs use the workload's own ``run_training``: one TorchTrainer worker with
1 CPU, ResNet-18, the same Parquet dataset (JPEG photos-like noise images, so
decoding costs what it costs on photos), batch size, augmentation and seed.

- ``torch`` (baseline): the worker decodes and augments in its own process
  (DataLoader, ``loader_workers=0``), as the Food-101 specs run on one core each.
- ``torch_1_loader``: the same with one DataLoader worker process, i.e. the
  same two CPUs that ``ray_data`` gets, for reference.
- ``ray_data``: decoding and augmentation run in Ray Data tasks on the second CPU
  (``data_cpus=1``) and stream to the worker through ``get_dataset_shard``.

Figures are the last epoch's images/s, and its per-worker seconds blocked on data
and computing, as written to metrics.csv. Rounds are interleaved; medians reported.
Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/ingest_throughput.py
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

MODES = {
    "torch": {"ingest": "torch", "loader_workers": 0},
    "torch_1_loader": {"ingest": "torch", "loader_workers": 1},
    "ray_data": {"ingest": "ray_data", "data_cpus": 1},
}


def run_mode(data: Path, storage: Path, name: str, settings: dict, args) -> dict[str, float]:
    """Train once; return the last epoch's metrics."""
    from workloads.vision.config import VisionParams
    from workloads.vision.dataset_format import load_dataset_info
    from workloads.vision.train import run_training

    params = VisionParams.model_validate({
        "run_name": name, "storage_path": str(storage),
        "train": {"epochs": args.epochs, "batch_size": args.batch, "num_workers": 1, "cpus_per_worker": 1,
                  "optimizer": "sgd", "lr": 0.05, "num_to_keep": 1, "max_failures": 0, **settings},
    })
    outcome = run_training(params, load_dataset_info(data))
    shutil.rmtree(outcome.run_dir, ignore_errors=True)
    return outcome.final_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--images", type=int, default=1536, help="training images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the last one is measured")
    args = parser.parse_args()

    import ray

    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-ingest-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", args.images, 128, args.size)
        print(f"dataset: {args.images} train images of {args.size}px JPEG; batch {args.batch}, {args.epochs} epochs "
              f"per run (last measured), 1 training worker x 1 CPU, {args.rounds} rounds", flush=True)
        start_private_ray(2)
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for round_index in range(args.rounds):
            order = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
            for mode in order:
                results[mode].append(run_mode(data, scratch / "runs", f"r{round_index}-{mode}",
                                              MODES[mode], args))
            print(f"  round {round_index + 1}: " + ", ".join(
                f"{mode} {results[mode][-1]['images_per_s']:.1f} images/s" for mode in MODES), flush=True)
        ray.shutdown()

        def median(mode: str, key: str) -> float:
            return statistics.median(r[key] for r in results[mode])

        print(f"{'mode':<18} {'images/s':>9} {'data wait s':>12} {'compute s':>10} {'epoch s':>8}")
        for mode in MODES:
            print(f"{mode:<18} {median(mode, 'images_per_s'):>9.1f} {median(mode, 'data_wait_s'):>12.2f} "
                  f"{median(mode, 'compute_s'):>10.2f} {median(mode, 'epoch_s'):>8.2f}")
        baseline = median("torch", "images_per_s")
        ray_data = median("ray_data", "images_per_s")
        print(f"[ingest] ray_data {ray_data:.1f} images/s vs torch {baseline:.1f} images/s -> ratio "
              f"{ray_data / baseline:.2f} (target >= 0.90)")
        print(f"[ingest] ray_data vs torch with 1 loader process {median('torch_1_loader', 'images_per_s'):.1f} "
              f"images/s -> ratio {ray_data / median('torch_1_loader', 'images_per_s'):.2f}")
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
