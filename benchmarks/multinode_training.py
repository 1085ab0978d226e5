"""Training across three local nodes against the same two workers on one node.

Starts, one after the other, two private local clusters with ``runner.local``:

- baseline: one node with 2 CPUs;
- multi-node: three nodes with 1 CPU each (a head and two worker nodes, each its own raylet
  and object store, all on 127.0.0.1);

and on each submits ``specs/quickstart.yaml`` through ``rayjobs submit`` in its default
layout (``auto``: one training worker per node with that node's CPUs, so 1 worker x 2 CPUs on
one node and 3 workers x 1 CPU on three), with larger images and more epochs than the
quickstart so that the epochs are long enough to time. It reads ``images_per_s`` from each run's ``metrics.csv`` (the first
epoch left out: it includes start-up), and prints both and their ratio, plus the Ray node
each training rank ran on. Each side is warmed up once with a one-epoch run (it also writes
the dataset that every later run reuses), then the two sides alternate their order from
round to round, so that a slow phase of the machine does not land on one side only. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/multinode_training.py
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import (Result, Spread, Stamp, add_json_option, add_training_options,  # noqa: E402
                               alternate, plural, submit_spec, timed_training)

WORKERS_LINE = re.compile(r"^Training workers: .*$", re.MULTILINE)
WHERE = re.compile(r"\(([^()]*nodes?)\)$")  # "... (2 nodes)" at the end of the workers line


def run_on(nodes: int, cpus_per_node: int, epochs: int, scratch: Path, tag: str,
           overrides: list[str]) -> tuple[float, str]:
    """Start a cluster, train the quickstart on it, stop it; return mean images/s after epoch 1 and the workers line."""
    from runner import local
    from workloads.ray_train.metrics import read_metrics_csv

    name = f"bench-{tag}"
    cluster = local.start(name=name, num_cpus=cpus_per_node, nodes=nodes)
    try:
        done, _ = submit_spec("specs/quickstart.yaml", cluster.name,
                              timed_training(tag, scratch, epochs) + DEFAULT_LAYOUT + overrides, tag)
    finally:
        local.stop(name)
    rows = read_metrics_csv(scratch / "results" / tag / "metrics.csv")
    timed = [row["images_per_s"] for row in rows[1:]] or [rows[-1]["images_per_s"]]
    workers = WORKERS_LINE.search(done.stdout)
    return sum(timed) / len(timed), workers.group(0) if workers else "(no workers line)"


# The specs' own layout, in place of timed_training's explicit 2 workers x 1 CPU.
DEFAULT_LAYOUT = ["workload.train.num_workers=auto", "workload.train.cpus_per_worker=auto"]
SIDES = {"one node x 2 CPUs": (1, 2), "three nodes x 1 CPU": (3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_options(parser, rounds=2)
    add_json_option(parser)
    args = parser.parse_args()

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    stamp = Stamp.begin()
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-multinode-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        runs = iter(range(1_000))

        def side(label: str, epochs: int):
            nodes, cpus = SIDES[label]

            def run() -> tuple[float, str]:
                tag = f"n{nodes}-run{next(runs)}"
                images_per_s, workers = run_on(nodes, cpus, epochs, scratch, tag, args.overrides)
                print(f"{label:22s} {images_per_s:7.1f} images/s   {workers}", flush=True)
                return images_per_s, workers

            return run

        results = alternate({label: side(label, args.epochs) for label in SIDES}, args.rounds,
                            warmup={label: side(label, 1) for label in SIDES})
    one, three = ([rate for rate, _ in results[label]] for label in SIDES)
    result = Result("multinode_training", "Training across local nodes: three 1-CPU nodes vs one 2-CPU node",
                    ["round", "one node × 2 CPUs (baseline)", "three nodes × 1 CPU", "ratio",
                     "where the ranks ran (three nodes)"], [], stamp)
    for index, (base, spread) in enumerate(zip(one, three)):
        where = WHERE.search(results["three nodes x 1 CPU"][index][1])
        result.rows.append([str(index + 1), f"{base:.1f} images/s", f"{spread:.1f} images/s", f"{spread / base:.2f}×",
                            where.group(1) if where else "?"])
    baseline = result.figure("one_node_images_per_s", Spread.of(one), "images/s")
    nodes = result.figure("three_nodes_images_per_s", Spread.of(three), "images/s")
    ratio = result.figure("ratio", Spread.ratio(three, one), "x")
    result.rows.append(["median", baseline.text(1), nodes.text(1), ratio.times() + " (goal ≥ 0.9×)", ""])
    settings = f" (with {', '.join(args.overrides)})" if args.overrides else ""
    result.notes.append(f"The quickstart{settings} at 64 px, {args.epochs} epochs per run, the mean images/s of "
                        f"epochs 2–{args.epochs}; {plural(args.rounds, 'round')} after a one-epoch warm-up of "
                        "each side. Both sides in the default layout (auto): one worker per node with its node's "
                        "CPUs. The three 1-CPU nodes declare 3 CPUs on this machine's 2 cores, as the quickstart on "
                        "`rayjobs cluster up --nodes 3 --num-cpus 1` does.")
    print(f"\none node x 2 CPUs (baseline): {baseline.text()} images/s")
    print(f"three nodes x 1 CPU:          {nodes.text()} images/s")
    print(f"ratio (three nodes / one node): {ratio.text(2)}x")
    result.save(args.json)


if __name__ == "__main__":
    main()
