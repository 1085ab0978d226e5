"""A one-trial sweep against the same training run without ``sweep:``: what Ray Tune around the trainer costs.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and submits
``specs/quickstart.yaml`` through ``rayjobs submit`` (followed), 2 training workers x 1 CPU, 64 px:

- baseline: the spec as shipped, no ``sweep:``;
- sweep: the same spec with a one-trial sweep whose only value is the spec's own learning rate, so
  the trial trains exactly what the baseline trains, inside a Tune trial (its own run folder).

It reads ``images_per_s`` from each run's ``metrics.csv`` (the first epoch left out: it includes
start-up) and the wall time of ``rayjobs submit``. Each side is warmed up once with a one-epoch run
(it also writes the dataset every later run reuses), then the sides alternate their order from round
to round. The goals: wall time at most 1.15x, images/s at least 0.95x. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/sweep_overhead.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Spread, Stamp, add_json_option, add_training_options,  # noqa: E402
                               alternate, plural, submit_spec, timed_training)

SIDES = {"no sweep (baseline)": False, "one-trial sweep": True}


def write_specs(scratch: Path) -> dict[bool, Path]:
    """The quickstart spec without and with a one-trial sweep of its own learning rate, in ``scratch``."""
    document = yaml.safe_load((REPO_ROOT / "specs" / "quickstart.yaml").read_text())
    document["runtime_env"]["working_dir"] = str(REPO_ROOT)
    from workloads.vision.config import TrainConfig

    lr = document["workload"]["train"].get("lr", TrainConfig().lr)
    specs = {}
    for swept in (False, True):
        if swept:
            document["sweep"] = {"metric": "val_accuracy", "mode": "max",
                                 "parameters": {"workload.train.lr": {"choice": [lr]}}}
        path = scratch / f"quickstart-{'sweep' if swept else 'plain'}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        specs[swept] = path
    return specs


def train(spec: Path, cluster: str, scratch: Path, tag: str, epochs: int, swept: bool,
          overrides: list[str]) -> tuple[float, float]:
    """Train once; return the mean images/s after epoch 1 and the wall seconds of ``rayjobs submit``."""
    from workloads.training.metrics import read_metrics_csv

    done, seconds = submit_spec(str(spec), cluster, [*timed_training(tag, scratch, epochs), *overrides], tag)
    run_dir = scratch / "results" / tag
    if swept:
        if "Best trial: trial-0000" not in done.stdout:
            raise SystemExit(f"{tag}: the sweep named no best trial\n{done.stdout[-2000:]}")
        run_dir = run_dir / "trials" / "trial-0000"
    rows = read_metrics_csv(run_dir / "metrics.csv")
    timed = [row["images_per_s"] for row in rows[1:]] or [rows[-1]["images_per_s"]]
    return sum(timed) / len(timed), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, rounds=3)
    add_json_option(parser)
    args = parser.parse_args()

    from runner import local

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    stamp = Stamp.begin()
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-sweep-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        specs = write_specs(scratch)
        cluster = local.start(name="bench-sweep", num_cpus=2)
        runs = iter(range(1_000))

        def side(label: str, epochs: int):
            def run() -> tuple[float, float]:
                tag = f"run{next(runs)}"
                swept = SIDES[label]
                rate, seconds = train(specs[swept], cluster.name, scratch, tag, epochs, swept, args.overrides)
                print(f"{label:20s} {rate:7.1f} images/s  {seconds:6.1f} s", flush=True)
                return rate, seconds

            return run

        try:
            results = alternate({label: side(label, args.epochs) for label in SIDES}, args.rounds,
                                warmup={label: side(label, 1) for label in SIDES})
        finally:
            local.stop(cluster.name)
    plain, swept = ([rate for rate, _ in results[label]] for label in SIDES)
    plain_s, swept_s = ([seconds for _, seconds in results[label]] for label in SIDES)
    result = Result("sweep_overhead", "A one-trial sweep vs the same run without sweep:",
                    ["round", "no sweep (baseline)", "one-trial sweep", "images/s ratio", "wall ratio"], [], stamp)
    for index in range(len(plain)):
        result.rows.append([str(index + 1), f"{plain[index]:.1f} images/s, {plain_s[index]:.1f} s",
                            f"{swept[index]:.1f} images/s, {swept_s[index]:.1f} s",
                            f"{swept[index] / plain[index]:.3f}×", f"{swept_s[index] / plain_s[index]:.3f}×"])
    baseline = result.figure("plain_images_per_s", Spread.of(plain), "images/s")
    sweep = result.figure("sweep_images_per_s", Spread.of(swept), "images/s")
    ratio = result.figure("ratio", Spread.ratio(swept, plain), "x")
    wall = result.figure("wall_ratio", Spread.ratio(swept_s, plain_s), "x")
    result.rows.append(["median", baseline.text(1), sweep.text(1), ratio.times(3) + " (goal ≥ 0.95×)",
                        wall.times(3) + " (goal ≤ 1.15×)"])
    settings = f" (with {', '.join(args.overrides)})" if args.overrides else ""
    result.notes.append(f"The quickstart{settings} at 64 px, preprocess and train, {args.epochs} epochs per run, the "
                        f"mean images/s of epochs 2–{args.epochs}; {plural(args.rounds, 'round')} after a one-epoch "
                        "warm-up of each side, on one 2-CPU local cluster.")
    print(f"\nno sweep (baseline): {baseline.text()} images/s")
    print(f"one-trial sweep:     {sweep.text()} images/s")
    print(f"ratio (sweep / none): {ratio.text(3)}x; wall time {wall.text(3)}x")
    result.save(args.json)


if __name__ == "__main__":
    main()
