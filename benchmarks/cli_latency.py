"""Wall time of rayjobs commands against Ray's own `ray job` CLI, on the same local cluster.

    python benchmarks/cli_latency.py [--runs 5]

Starts a private loopback cluster, then interleaves, run by run:
  * `rayjobs submit` (waits for the end)  vs  `ray job submit` (waits too), same trivial job;
  * `rayjobs status ID`                   vs  `ray job status ID`.
Prints the median of each and the ratio rayjobs / ray (lower is better).
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

TRIVIAL_ENTRYPOINT = "python -c \"print('hello from the job')\""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return elapsed, result.stdout + result.stderr


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
        last_id = None
        timed([rayjobs, "submit", str(spec), *address], rayjobs_env)  # warm-up: workers, caches
        for run in range(args.runs):
            elapsed, output = timed([rayjobs, "submit", str(spec), *address, "--output", "json"], rayjobs_env)
            times["rayjobs submit"].append(elapsed)
            last_id = output.split('"submission_id": "')[1].split('"')[0]
            elapsed, _ = timed([ray, "job", "submit", "--", *["python", "-c", "print('hello from the job')"]], ray_env)
            times["ray job submit"].append(elapsed)
            # Alternate which status command goes first, so neither always meets a warm page cache.
            pair = [("rayjobs status", [rayjobs, "status", last_id, *address], rayjobs_env),
                    ("ray job status", [ray, "job", "status", last_id], ray_env)]
            for label, command, env in (pair if run % 2 == 0 else pair[::-1]):
                times[label].append(timed(command, env)[0])
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                  flush=True)

        print()
        medians = {label: statistics.median(values) for label, values in times.items()}
        for ours, theirs, target in (("rayjobs submit", "ray job submit", 0.5), ("rayjobs status", "ray job status",
                                                                                   0.35)):
            ratio = medians[ours] / medians[theirs]
            print(f"{ours:<16} median {medians[ours]:.2f}s | {theirs:<16} median {medians[theirs]:.2f}s | "
                  f"ratio {ratio:.2f}x (target <= {target}x) {'OK' if ratio <= target else 'MISSED'}")
    finally:
        stop_local_cluster("bench")


if __name__ == "__main__":
    main()
