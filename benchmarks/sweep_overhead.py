"""A one-trial sweep against the same training run without ``sweep:``: what Ray Tune around the trainer costs.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and submits
``specs/quickstart.yaml`` through ``rayjobs submit`` (followed), 2 training workers x 1 CPU, 64 px:

- baseline: the spec as shipped, no ``sweep:``, trained on the sweep's own split of the data;
- sweep: the same spec with a one-trial sweep whose only value is the spec's own learning rate, inside
  a Tune trial (its own run folder).

A sweep's trials train on the training split less the share it holds out to compare them on
(``sweep.holdout``), so the baseline trains on exactly those rows and is measured on the same held-out
ones: the dataset the sweep's warm-up carved (``<run>/selection``), with the train stage alone. The
sweep side still preprocesses (a reuse check) and carves its split every run: what a user pays.

It reads ``images_per_s`` from each run's ``metrics.csv`` (the first epoch left out: it includes
start-up) and the wall time of ``rayjobs submit``. Each side is warmed up once with a one-epoch run
(it also writes the dataset every later run reuses), then the sides alternate their order from round
to round. The goals: wall time at most 1.15x, images/s at least 0.95x. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/sweep_overhead.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Stamp, add_json_option, add_training_options,  # noqa: E402
                               images_and_wall, mean_images_per_s, quickstart_sides, submit_spec,
                               timed_training)

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
            # No refit: Tune around one trainer is what is measured, not a second training run.
            document["sweep"] = {"metric": "val_accuracy", "mode": "max", "refit": False,
                                 "parameters": {"workload.train.lr": {"choice": [lr]}}}
        path = scratch / f"quickstart-{'sweep' if swept else 'plain'}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        specs[swept] = path
    return specs


def train(spec: Path, cluster: str, scratch: Path, tag: str, epochs: int, swept: bool,
          overrides: list[str]) -> tuple[float, float]:
    """Train once; return the mean images/s after epoch 1 and the wall seconds of ``rayjobs submit``."""
    settings = [*timed_training(tag, scratch, epochs), *overrides]
    if not swept:
        settings += [f"workload.data.output_dir={carved_dataset(scratch)}", "workload.stages=[train]"]
    done, seconds = submit_spec(str(spec), cluster, settings, tag)
    run_dir = scratch / "results" / tag
    if swept:
        if "Best trial: trial-0000" not in done.stdout:
            raise SystemExit(f"{tag}: the sweep named no best trial\n{done.stdout[-2000:]}")
        run_dir = run_dir / "trials" / "trial-0000"
    return mean_images_per_s(run_dir), seconds


def carved_dataset(scratch: Path) -> Path:
    """The training split as the sweep divided it, written by the sweep's warm-up (which runs first)."""
    carved = sorted((scratch / "results").glob("*/selection/_manifest.json"))
    if not carved:
        raise SystemExit("no sweep has carved its selection split yet: the sweep's warm-up must run first")
    return carved[0].parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, rounds=3)
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    specs: dict[bool, Path] = {}
    results = quickstart_sides(
        "sweep", {label: (lambda cluster, scratch, tag, epochs, swept=swept:
                          train(specs[swept], cluster, scratch, tag, epochs, swept, args.overrides))
                  for label, swept in SIDES.items()},
        args.rounds, args.epochs, prepare=lambda scratch: specs.update(write_specs(scratch)))
    result = Result("sweep_overhead", "A one-trial sweep vs the same run without sweep:",
                    ["round", "no sweep (baseline)", "one-trial sweep", "images/s ratio", "wall ratio"], [], stamp)
    images_and_wall(result, tuple(SIDES), results, ("plain", "sweep"), "goal ≥ 0.95×", args, "goal ≤ 1.15×")
    result.save(args.json)


if __name__ == "__main__":
    main()
