"""Training across three local nodes against the same two workers on one node.

Starts, one after the other, two private local clusters with ``runner.local``:

- baseline: one node with 2 CPUs;
- multi-node: three nodes with 1 CPU each (a head and two worker nodes, each its own raylet
  and object store, all on 127.0.0.1);

and on each submits ``specs/quickstart.yaml`` through ``rayjobs submit`` with 2 training
workers x 1 CPU, larger images and more epochs than the quickstart so that the epochs are
long enough to time. It reads ``images_per_s`` from each run's ``metrics.csv`` (the first
epoch left out: it includes start-up), and prints both and their ratio, plus the Ray node
each training rank ran on. The two clusters alternate for ``--rounds`` rounds so that a
slow phase of the machine does not land on one side only. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/multinode_training.py
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

WORKERS_LINE = re.compile(r"^Training workers: .*$", re.MULTILINE)


def run_on(nodes: int, cpus_per_node: int, epochs: int, scratch: Path, tag: str) -> tuple[float, str]:
    """Start a cluster, train the quickstart on it, stop it; return mean images/s after epoch 1 and the workers line."""
    from runner import local
    from workloads.training.metrics import read_metrics_csv

    name = f"bench-{tag}"
    cluster = local.start(name=name, num_cpus=cpus_per_node, nodes=nodes)
    try:
        command = [
            sys.executable, "-m", "runner.cli", "submit", "specs/quickstart.yaml", "--cluster", cluster.name,
            "--set", "workload.stages=[preprocess, train]",
            "--set", f"workload.run_name={tag}",
            "--set", f"workload.storage_path={scratch / 'results'}",
            "--set", f"workload.data.output_dir={scratch / 'data'}",
            "--set", "workload.data.image_size=64",
            "--set", f"workload.train.epochs={epochs}",
            "--set", "workload.train.num_workers=2",
            "--set", "workload.train.cpus_per_worker=1",
        ]
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise SystemExit(f"{tag}: rayjobs submit exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    finally:
        local.stop(name)
    rows = read_metrics_csv(scratch / "results" / tag / "metrics.csv")
    timed = [row["images_per_s"] for row in rows[1:]] or [rows[-1]["images_per_s"]]
    workers = WORKERS_LINE.search(done.stdout)
    return statistics.mean(timed), workers.group(0) if workers else "(no workers line)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="Epochs per run (the first is not timed).")
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each side, alternating.")
    args = parser.parse_args()

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-multinode-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        results: dict[str, list[float]] = {"one node x 2 CPUs": [], "three nodes x 1 CPU": []}
        for round_number in range(args.rounds):
            for label, nodes, cpus in (("one node x 2 CPUs", 1, 2), ("three nodes x 1 CPU", 3, 1)):
                tag = f"n{nodes}-r{round_number}"
                images_per_s, workers = run_on(nodes, cpus, args.epochs, scratch, tag)
                results[label].append(images_per_s)
                print(f"{label:22s} round {round_number + 1}: {images_per_s:7.1f} images/s   {workers}", flush=True)
    baseline = statistics.mean(results["one node x 2 CPUs"])
    spread = statistics.mean(results["three nodes x 1 CPU"])
    print(f"\none node x 2 CPUs (baseline): {baseline:.1f} images/s")
    print(f"three nodes x 1 CPU:          {spread:.1f} images/s")
    print(f"ratio (three nodes / one node): {spread / baseline:.2f}x")


if __name__ == "__main__":
    main()
