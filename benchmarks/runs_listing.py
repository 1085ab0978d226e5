"""How long ``rayjobs runs LOCATION`` takes over many run records, locally and in S3, against a plain reader.

    python benchmarks/runs_listing.py [--local 1000] [--s3 200] [--rounds 5] [--json PATH]

Writes ``--local`` records into a temporary folder and ``--s3`` records into a bucket of a moto S3
server on 127.0.0.1 (each a ``run.json`` as a training job writes it, ~4 KB, beside a log part and an
events file), then times the whole ``rayjobs runs`` command (a new process: start-up, listing, reading
every ``run.json``, the table) against a plain reader run the same way: a Python process that lists
the folder and reads and parses every ``run.json`` one after the other (``json`` for local files,
boto3 for S3). The goals: under 2 s for 1,000 local records, under 5 s for 200 in S3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, timed_command  # noqa: E402

GOALS_S = {"local": 2.0, "s3": 5.0}
PLAIN_LOCAL = textwrap.dedent("""
    import json, os, sys
    root = sys.argv[1]
    runs = [json.load(open(os.path.join(root, name, "run.json"))) for name in sorted(os.listdir(root))
            if os.path.exists(os.path.join(root, name, "run.json"))]
    print(len(runs))
""")
PLAIN_S3 = textwrap.dedent("""
    import json, sys, boto3
    s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="runs", Prefix="team/", Delimiter="/")
    prefixes = [item["Prefix"] for page in pages for item in page.get("CommonPrefixes", [])]
    runs = [json.loads(s3.get_object(Bucket="runs", Key=prefix + "run.json")["Body"].read()) for prefix in prefixes]
    print(len(runs))
""")


def run_document(index: int) -> dict:
    """A finished training run's ``run.json``, as the job's keeper writes it."""
    started = time.time() - 86400 + index * 60
    return {
        "format": 1, "name": "food101", "run_dir": f"runs/run-{index:04d}", "status": "SUCCEEDED",
        "started": started, "ended": started + 600, "spec_hash": f"{index:016x}",
        "spec": {"name": "food101", "entrypoint": "python -m workloads.vision", "timeout_s": 3600,
                 "runtime_env": {"working_dir": "/src/project", "env_vars": {"OMP_NUM_THREADS": "1"}},
                 "workload": {"kind": "vision", "run_name": f"run-{index:04d}", "storage_path": "runs",
                              "train": {"epochs": 12, "batch_size": 64, "lr": 0.002, "num_workers": 2},
                              "data": {"source": "food101", "image_size": 64, "classes": [f"c{i}" for i in range(10)]}}},
        "code": {"working_dir": "/src/project", "working_dir_package": f"_ray_pkg_{index:016x}.zip",
                 "git": {"commit": f"{index:040x}", "dirty": False, "changes_hash": None}},
        "versions": {"python": "3.11.7", "ray": "2.60.0", "torch": "2.14.1", "torchvision": "0.29.1"},
        "cluster": {"nodes": 1, "cpus": 2, "gpus": 0},
        "metrics": {"epoch": 12, "train_loss": 0.71, "val_loss": 0.93, "val_accuracy": 0.71 + index % 7 / 100,
                    "images_per_s": 310.2, "lr": 0.0},
        "iterations": 12, "epochs": 12, "restarts": 0, "upload_every_s": 30,
        "attempts": [{"submission_id": f"raysubmit_{index:08d}", "attempt": 1, "host": "head", "started": started,
                      "updated": started + 600, "ended": started + 600, "status": "SUCCEEDED", "exit_code": 0,
                      "log_bytes": 15000, "log_parts": 1, "events": 16}],
    }


def write_local(root: Path, count: int) -> None:
    for index in range(count):
        run = root / f"run-{index:04d}"
        (run / "run-record" / "logs" / "raysubmit").mkdir(parents=True)
        (run / "run.json").write_text(json.dumps(run_document(index), indent=1))
        (run / "run-record" / "logs" / "raysubmit" / "00000.log").write_bytes(b"x" * 15000)
        (run / "metrics.csv").write_text("epoch,val_accuracy\n1,0.5\n")


def write_s3(endpoint: str, count: int) -> None:
    from tests.support.s3_server import create_bucket, s3_client

    create_bucket(endpoint, "runs")
    s3 = s3_client(endpoint)
    for index in range(count):
        prefix = f"team/run-{index:04d}"
        s3.put_object(Bucket="runs", Key=f"{prefix}/run.json", Body=json.dumps(run_document(index), indent=1).encode())
        s3.put_object(Bucket="runs", Key=f"{prefix}/run-record/logs/raysubmit/00000.log", Body=b"x" * 15000)


def timed(command: list[str], env: dict[str, str], expected_lines: int) -> float:
    """Wall seconds of one run of ``command``, whose output must name ``expected_lines`` runs."""
    elapsed, done = timed_command(command, env=env, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    found = int(lines[0]) if len(lines) == 1 else len(lines) - 1  # the plain reader's count, or the table's rows
    if found != expected_lines:
        raise SystemExit(f"{' '.join(command)} listed {found} runs, not {expected_lines}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", type=int, default=1000, help="records in a local folder")
    parser.add_argument("--s3", type=int, default=200, help="records in S3 (a moto server on loopback)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every command (medians are reported)")
    add_json_option(parser)
    args = parser.parse_args()

    from tests.support.s3_server import aws_variables, moto_s3_server

    rayjobs = str(Path(sys.executable).parent / "rayjobs")
    stamp = Stamp.begin()
    result = Result("runs_listing", "Listing run records",
                    ["where", "records", "`rayjobs runs`", "plain reader", "ratio", "goal"], [], stamp)
    with moto_s3_server() as endpoint:
        env = {**os.environ, **aws_variables(endpoint)}
        with tempfile.TemporaryDirectory(prefix="rayjobs-runs-") as scratch:
            root = Path(scratch) / "runs"
            root.mkdir()
            write_local(root, args.local)
            write_s3(endpoint, args.s3)
            sides = {
                "rayjobs local": lambda: timed([rayjobs, "runs", str(root)], env, args.local),
                "plain local": lambda: timed([sys.executable, "-c", PLAIN_LOCAL, str(root)], env, args.local),
                "rayjobs s3": lambda: timed([rayjobs, "runs", "s3://runs/team"], env, args.s3),
                "plain s3": lambda: timed([sys.executable, "-c", PLAIN_S3, endpoint], env, args.s3),
            }
            times = alternate(sides, args.rounds, show=lambda index, got: print(
                f"round {index + 1}: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in got.items()),
                flush=True))
    for where, count in (("local", args.local), ("s3", args.s3)):
        ours = result.figure(f"rayjobs {where}", Spread.of(times[f"rayjobs {where}"]), "s")
        plain = result.figure(f"plain {where}", Spread.of(times[f"plain {where}"]), "s")
        ratio = Spread.ratio(ours.values, plain.values)
        print(f"rayjobs runs ({where}, {count}) median {ours.median:.2f}s | plain reader {plain.median:.2f}s | "
              f"ratio {ratio.median:.2f}x | goal < {GOALS_S[where]:g}s", flush=True)
        result.rows.append(["local folder" if where == "local" else "S3 (moto on loopback)", str(count),
                            ours.text(2, " s"), plain.text(2, " s"), ratio.times(), f"< {GOALS_S[where]:g} s"])
    result.save(args.json)


if __name__ == "__main__":
    main()
