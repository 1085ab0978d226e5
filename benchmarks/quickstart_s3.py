"""The quickstart with its dataset and its run in S3 against the same quickstart on local disk.

Starts one private local cluster (one node, 2 CPUs) with ``runner.local`` and moto's S3 server
on 127.0.0.1, then submits ``specs/quickstart.yaml`` through ``rayjobs submit`` in turn:

- baseline: ``data.output_dir`` and ``storage_path`` in a fresh local folder;
- S3: both under ``s3://BUCKET/<round>/``, the AWS variables passed in ``runtime_env.env_vars``.

Each run writes a fresh dataset (preprocess), trains and runs batch inference: all three stages
read and write through the storage under test. The figure is the wall time of ``rayjobs submit``,
from the command to its exit, which is what a user waits for. Each side is warmed up once,
then the two sides alternate their order from round to round, so that a slow phase of the
machine does not land on one side only. The S3
server runs in this process, on the same two cores as the cluster: a real bucket is elsewhere,
so the ratio errs on the side of S3 looking slower. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/quickstart_s3.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural, submit_spec  # noqa: E402

BUCKET = "rayjobs-bench"


def submit_quickstart(cluster: str, tag: str, data: str, results: str, env_vars: dict[str, str],
                      overrides: list[str]) -> float:
    """``rayjobs submit specs/quickstart.yaml`` with its data and results at the given places; return seconds."""
    settings = [f"workload.run_name={tag}", f"workload.storage_path={results}", f"workload.data.output_dir={data}",
                *(f"runtime_env.env_vars.{name}={value}" for name, value in env_vars.items()), *overrides]
    return submit_spec("specs/quickstart.yaml", cluster, settings, tag)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each side, alternating.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a further spec override for both sides (e.g. workload.train.epochs=1)")
    add_json_option(parser)
    args = parser.parse_args()

    from runner import local
    from tests.support.s3_server import aws_variables, create_bucket, moto_s3_server

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    stamp = Stamp.begin()
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-s3-") as scratch_dir, moto_s3_server() as endpoint:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        create_bucket(endpoint, BUCKET)
        cluster = local.start(name="bench-s3", num_cpus=2)
        runs = iter(range(1_000))

        def on_disk() -> float:
            tag = f"r{next(runs)}"
            seconds = submit_quickstart(cluster.name, tag, str(scratch / tag / "data"), str(scratch / tag / "results"),
                                        {}, args.overrides)
            print(f"local disk ({tag}): {seconds:6.1f} s", flush=True)
            return seconds

        def on_s3() -> float:
            tag = f"r{next(runs)}"
            seconds = submit_quickstart(cluster.name, tag, f"s3://{BUCKET}/{tag}/data", f"s3://{BUCKET}/{tag}/runs",
                                        aws_variables(endpoint), args.overrides)
            print(f"S3         ({tag}): {seconds:6.1f} s", flush=True)
            return seconds

        try:
            results = alternate({"local disk": on_disk, "S3": on_s3}, args.rounds)
        finally:
            local.stop(cluster.name)
    result = Result("quickstart_s3", "The quickstart on S3 vs on local disk",
                    ["round", "local disk (baseline)", "S3", "ratio"], [], stamp)
    for index, (disk, remote) in enumerate(zip(results["local disk"], results["S3"])):
        result.rows.append([str(index + 1), f"{disk:.1f} s", f"{remote:.1f} s", f"{remote / disk:.2f}×"])
    baseline = result.figure("local_disk_s", Spread.of(results["local disk"]), "s")
    remote = result.figure("s3_s", Spread.of(results["S3"]), "s")
    ratio = result.figure("ratio", Spread.ratio(results["S3"], results["local disk"]), "x")
    result.rows.append(["median", baseline.text(1, " s"), remote.text(1, " s"), ratio.times() + " (goal ≤ 1.3×)"])
    result.notes.append(f"`specs/quickstart.yaml`{' with ' + ', '.join(args.overrides) if args.overrides else ''}; "
                        f"{plural(args.rounds, 'round')} after a warm-up of each side.")
    print(f"\nquickstart on local disk (baseline): {baseline.text()} s")
    print(f"quickstart on S3 (moto, loopback):   {remote.text()} s")
    print(f"ratio (S3 / local disk): {ratio.text(2)}x")
    result.save(args.json)


if __name__ == "__main__":
    main()
