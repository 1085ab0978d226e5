"""What the food101 spec learns on real photos, against a plain PyTorch loop on the same data.

Runs, one after the other on this machine:

1. ``specs/food101.yaml`` through the vision workload (preprocess + TorchTrainer
   training) on a private local Ray instance, changed only where the data and a
   2-core machine demand it: the data root and classes, ``image_size``, ``epochs``,
   2 workers x 1 CPU.
2. The reference: a plain single-process PyTorch script given as ``--reference``
   (``ROOT EPOCHS`` arguments; it prints ``epoch N ... test_acc A`` lines).

and prints each epoch's validation accuracy and images/s for both, with the ratios.
Images/s counts the training images of an epoch over the epoch's wall time,
evaluation included, for both sides. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/learning_quality.py \\
        --data ../shared/data/food101-64px-dev --reference ../shared/data/food101-64px-dev/reference_plain_torch.py
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import start_private_ray  # noqa: E402

REFERENCE_LINE = re.compile(r"epoch (\d+) .*test_acc ([0-9.]+)")


def spec_overrides(data_root: Path, epochs: int, image_size: int, workers: int, scratch: Path) -> list[str]:
    """The changes to specs/food101.yaml that the data and this machine demand, and nothing else."""
    classes = (data_root / "meta" / "classes.txt").read_text(encoding="utf-8").split()
    return [
        f"workload.data.root={data_root}",
        f"workload.data.classes=[{', '.join(classes)}]",
        f"workload.data.image_size={image_size}",
        f"workload.data.output_dir={scratch / 'data'}",
        f"workload.storage_path={scratch / 'results'}",
        f"workload.train.epochs={epochs}",
        f"workload.train.num_workers={workers}",
        "workload.train.cpus_per_worker=1",
        "workload.infer.cpus_per_actor=1",
        "workload.stages=[preprocess, train]",
    ]


def run_workload(spec: Path, overrides: list[str], cpus: int) -> tuple[list[dict[str, float]], float]:
    """Preprocess and train through the workload; return metrics.csv's rows and the training stage's wall time."""
    import ray

    from jobs.loader import load_spec
    from workloads.vision.preprocess import run_preprocess
    from workloads.vision.train import run_training

    params = load_spec(spec, overrides).workload
    start_private_ray(cpus, log_to_driver=True)
    try:
        info = run_preprocess(params.data)
        started = time.perf_counter()
        outcome = run_training(params, info)
        elapsed = time.perf_counter() - started
    finally:
        ray.shutdown()
    from workloads.training.metrics import read_metrics_csv

    return read_metrics_csv(outcome.metrics_csv), elapsed


def run_reference(script: Path, data_root: Path, epochs: int) -> tuple[list[tuple[float, float]], float]:
    """Run the reference script; return ``(test accuracy, epoch wall seconds)`` per epoch and its total wall time."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(script), str(data_root), str(epochs)], stdout=subprocess.PIPE,
                               text=True, bufsize=1)
    epochs_seen: list[tuple[float, float]] = []
    last = None
    assert process.stdout is not None
    for line in process.stdout:
        print(f"  reference: {line.rstrip()}", flush=True)
        match = REFERENCE_LINE.search(line)
        if match:
            now = time.perf_counter()
            # The first epoch's clock starts after the data is loaded, like the workload's epoch_s.
            epochs_seen.append((float(match.group(2)), now - last if last is not None else float("nan")))
            last = now
    if process.wait() != 0:
        raise SystemExit(f"the reference script exited with status {process.returncode}")
    return epochs_seen, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared/data/food101-64px-dev",
                        help="Food-101 subset in the official layout (images/, meta/classes.txt, train.txt, test.txt)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="plain PyTorch reference script (default: reference_plain_torch.py beside --data)")
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "specs/food101.yaml")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers, 1 CPU each")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="FIELD=VALUE",
                        help="further spec overrides, to try a recipe change (e.g. workload.train.lr=0.001)")
    parser.add_argument("--skip-reference", action="store_true", help="run the workload only (when tuning)")
    args = parser.parse_args()

    data_root = args.data.resolve()
    if not (data_root / "meta" / "classes.txt").is_file():
        raise SystemExit(f"{data_root} is not a Food-101 subset in the official layout (no meta/classes.txt)")
    reference = (args.reference or data_root / "reference_plain_torch.py").resolve()
    if not args.skip_reference and not reference.is_file():
        raise SystemExit(f"no reference script at {reference}; pass --reference or --skip-reference")
    train_images = len((data_root / "meta" / "train.txt").read_text(encoding="utf-8").split())

    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-learning-"))
    try:
        overrides = spec_overrides(data_root, args.epochs, args.image_size, args.workers, scratch) + args.extra
        print("workload overrides: " + " ".join(overrides[4:]), flush=True)
        rows, workload_wall = run_workload(args.spec, overrides, cpus=args.workers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reference_rows: list[tuple[float, float]] = []
    reference_wall = float("nan")
    if not args.skip_reference:
        reference_rows, reference_wall = run_reference(reference, data_root, args.epochs)

    print(f"\n{args.spec.name} at {args.image_size} px, {args.workers} workers x 1 CPU, {train_images} training "
          f"images, vs {reference.name if not args.skip_reference else '(no reference)'}")
    print("| epoch | rayjobs val acc | reference acc | acc ratio | rayjobs images/s | reference images/s | speed ratio |"
          " rayjobs train loss | rayjobs val loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index, row in enumerate(rows):
        ours_speed = train_images / row["epoch_s"]
        ref_acc, ref_s = reference_rows[index] if index < len(reference_rows) else (float("nan"), float("nan"))
        ref_speed = train_images / ref_s if ref_s == ref_s else float("nan")
        print(f"| {int(row['epoch'])} | {row['val_accuracy']:.3f} | {ref_acc:.3f} | {row['val_accuracy'] / ref_acc:.2f} | "
              f"{ours_speed:.1f} | {ref_speed:.1f} | {ours_speed / ref_speed:.2f} | {row['train_loss']:.3f} | "
              f"{row['val_loss']:.3f} |")
    final_ours = rows[-1]["val_accuracy"]
    ours_speeds = [train_images / row["epoch_s"] for row in rows[1:]]
    ours_speed = sum(ours_speeds) / max(1, len(ours_speeds))
    if reference_rows:
        final_ref = reference_rows[-1][0]
        ref_speeds = [train_images / s for _, s in reference_rows[1:]]
        ref_speed = sum(ref_speeds) / max(1, len(ref_speeds))
        print(f"\nfinal accuracy: rayjobs {final_ours:.3f}, reference {final_ref:.3f}: {final_ours / final_ref:.2f}x")
        print(f"images/s (mean of epochs 2..{args.epochs}): rayjobs {ours_speed:.1f}, reference {ref_speed:.1f}: "
              f"{ours_speed / ref_speed:.2f}x")
        print(f"whole run: rayjobs training stage {workload_wall:.0f} s, reference {reference_wall:.0f} s "
              f"(data loading and start-up included)")
    else:
        print(f"\nfinal accuracy: rayjobs {final_ours:.3f}; images/s {ours_speed:.1f}; training stage {workload_wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
