"""Wall time of rayjobs commands against Ray's own `ray job` CLI, on the same local cluster.

    python benchmarks/cli_latency.py [--runs 5]

Starts a private loopback cluster, runs each of the four commands once to warm up (page cache,
the cluster's first job), then interleaves, run by run:
  * `rayjobs submit` (waits for the end)  vs  `ray job submit` (waits too), same trivial job;
  * `rayjobs status ID`                   vs  `ray job status ID`.
Which command of a pair goes first alternates from run to run, so neither always meets the
cluster right after the other's job. Prints the median of each, its spread (min–max) and the
ratio rayjobs / ray (lower is better), and the load average before and after.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.local import start as start_local_cluster  # noqa: E402
from runner.local import stop as stop_local_cluster  # noqa: E402

TRIVIAL_PRINT = "print('hello from the job')"
TRIVIAL_ENTRYPOINT = f"python -c \"{TRIVIAL_PRINT}\""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return elapsed, result.stdout + result.stderr


def submission_id(json_output: str) -> str:
    return json_output.split('"submission_id": "')[1].split('"')[0]


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (medians are reported)")
    args = parser.parse_args()

    bin_dir = Path(sys.executable).parent
    rayjobs, ray = str(bin_dir / "rayjobs"), str(bin_dir / "ray")
    home = Path(tempfile.mkdtemp(prefix="rayjobs-bench-"))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "RAY_AUTH"))}
    base_env.update(RAYJOBS_HOME=str(home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                    PATH=f"{bin_dir}{os.pathsep}{base_env.get('PATH', '')}")
    os.environ["RAYJOBS_HOME"] = str(home)
    cluster = start_local_cluster(name="bench", num_cpus=2)
    try:
        rayjobs_env = dict(base_env)
        ray_env = dict(base_env, RAY_ADDRESS=cluster.dashboard_url, RAY_AUTH_MODE="token",
                       RAY_AUTH_TOKEN_PATH=str(cluster.token_file))
        address = ["--address", cluster.dashboard_url]
        spec = home / "trivial.yaml"
        spec.write_text("name: trivial\nentrypoint: |-\n  " + TRIVIAL_ENTRYPOINT + "\n")
        rayjobs_env["RAY_AUTH_TOKEN_PATH"] = str(cluster.token_file)

        times: dict[str, list[float]] = {"rayjobs submit": [], "ray job submit": [], "rayjobs status": [],
                                         "ray job status": []}
        submits = [("rayjobs submit", [rayjobs, "submit", str(spec), *address, "--output", "json"], rayjobs_env),
                   ("ray job submit", [ray, "job", "submit", "--", "python", "-c", TRIVIAL_PRINT], ray_env)]

        def statuses(job_id: str) -> list[tuple[str, list[str], dict[str, str]]]:
            return [("rayjobs status", [rayjobs, "status", job_id, *address], rayjobs_env),
                    ("ray job status", [ray, "job", "status", job_id], ray_env)]

        print(f"load average before: {load_average()}", flush=True)
        # Warm-up, both sides alike: the first job on a fresh cluster and the first read of each
        # CLI's files are slower than any later one.
        last_id = submission_id(timed(submits[0][1], rayjobs_env)[1])
        timed(submits[1][1], ray_env)
        for _, command, env in statuses(last_id):
            timed(command, env)
        for run in range(args.runs):
            # Alternate which command of each pair goes first, so that neither always starts right after
            # the other's job has ended (while the cluster cleans up after it) or meets a warm page cache.
            order = slice(None) if run % 2 == 0 else slice(None, None, -1)
            for label, command, env in submits[order]:
                elapsed, output = timed(command, env)
                times[label].append(elapsed)
                if label == "rayjobs submit":
                    last_id = submission_id(output)
            for label, command, env in statuses(last_id)[order]:
                times[label].append(timed(command, env)[0])
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                  flush=True)

        print()
        medians = {label: statistics.median(values) for label, values in times.items()}
        for ours, theirs, target in (("rayjobs submit", "ray job submit", 0.25), ("rayjobs status", "ray job status",
                                                                                   0.35)):
            ratio = medians[ours] / medians[theirs]
            print(f"{ours:<16} median {medians[ours]:.2f}s | {theirs:<16} median {medians[theirs]:.2f}s | "
                  f"ratio {ratio:.2f}x (target <= {target}x) {'OK' if ratio <= target else 'MISSED'}")
            print(f"  spread (min-max of {args.runs}): {ours} {min(times[ours]):.2f}-{max(times[ours]):.2f}s, "
                  f"{theirs} {min(times[theirs]):.2f}-{max(times[theirs]):.2f}s")
        print(f"load average after: {load_average()}")
    finally:
        stop_local_cluster("bench")


if __name__ == "__main__":
    main()
