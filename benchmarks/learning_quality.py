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
evaluation included, for both sides.

One run's accuracy on 500 test photos moves by about 0.02 with the seed alone, so
``--seeds 0 1 2`` repeats the pair for each seed (the workload's ``train.seed``;
the reference script fixes ``torch.manual_seed(0)``, and that call is offset by the
seed, the script itself unchanged) and compares the means. Each side first runs
``--warmup-epochs`` once (the workload's run also writes the Parquet dataset that the
later runs reuse), then the two sides alternate their order from seed to seed, so a
change in the machine's load falls on both. Run:

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

from benchmarks.common import Result, Spread, Stamp, add_json_option, start_private_ray  # noqa: E402

REFERENCE_LINE = re.compile(r"epoch (\d+) .*test_acc ([0-9.]+)")


def add_data_option(parser: argparse.ArgumentParser) -> None:
    """``--data``: the Food-101 subset to learn on, by default the 64 px development set beside the project."""
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared/data/food101-64px-dev",
                        help="Food-101 subset in the official layout (images/, meta/classes.txt, train.txt, test.txt)")


def food101_subset(path: Path) -> Path:
    """``path`` resolved; the benchmark ends when it is not a Food-101 subset in the official layout."""
    root = path.resolve()
    if not (root / "meta" / "classes.txt").is_file():
        raise SystemExit(f"{root} is not a Food-101 subset in the official layout (no meta/classes.txt)")
    return root


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
    from workloads.vision.preprocess.stage import run_preprocess
    from workloads.vision.training.stage import run_training

    params = load_spec(spec, overrides).workload
    start_private_ray(cpus, log_to_driver=True)
    try:
        info = run_preprocess(params.data)
        started = time.perf_counter()
        outcome = run_training(params, info)
        elapsed = time.perf_counter() - started
    finally:
        ray.shutdown()
    from workloads.ray_train.metrics import read_metrics_csv

    return read_metrics_csv(outcome.metrics_csv), elapsed


