"""Training with the progress channel and the run record against the same training without them.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and submits
``specs/quickstart.yaml`` through ``rayjobs submit`` (followed, its log read for events as a user's
terminal would have it) with 2 training workers x 1 CPU, 64 px images and enough epochs to time:

- baseline: ``progress: false``, ``record: false`` and resource sampling off
  (``RAYJOBS_RESOURCES_EVERY_S=0``): no callback, no events, no record, no samples;
- progress: the spec as shipped: the ``rayjobs_agent`` callback in Ray Train's controller, the
  workload's stage events, read out of the log by the follower, the run record's keeper around
  the entrypoint, uploading ``run.json``, the log and the events every 30 s and at the end, and the
  agent's resource samples every 10 s.

It reads ``images_per_s`` from each run's ``metrics.csv`` (the first epoch left out: it includes
start-up) and the wall time of ``rayjobs submit``. Each side is warmed up once with a one-epoch run
(it also writes the dataset that every later run reuses), then the two sides alternate their order
from round to round. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/progress_overhead.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Stamp, add_json_option, add_training_options,  # noqa: E402
                               images_and_wall, mean_images_per_s, quickstart_sides, submit_spec,
                               timed_training)
from rayjobs_agent.resources import EVERY_S_ENV_VAR  # noqa: E402


def train(cluster: str, scratch: Path, tag: str, epochs: int, progress: bool,
          overrides: list[str]) -> tuple[float, float, int]:
    """Train the quickstart once; return mean images/s after epoch 1, the wall seconds and the progress lines."""
    switch = "true" if progress else "false"
    sampling = [] if progress else [f"runtime_env.env_vars.{EVERY_S_ENV_VAR}=0"]
    settings = [f"progress={switch}", f"record={switch}", *sampling, *timed_training(tag, scratch, epochs),
                *overrides]
    done, seconds = submit_spec("specs/quickstart.yaml", cluster, settings, tag)
    epoch_lines = sum(line.startswith("rayjobs: epoch ") for line in done.stderr.splitlines())
    if progress != (epoch_lines == epochs):
        raise SystemExit(f"{tag}: expected {'one progress line per epoch' if progress else 'no progress lines'}, "
                         f"saw {epoch_lines}")
    run_dir = scratch / "results" / tag
    if progress != (run_dir / "run.json").is_file():
        raise SystemExit(f"{tag}: expected {'a' if progress else 'no'} run record in {run_dir}")
    if progress:
        samples = [attempt.get("resources", {}).get("samples", 0)
                   for attempt in json.loads((run_dir / "run.json").read_text())["attempts"]]
        if not sum(samples):
            raise SystemExit(f"{tag}: expected the agent's resource samples in {run_dir}/run.json")
    return mean_images_per_s(run_dir), seconds, epoch_lines


SIDES = {"progress, record and sampling off": False, "progress, record and sampling (as shipped)": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, rounds=3)
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    results = quickstart_sides(
        "progress", {label: (lambda cluster, scratch, tag, epochs, on=on:
                             train(cluster, scratch, tag, epochs, on, args.overrides)) for label, on in SIDES.items()},
        args.rounds, args.epochs)
    result = Result("progress_overhead", "Training with the progress channel, run record and resource sampling vs "
                    "without", ["round", "all off (baseline)", "all on (as shipped)", "images/s ratio",
                     "wall ratio"], [], stamp)
    images_and_wall(result, tuple(SIDES), results, ("off", "on"), "goal ≥ 0.98×", args)
    result.save(args.json)


if __name__ == "__main__":
    main()
