"""A pipeline on a cluster: what sending one costs the terminal, how soon a job starts once its last dependency
succeeded, and what a large pipeline waiting costs the head.

    python benchmarks/pipeline_submission.py [--rounds 3] [--jobs 10] [--waiting 200] [--json PATH]

Submission. ``rayjobs submit PIPELINE --no-wait`` of a pipeline of ``--jobs`` jobs (a chain), timed as a whole
process. The **baseline** is what a user does without pipelines: ``rayjobs submit --no-wait`` of the same specs, one
process each, one after the other. The jobs are trivial (they print a line), so the figure is the client's and the
queue's cost, not the jobs'.

Handover. In each submitted chain, the time from a job's end (Ray's job table) to the next job's first line (its own
clock). The goal is under 2 s, as for a queue's slot freeing.

Memory. A pipeline of ``--waiting`` jobs waits behind a first job that holds until the benchmark ends, and the
proportional set size of every process of the cluster is summed before and after: the cost per waiting job, beside
what ``queue_admission`` measures for a queued job.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import Result, Spread, Stamp, add_json_option, timed_command  # noqa: E402
from benchmarks.queue_admission import cluster_pss, settled_pss  # noqa: E402
from runner.local import start as start_local_cluster  # noqa: E402
from runner.local import stop as stop_local_cluster  # noqa: E402

STEP = "import time; print(f'step started {time.time():.3f}', flush=True)"
HOLD = ("import os, pathlib, time; [time.sleep(0.05) for _ in iter(lambda: pathlib.Path(os.environ['RELEASE_FLAG'])"
        ".exists(), True)]")


def write_chain(folder: Path, name: str, jobs: int, first: str = STEP, env: str = "") -> tuple[Path, list[Path]]:
    """A pipeline of ``jobs`` jobs, each after the one before, and its specs."""
    folder.mkdir(parents=True, exist_ok=True)
    specs = []
    for index in range(jobs):
        spec = folder / f"step-{index}.yaml"
        spec.write_text(f"name: step-{index}\nentrypoint: {json.dumps('python -c ' + json.dumps(first if index == 0 else STEP))}\n"
                        f"record: false\n{env}")
        specs.append(spec)
    lines = [f"pipeline: {name}", "jobs:"]
    for index in range(jobs):
        lines += [f"  step-{index}:", f"    spec: step-{index}.yaml"]
        if index:
            lines.append(f"    after: [step-{index - 1}]")
    pipeline = folder / "pipeline.yaml"
    pipeline.write_text("\n".join(lines) + "\n")
    return pipeline, specs


def handovers(api, run_id: str, jobs: int) -> list[float]:
    """Seconds from each job's end (Ray's table) to the next job's first line, once the chain has ended."""
    def info(index: int) -> dict:
        return api.get_job(f"{run_id}-step-{index}")

    from runner.errors import JobNotFound

    while True:
        try:
            if info(jobs - 1).get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
        except JobNotFound:  # still waiting in its queue
            pass
        time.sleep(0.5)
    gaps = []
    for index in range(1, jobs):
        started = re.search(r"step started ([\d.]+)", api.job_log(f"{run_id}-step-{index}"))
        gaps.append(float(started.group(1)) - float(info(index - 1)["end_time"]) / 1000)
    return gaps


