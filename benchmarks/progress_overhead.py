"""Training with the progress channel and the run record against the same training without them.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and submits
``specs/quickstart.yaml`` through ``rayjobs submit`` (followed, its log read for events as a user's
terminal would have it) with 2 training workers x 1 CPU, 64 px images and enough epochs to time:

- baseline: ``progress: false`` and ``record: false``: the job is sent exactly as the spec says, no
  callback, no events, no record;
- progress: the spec as shipped: the ``rayjobs_observe`` callback in Ray Train's controller, the
  workload's stage events, read out of the log by the follower, and the run record's keeper around
  the entrypoint, uploading ``run.json``, the log and the events every 30 s and at the end.

It reads ``images_per_s`` from each run's ``metrics.csv`` (the first epoch left out: it includes
start-up) and the wall time of ``rayjobs submit``. Each side is warmed up once with a one-epoch run
(it also writes the dataset that every later run reuses), then the two sides alternate their order
from round to round. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/progress_overhead.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Spread, Stamp, add_json_option, add_training_options,  # noqa: E402
                               alternate, plural, submit_spec, timed_training)


def train(cluster: str, scratch: Path, tag: str, epochs: int, progress: bool,
          overrides: list[str]) -> tuple[float, float, int]:
    """Train the quickstart once; return mean images/s after epoch 1, the wall seconds and the progress lines."""
    from workloads.training.metrics import read_metrics_csv

    switch = "true" if progress else "false"
    settings = [f"progress={switch}", f"record={switch}", *timed_training(tag, scratch, epochs), *overrides]
    done, seconds = submit_spec("specs/quickstart.yaml", cluster, settings, tag)
    epoch_lines = sum(line.startswith("rayjobs: epoch ") for line in done.stderr.splitlines())
    if progress != (epoch_lines == epochs):
        raise SystemExit(f"{tag}: expected {'one progress line per epoch' if progress else 'no progress lines'}, "
                         f"saw {epoch_lines}")
    run_dir = scratch / "results" / tag
    if progress != (run_dir / "run.json").is_file():
        raise SystemExit(f"{tag}: expected {'a' if progress else 'no'} run record in {run_dir}")
    rows = read_metrics_csv(run_dir / "metrics.csv")
    timed = [row["images_per_s"] for row in rows[1:]] or [rows[-1]["images_per_s"]]
    return sum(timed) / len(timed), seconds, epoch_lines


SIDES = {"progress and record off": False, "progress and record (as shipped)": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, rounds=3)
    add_json_option(parser)
    args = parser.parse_args()

    from runner import local

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    stamp = Stamp.begin()
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-progress-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        cluster = local.start(name="bench-progress", num_cpus=2)
        runs = iter(range(1_000))

        def side(label: str, epochs: int):
            def run() -> tuple[float, float, int]:
                tag = f"run{next(runs)}"
                rate, seconds, lines = train(cluster.name, scratch, tag, epochs, SIDES[label], args.overrides)
                print(f"{label:22s} {rate:7.1f} images/s  {seconds:6.1f} s  {lines} progress lines", flush=True)
                return rate, seconds, lines

            return run

        try:
            results = alternate({label: side(label, args.epochs) for label in SIDES}, args.rounds,
                                warmup={label: side(label, 1) for label in SIDES})
        finally:
            local.stop(cluster.name)
    off, on = ([rate for rate, _, _ in results[label]] for label in SIDES)
    off_s, on_s = ([seconds for _, seconds, _ in results[label]] for label in SIDES)
    result = Result("progress_overhead", "Training with the progress channel and run record vs without",
                    ["round", "both off (baseline)", "both on (as shipped)", "images/s ratio",
                     "wall ratio"], [], stamp)
    for index in range(len(off)):
        result.rows.append([str(index + 1), f"{off[index]:.1f} images/s, {off_s[index]:.1f} s",
                            f"{on[index]:.1f} images/s, {on_s[index]:.1f} s", f"{on[index] / off[index]:.3f}×",
                            f"{on_s[index] / off_s[index]:.3f}×"])
    baseline = result.figure("off_images_per_s", Spread.of(off), "images/s")
    shipped = result.figure("on_images_per_s", Spread.of(on), "images/s")
    ratio = result.figure("ratio", Spread.ratio(on, off), "x")
    wall = result.figure("wall_ratio", Spread.ratio(on_s, off_s), "x")
    result.rows.append(["median", baseline.text(1), shipped.text(1), ratio.times(3) + " (goal ≥ 0.98×)",
                        wall.times(3)])
    settings = f" (with {', '.join(args.overrides)})" if args.overrides else ""
    result.notes.append(f"The quickstart{settings} at 64 px, preprocess and train, {args.epochs} epochs per run, the "
                        f"mean images/s of epochs 2–{args.epochs}; {plural(args.rounds, 'round')} after a one-epoch "
                        "warm-up of each side, on one 2-CPU local cluster.")
    print(f"\nprogress and record off (baseline): {baseline.text()} images/s")
    print(f"progress and record (as shipped):   {shipped.text()} images/s")
    print(f"ratio (with / without): {ratio.text(3)}x; wall time {wall.text(3)}x")
    result.save(args.json)


if __name__ == "__main__":
    main()
