"""Wall time of rayjobs commands against Ray's own `ray job` CLI, on the same local cluster.

    python benchmarks/cli_latency.py [--runs 5]

Starts a private loopback cluster, runs each of the four commands once to warm up (page cache,
the cluster's first job), then interleaves, run by run:
  * `rayjobs submit` (waits for the end)  vs  `ray job submit` (waits too), same trivial job;
  * the same pair for a job whose code is a one-file `working_dir` (`submit-code`): most real jobs upload code,
    and the package, its upload and the runtime environment's set-up are then part of the trip;
  * `rayjobs status ID`                   vs  `ray job status ID`.
Which command of a pair goes first alternates from run to run, so neither always meets the
cluster right after the other's job. Each `rayjobs submit` is also taken apart ("trip" lines, medians): from the
command's start to Ray taking the job (client start, checks, code package and upload), to the command printing its
entrypoint's start (the supervisor and the runtime environment), to it printing the job's first line (the agent,
the interpreter, the log's way back), and to its return (the end seen), beside when Ray ended the job. Prints the median of each, its spread (min–max) and the
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

JOB_LINE = "hello from the job"
TRIVIAL_PRINT = f"print('{JOB_LINE}')"
TRIVIAL_ENTRYPOINT = f"python -c \"{TRIVIAL_PRINT}\""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return elapsed, result.stdout + result.stderr


# In the order the command meets them; Ray's end of the job is said beside them: the job's last lines reach the
# command after it.
TRIP_LEGS = ("Ray took it", "entrypoint running", "first line", "command returned")


def timed_trip(command: list[str], env: dict[str, str], api: object) -> tuple[float, str, dict[str, float]]:
    """Run a followed ``rayjobs submit`` and time its legs, each from the command's start (seconds): when Ray took
    the job and when it ended (Ray's own clock, the same machine's), and when the command printed the entrypoint's
    start, the job's first line and returned."""
    started_wall, started = time.time(), time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL)
    seen: dict[str, float] = {}
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("Running entrypoint for job"):
            seen.setdefault("entrypoint running", time.perf_counter() - started)
        elif line.strip() == JOB_LINE:
            seen.setdefault("first line", time.perf_counter() - started)
    output = process.stdout.read()
    process.wait()
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{output}\n{''.join(lines)}")
    info = api.get_job(submission_id(output))
    seen.update({"Ray took it": info["start_time"] / 1000 - started_wall, "job ended": info["end_time"] / 1000 - started_wall,
                 "command returned": elapsed})
    return elapsed, output + "".join(lines), seen


def trip_line(label: str, trips: list[dict[str, float]]) -> str:
    """One line of a submission's legs, each the median time since the previous one."""
    medians = {leg: statistics.median(trip[leg] for trip in trips) for leg in TRIP_LEGS if all(leg in trip for trip in trips)}
    legs, before = [], 0.0
    for leg, at in medians.items():
        legs.append(f"{leg} +{at - before:.2f} s")
        before = at
    ended = statistics.median(trip["job ended"] for trip in trips)
    return (f"trip ({label}, medians of {len(trips)}): " + " · ".join(legs)
            + f" (Ray ended the job {ended:.2f} s after the command started)")


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

        code = home / "code"
        code.mkdir()
        (code / "job.py").write_text(TRIVIAL_PRINT + "\n")
        coded_spec = home / "trivial-code.yaml"
        coded_spec.write_text(f"name: trivial-code\nentrypoint: python job.py\nruntime_env:\n  working_dir: {code}\n")

        times: dict[str, list[float]] = {"rayjobs submit": [], "ray job submit": [], "rayjobs submit-code": [],
                                         "ray job submit-code": [], "rayjobs status": [], "ray job status": []}
        trips: dict[str, list[dict[str, float]]] = {"rayjobs submit": [], "rayjobs submit-code": []}
        from runner.client.connection import Connection
        from runner.client.jobs_api import JobsApi

        api = JobsApi(Connection(address=cluster.dashboard_url, source="benchmark",
                                 headers={"Authorization": f"Bearer {cluster.auth_token()}"}))
        submits = [("rayjobs submit", [rayjobs, "submit", str(spec), *address, "--output", "json"], rayjobs_env),
                   ("ray job submit", [ray, "job", "submit", "--", "python", "-c", TRIVIAL_PRINT], ray_env)]
        coded_submits = [("rayjobs submit-code", [rayjobs, "submit", str(coded_spec), *address, "--output", "json"],
                          rayjobs_env),
                         ("ray job submit-code", [ray, "job", "submit", "--working-dir", str(code), "--", "python",
                                                  "job.py"], ray_env)]

        def statuses(job_id: str) -> list[tuple[str, list[str], dict[str, str]]]:
            return [("rayjobs status", [rayjobs, "status", job_id, *address], rayjobs_env),
                    ("ray job status", [ray, "job", "status", job_id], ray_env)]

        print(f"load average before: {load_average()}", flush=True)
        # Warm-up, both sides alike: the first job on a fresh cluster and the first read of each
        # CLI's files are slower than any later one.
        last_id = submission_id(timed(submits[0][1], rayjobs_env)[1])
        timed(submits[1][1], ray_env)
        for _, command, env in coded_submits:
            timed(command, env)
        for _, command, env in statuses(last_id):
            timed(command, env)
        for run in range(args.runs):
            # Alternate which command of each pair goes first, so that neither always starts right after
            # the other's job has ended (while the cluster cleans up after it) or meets a warm page cache.
            order = slice(None) if run % 2 == 0 else slice(None, None, -1)
            for label, command, env in submits[order] + coded_submits[order]:
                if label in trips:
                    elapsed, output, trip = timed_trip(command, env, api)
                    trips[label].append(trip)
                else:
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
        for ours, theirs, target in (("rayjobs submit", "ray job submit", 0.25),
                                     ("rayjobs submit-code", "ray job submit-code", 0.22),
                                     ("rayjobs status", "ray job status", 0.35)):
            ratio = medians[ours] / medians[theirs]
            print(f"{ours:<19} median {medians[ours]:.2f}s | {theirs:<19} median {medians[theirs]:.2f}s | "
                  f"ratio {ratio:.2f}x (target <= {target}x) {'OK' if ratio <= target else 'MISSED'}")
            print(f"  spread (min-max of {args.runs}): {ours} {min(times[ours]):.2f}-{max(times[ours]):.2f}s, "
                  f"{theirs} {min(times[theirs]):.2f}-{max(times[theirs]):.2f}s")
        for label, taken in trips.items():
            print(trip_line(label, taken))
        print(f"load average after: {load_average()}")
    finally:
        stop_local_cluster("bench")


if __name__ == "__main__":
    main()