def reference_command(script: Path, data_root: Path, epochs: int, seed: int) -> list[str]:
    """The reference script's command line; for a seed other than 0, its ``torch.manual_seed`` call is offset."""
    command = [sys.executable, str(script), str(data_root), str(epochs)]
    if seed == 0:
        return command
    shim = ("import runpy, sys, torch; seed_with = torch.manual_seed; "
            f"torch.manual_seed = lambda value: seed_with(value + {seed}); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return [sys.executable, "-c", shim] + command[1:]


def run_reference(script: Path, data_root: Path, epochs: int, seed: int) -> tuple[list[tuple[float, float]], float]:
    """Run the reference script; return ``(test accuracy, epoch wall seconds)`` per epoch and its total wall time."""
    started = time.perf_counter()
    process = subprocess.Popen(reference_command(script, data_root, epochs, seed), stdout=subprocess.PIPE,
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


def print_epochs(rows: list[dict[str, float]], reference_rows: list[tuple[float, float]], train_images: int) -> None:
    """One seed's per-epoch table: accuracies, images/s and their ratios."""
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


def mean(values: list[float]) -> float:
    """The mean, or nan for no values."""
    return sum(values) / len(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_option(parser)
    parser.add_argument("--reference", type=Path, default=None,
                        help="plain PyTorch reference script (default: reference_plain_torch.py beside --data)")
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "specs/food101.yaml")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers, 1 CPU each")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                        help="run both sides once per seed and compare the means (default: 0)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="FIELD=VALUE",
                        help="further spec overrides, to try a recipe change (e.g. workload.train.lr=0.001)")
    parser.add_argument("--skip-reference", action="store_true", help="run the workload only (when tuning)")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs of each side's warm-up run (0: none)")
    add_json_option(parser)
    args = parser.parse_args()
    stamp = Stamp.begin()

    data_root = food101_subset(args.data)
    reference = (args.reference or data_root / "reference_plain_torch.py").resolve()
    if not args.skip_reference and not reference.is_file():
        raise SystemExit(f"no reference script at {reference}; pass --reference or --skip-reference")
    train_images = len((data_root / "meta" / "train.txt").read_text(encoding="utf-8").split())

    # Per seed: (workload rows, workload wall s, reference rows, reference wall s).
    results: list[tuple[list[dict[str, float]], float, list[tuple[float, float]], float]] = []
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-learning-"))
    try:
        if args.warmup_epochs:
            # The reverse of the first seed's order: the reference, then the workload.
            if not args.skip_reference:
                print("warm-up: reference", flush=True)
                run_reference(reference, data_root, args.warmup_epochs, args.seeds[0])
            print("warm-up: workload", flush=True)
            run_workload(args.spec, spec_overrides(data_root, args.warmup_epochs, args.image_size, args.workers,
                                                   scratch) + ["workload.run_name=learning-warm-up"] + args.extra,
                         cpus=args.workers)
        for turn, seed in enumerate(args.seeds):
            overrides = spec_overrides(data_root, args.epochs, args.image_size, args.workers, scratch) + [
                f"workload.train.seed={seed}", f"workload.run_name=learning-seed-{seed}"] + args.extra
            print(f"seed {seed}: workload overrides: " + " ".join(overrides[4:]), flush=True)
            reference_rows: list[tuple[float, float]] = []
            reference_wall = float("nan")
            # Odd turns run the reference first, so neither side always meets the machine's later load.
            if not args.skip_reference and turn % 2:
                reference_rows, reference_wall = run_reference(reference, data_root, args.epochs, seed)
            rows, workload_wall = run_workload(args.spec, overrides, cpus=args.workers)
            if not args.skip_reference and not turn % 2:
                reference_rows, reference_wall = run_reference(reference, data_root, args.epochs, seed)
            results.append((rows, workload_wall, reference_rows, reference_wall))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{args.spec.name} at {args.image_size} px, {args.workers} workers x 1 CPU, {train_images} training "
          f"images, vs {reference.name if not args.skip_reference else '(no reference)'}")
    summary = []
    for seed, (rows, workload_wall, reference_rows, reference_wall) in zip(args.seeds, results):
        print(f"\nseed {seed}:")
        print_epochs(rows, reference_rows, train_images)
        # The first epoch is left out of the speeds: it includes start-up on both sides.
        ours_speed = mean([train_images / row["epoch_s"] for row in rows[1:]])
        ref_speed = mean([train_images / s for _, s in reference_rows[1:]])
        ref_acc = reference_rows[-1][0] if reference_rows else float("nan")
        summary.append((seed, rows[-1]["val_accuracy"], ref_acc, ours_speed, ref_speed, workload_wall, reference_wall))

    print("\n| seed | rayjobs accuracy | reference accuracy | rayjobs images/s | reference images/s | "
          "rayjobs training stage s | reference s |")
    print("|---|---|---|---|---|---|---|")
    for seed, ours_acc, ref_acc, ours_speed, ref_speed, workload_wall, reference_wall in summary:
        print(f"| {seed} | {ours_acc:.3f} | {ref_acc:.3f} | {ours_speed:.1f} | {ref_speed:.1f} | {workload_wall:.0f} | "
              f"{reference_wall:.0f} |")
    ours_acc, ref_acc, ours_speed, ref_speed = (mean([row[i] for row in summary]) for i in range(1, 5))
    seeds = f"seed {summary[0][0]}" if len(summary) == 1 else f"mean of {len(summary)} seeds"
    if args.skip_reference:
        print(f"\nfinal accuracy ({seeds}): rayjobs {ours_acc:.3f}; images/s {ours_speed:.1f}")
    else:
        print(f"\nfinal accuracy ({seeds}): rayjobs {ours_acc:.3f}, reference {ref_acc:.3f}: {ours_acc / ref_acc:.2f}x")
        print(f"images/s (epochs 2..{args.epochs}, {seeds}): rayjobs {ours_speed:.1f}, reference {ref_speed:.1f}: "
              f"{ours_speed / ref_speed:.2f}x")
    result = Result("learning_quality", "Learning on real photos: the food101 spec vs a plain PyTorch loop",
                    ["seed", "rayjobs accuracy", "reference accuracy", "ratio", "rayjobs images/s",
                     "reference images/s", "ratio"], [], stamp)
    for seed, ours_acc_s, ref_acc_s, ours_speed_s, ref_speed_s, _, _ in summary:
        result.rows.append([str(seed), f"{ours_acc_s:.3f}", f"{ref_acc_s:.3f}", f"{ours_acc_s / ref_acc_s:.2f}×",
                            f"{ours_speed_s:.1f}", f"{ref_speed_s:.1f}", f"{ours_speed_s / ref_speed_s:.2f}×"])
    for index, key, unit in ((1, "rayjobs_accuracy", "accuracy"), (2, "reference_accuracy", "accuracy"),
                             (3, "rayjobs_images_per_s", "images/s"), (4, "reference_images_per_s", "images/s")):
        result.figure(key, Spread.of([row[index] for row in summary]), unit)
    accuracy = result.figure("accuracy_ratio", Spread.ratio([r[1] for r in summary], [r[2] for r in summary]), "x")
    speed = result.figure("speed_ratio", Spread.ratio([r[3] for r in summary], [r[4] for r in summary]), "x")
    if len(summary) > 1:
        result.rows.append(["**mean**", f"**{ours_acc:.3f}**", f"**{ref_acc:.3f}**",
                            f"**{ours_acc / ref_acc:.2f}×** (goal ≥ 1.0×)", f"**{ours_speed:.1f}**",
                            f"**{ref_speed:.1f}**", f"**{ours_speed / ref_speed:.2f}×** (goal ≥ 0.85×)"])
    result.notes.append(f"{args.spec.name} at {args.image_size} px, {args.epochs} epochs, {args.workers} workers × "
                        f"1 CPU; images/s of epochs 2–{args.epochs}; per-seed ratios {accuracy.low:.2f}–"
                        f"{accuracy.high:.2f}× (accuracy) and {speed.low:.2f}–{speed.high:.2f}× (speed); a "
                        f"{args.warmup_epochs}-epoch warm-up of each side first.")
    result.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