def _status(api, job_id: str) -> str | None:
    from runner.errors import JobNotFound

    try:
        return api.get_job(job_id).get("status")
    except JobNotFound:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="submissions on each side (medians are reported)")
    parser.add_argument("--jobs", type=int, default=10, help="jobs in the submitted pipeline")
    parser.add_argument("--waiting", type=int, default=200, help="jobs of the waiting pipeline, for the memory")
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    result = Result("pipeline_submission", "A pipeline: submission, handover and memory",
                    ["figure", "pipeline", "baseline", "ratio (min–max)"], [], stamp)
    with tempfile.TemporaryDirectory(prefix="rayjobs-pipeline-bench-") as scratch:
        directory = Path(scratch)
        env = {**os.environ, "RAYJOBS_HOME": str(directory / "home"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAYJOBS_CLUSTER": "bench-pipeline"}
        os.environ.update(RAYJOBS_HOME=env["RAYJOBS_HOME"])
        command = str(Path(sys.executable).parent / "rayjobs")
        cluster = start_local_cluster(name="bench-pipeline", num_cpus=2)
        try:
            from runner.client.jobs_api import connect

            api = connect(cluster="bench-pipeline")
            ours, baseline, gaps = [], [], []
            pipeline, specs = write_chain(directory / "warm", "warm", 2)
            timed_command([command, "submit", str(pipeline), "--no-wait"], 0, env=env)  # warm-up: the first keeper
            for index in range(args.rounds):
                pipeline, specs = write_chain(directory / f"round-{index}", f"chain-{index}", args.jobs)
                sides = ("pipeline", "single") if index % 2 == 0 else ("single", "pipeline")
                for side in sides:
                    if side == "pipeline":
                        seconds, done = timed_command([command, "submit", str(pipeline), "--no-wait"], 0, env=env)
                        ours.append(seconds)
                        run_id = done.stdout.strip().splitlines()[-1]
                    else:
                        started = time.perf_counter()
                        for spec in specs:
                            timed_command([command, "submit", str(spec), "--no-wait"], 0, env=env)
                        baseline.append(time.perf_counter() - started)
                gaps += handovers(api, run_id, args.jobs)
                print(f"round {index + 1}: pipeline {ours[-1]:.2f}s, {args.jobs} submissions {baseline[-1]:.2f}s, "
                      f"handover median {statistics.median(gaps):.2f}s", flush=True)
            # A holder takes the one slot of a queue, then a pipeline waits behind it whole: its first job for the
            # slot, the others for the jobs they run after.
            flag = directory / "release"
            timed_command([command, "queue", "set", "bench-wait", "--max-running", "1"], 0, env=env)
            holder, _ = write_chain(directory / "holder", "holder", 1, first=HOLD,
                                    env=f"queue: bench-wait\nruntime_env:\n  env_vars:\n    RELEASE_FLAG: '{flag}'\n")
            held = timed_command([command, "submit", str(holder), "--no-wait"], 0, env=env)[1].stdout.split()[-1]
            while _status(api, f"{held}-step-0") != "RUNNING":
                time.sleep(0.5)
            before = settled_pss(cluster.token_file)
            big, _ = write_chain(directory / "big", "big", args.waiting, env="queue: bench-wait\n")
            timed_command([command, "submit", str(big), "--no-wait"], 0, env=env)
            time.sleep(5)  # the keeper's step after the seal
            after = settled_pss(cluster.token_file)
            flag.touch()
        finally:
            stop_local_cluster("bench-pipeline")
    mine = result.figure("submit pipeline", Spread.of(ours), "s")
    theirs = result.figure("submit one by one", Spread.of(baseline), "s")
    ratios = Spread.ratio(ours, baseline)
    result.rows.append([f"`rayjobs submit --no-wait` of {args.jobs} jobs", mine.text(2, " s"),
                        f"{theirs.text(2, ' s')} ({args.jobs} `rayjobs submit --no-wait`, one after the other)",
                        f"**{ratios.median:.2f}×** ({ratios.low:.2f}–{ratios.high:.2f})"])
    handover = result.figure("handover", Spread.of(gaps), "s")
    result.rows.append(["from a job's end to the next job's first line", handover.text(2, " s"),
                        f"goal under 2 s ({len(gaps)} handovers)", "–"])
    per_job = (after - before) / args.waiting
    result.figures["memory per waiting job"] = {"unit": "MiB", "pipeline": per_job}
    result.rows.append([f"the cluster's memory (PSS) per waiting job, a pipeline of {args.waiting}",
                        f"{per_job:.2f} MiB", "`queue_admission`'s queued job, beside it", "–"])
    print("\n".join(" | ".join(row) for row in result.rows), flush=True)
    result.save(args.json)


if __name__ == "__main__":
    main()
