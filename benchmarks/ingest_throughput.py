"""Training throughput with ``ingest: ray_data`` against ``ingest: torch``, same data and workers.

Both runs use the workload's own ``run_training`` with its default recipe: one
TorchTrainer worker with 1 CPU, ResNet-18, the same Parquet dataset (JPEG photo-like
noise images, so decoding costs what it costs on photos), batch size, augmentation and seed.

- ``torch`` (baseline): the worker decodes and augments in its own process
  (DataLoader in the training process), as the Food-101 specs run on one core each.
- ``ray_data``: decoding and augmentation run in Ray Data tasks on the second CPU
  (``data_cpus=1``) and stream to the worker through ``get_dataset_shard``.

A DataLoader worker process is no third variant: on the CPU a training worker gets at
most ``cpus_per_worker - 1`` loader processes, none for a 1-CPU worker.

Figures are the last epoch's images/s, and its per-worker seconds blocked on data
and computing, as written to metrics.csv. Each mode is warmed up once, then the rounds
alternate their order; medians are reported with the lowest and highest round. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/ingest_throughput.py
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

MODES = {
    "torch": {"ingest": "torch"},
    "ray_data": {"ingest": "ray_data", "data_cpus": 1},
}
LABELS = {
    "torch": "`ingest: torch`, decode + augment in the worker (**baseline**)",
    "ray_data": "`ingest: ray_data`, decode + augment in Ray Data tasks (`data_cpus: 1`)",
}
COLUMNS = [("images_per_s", "images/s", 1), ("data_wait_s", "data wait s", 2), ("compute_s", "compute s", 2),
           ("epoch_s", "epoch s", 2)]


def run_mode(data: Path, storage: Path, name: str, settings: dict, args) -> dict[str, float]:
    """Train once; return the last epoch's metrics."""
    from workloads.vision.config import VisionParams
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.training.stage import run_training

    params = VisionParams.model_validate({
        "run_name": name, "storage_path": str(storage),
        "train": {"epochs": args.epochs, "batch_size": args.batch, "num_workers": 1, "cpus_per_worker": 1,
                  "num_to_keep": 1, "max_failures": 0, **settings},
    })
    outcome = run_training(params, load_dataset_info(data))
    shutil.rmtree(outcome.run_dir, ignore_errors=True)
    return outcome.final_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=1536, help="training images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the last one is measured")
    add_json_option(parser)
    args = parser.parse_args()

    import ray

    stamp = Stamp.begin()
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-ingest-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", args.images, 128, args.size)
        print(f"dataset: {args.images} train images of {args.size}px JPEG; batch {args.batch}, {args.epochs} epochs "
              f"per run (last measured), 1 training worker x 1 CPU, {args.rounds} rounds", flush=True)
        start_private_ray(2)
        runs = iter(range(1_000))

        def side(mode: str):
            return lambda: run_mode(data, scratch / "runs", f"run{next(runs)}-{mode}", MODES[mode], args)

        results = alternate({mode: side(mode) for mode in MODES}, args.rounds, show=lambda i, r: print(
            f"  round {i + 1}: " + ", ".join(f"{m} {r[m]['images_per_s']:.1f} images/s" for m in MODES), flush=True))
        ray.shutdown()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = Result("ingest_throughput", "Ingestion: Ray Data vs PyTorch DataLoader",
                    ["mode"] + [title for _, title, _ in COLUMNS], [], stamp)
    print(f"{'mode':<10} " + " ".join(f"{title:>22}" for _, title, _ in COLUMNS))
    for mode in MODES:
        spreads = [result.figure(f"{mode}_{key}", Spread.of([r[key] for r in results[mode]]), key)
                   for key, _, _ in COLUMNS]
        print(f"{mode:<10} " + " ".join(f"{s.text(digits):>22}" for s, (_, _, digits) in zip(spreads, COLUMNS)))
        result.rows.append([LABELS[mode]] + [s.text(digits) for s, (_, _, digits) in zip(spreads, COLUMNS)])
    ratio = result.figure("ratio", Spread.ratio([r["images_per_s"] for r in results["ray_data"]],
                                                [r["images_per_s"] for r in results["torch"]]), "x")
    print(f"[ingest] ray_data / torch images/s -> ratio {ratio.median:.2f} (rounds {ratio.low:.2f}-{ratio.high:.2f}; "
          "target >= 0.90)")
    result.rows.append(["**ratio** ray_data / torch (target ≥ 0.9×)", ratio.times(), "", "", ""])
    result.notes.append(f"{args.images} training images of {args.size} px, batch {args.batch}, {args.epochs} epochs "
                        f"per run (the last one measured), {plural(args.rounds, 'round')} after a warm-up of "
                        "each mode.")
    print(f"total {time.perf_counter() - started:.0f}s")
    result.save(args.json)


if __name__ == "__main__":
    main()
