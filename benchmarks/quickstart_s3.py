"""The quickstart with its dataset and its run in S3 against the same quickstart on local disk.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and moto's S3 server
on 127.0.0.1, then submits ``specs/quickstart.yaml`` through ``rayjobs submit`` in turn:

- baseline: ``data.output_dir`` and ``storage_path`` in a fresh local folder;
- S3: both under ``s3://BUCKET/<round>/``, the AWS variables passed in ``runtime_env.env_vars``.

Each run writes a fresh dataset (preprocess), trains and runs batch inference: all three stages
read and write through the storage under test. The figure is the wall time of ``rayjobs submit``,
from the command to its exit, which is what a user waits for. The two sides alternate for
``--rounds`` rounds so that a slow phase of the machine does not land on one side only. The S3
server runs in this process, on the same two cores as the cluster: a real bucket is elsewhere,
so the ratio errs on the side of S3 looking slower. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/quickstart_s3.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

BUCKET = "rayjobs-bench"


def submit_quickstart(cluster: str, tag: str, data: str, results: str, env_vars: dict[str, str]) -> float:
    """``rayjobs submit specs/quickstart.yaml`` with its data and results at the given places; return seconds."""
    command = [
        sys.executable, "-m", "runner.cli", "submit", "specs/quickstart.yaml", "--cluster", cluster,
        "--set", f"workload.run_name={tag}",
        "--set", f"workload.storage_path={results}",
        "--set", f"workload.data.output_dir={data}",
    ]
    for name, value in env_vars.items():
        command += ["--set", f"runtime_env.env_vars.{name}={value}"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                          stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tag}: rayjobs submit exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each side, alternating.")
    args = parser.parse_args()

    from runner import local
    from tests.s3_server import aws_variables, create_bucket, moto_s3_server

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-s3-") as scratch_dir, moto_s3_server() as endpoint:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        create_bucket(endpoint, BUCKET)
        cluster = local.start(name="bench-s3", num_cpus=2)
        results: dict[str, list[float]] = {"local disk": [], "S3": []}
        try:
            for round_number in range(args.rounds):
                tag = f"r{round_number}"
                seconds = submit_quickstart(cluster.name, tag, str(scratch / tag / "data"),
                                            str(scratch / tag / "results"), {})
                results["local disk"].append(seconds)
                print(f"local disk round {round_number + 1}: {seconds:6.1f} s", flush=True)
                seconds = submit_quickstart(cluster.name, tag, f"s3://{BUCKET}/{tag}/data", f"s3://{BUCKET}/{tag}/runs",
                                            aws_variables(endpoint))
                results["S3"].append(seconds)
                print(f"S3         round {round_number + 1}: {seconds:6.1f} s", flush=True)
        finally:
            local.stop(cluster.name)
    baseline, remote = statistics.mean(results["local disk"]), statistics.mean(results["S3"])
    print(f"\nquickstart on local disk (baseline): {baseline:.1f} s")
    print(f"quickstart on S3 (moto, loopback):   {remote:.1f} s")
    print(f"ratio (S3 / local disk): {remote / baseline:.2f}x")


if __name__ == "__main__":
    main()
