"""The follower's own cost while a long run reports thousands of progress events.

Starts one private local cluster (one node, 2 CPUs) and runs a job that writes ``--events`` report
events (each beside one line of its own) at an even pace over ``--seconds``. ``rayjobs logs --follow``
follows it to the end, writing to pipes (one plain line per event, as in CI). The **baseline** is the
same follower on the same job with the events written as ordinary lines of the same length, so
that the log's size and pace are equal and only the reading of events differs. The figures are the
follower process's CPU seconds and peak RSS (``wait4``). The two sides alternate; each job runs
alone. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/follower_events.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural  # noqa: E402

JOB = """
import json, sys, time
events, seconds, as_events = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "events"
start = time.monotonic()
for i in range(1, events + 1):
    record = {"event": "report", "time": time.time(), "iteration": i, "epochs": events,
              "metrics": {"epoch": i, "train_loss": 1.0 / i, "val_loss": 1.1 / i, "val_accuracy": i / events,
                          "images_per_s": 123.4}}
    text = json.dumps(record, separators=(",", ":"))
    print(("rayjobs-event " if as_events else "progress-line ") + text)
    print(f"epoch {i}/{events}: the job's own line", flush=True)
    time.sleep(max(0.0, start + seconds * i / events - time.monotonic()))
"""


def follow_once(cluster, scratch: Path, tag: str, events: int, seconds: float, as_events: bool) -> dict:
    """Submit the job with --no-wait, follow it with `rayjobs logs --follow`; the follower's CPU s, peak RSS, lines."""
    code = scratch / tag
    code.mkdir()
    (code / "job.py").write_text(JOB)
    spec = code / "job.yaml"
    # progress: false keeps the runs equal but for the events: neither ships the training callback.
    spec.write_text(f"name: follower-{tag}\nprogress: false\nentrypoint: python job.py {events} {seconds} "
                    f"{'events' if as_events else 'lines'}\nruntime_env:\n  working_dir: {code}\n")
    env = dict(os.environ)
    submitted = subprocess.run([sys.executable, "-m", "runner.cli.app", "submit", str(spec), "--cluster", cluster.name,
                                "--no-wait"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    if submitted.returncode != 0:
        raise SystemExit(f"{tag}: submit failed\n{submitted.stderr}")
    job_id = submitted.stdout.strip()
    started = time.monotonic()
    follower = subprocess.Popen([sys.executable, "-m", "runner.cli.app", "logs", "--follow", job_id, "--cluster",
                                 cluster.name], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env)
    # Read both pipes in threads and reap the process with wait4, for its own CPU time and peak RSS.
    chunks: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda name, pipe: chunks.__setitem__(name, pipe.read()), args=(name, pipe))
               for name, pipe in (("out", follower.stdout), ("err", follower.stderr))]
    for reader in readers:
        reader.start()
    _, status, usage = os.wait4(follower.pid, 0)
    follower.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    stdout, stderr = chunks["out"], chunks["err"]
    wall = time.monotonic() - started
    if follower.returncode != 0:
        raise SystemExit(f"{tag}: the follower exited {follower.returncode}\n{stderr.decode()[-2000:]}")
    own = sum(line.endswith(b"the job's own line") for line in stdout.splitlines())
    progress_lines = sum(line.startswith(b"rayjobs: epoch ") for line in stderr.splitlines())
    if own != events or progress_lines != (events if as_events else 0):
        raise SystemExit(f"{tag}: {own} own lines and {progress_lines} progress lines, expected {events} and "
                         f"{events if as_events else 0}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="Report events per job.")
    parser.add_argument("--seconds", type=float, default=1800, help="How long each job writes them.")
    parser.add_argument("--rounds", type=int, default=1, help="Jobs per side, alternating.")
    add_json_option(parser)
    args = parser.parse_args()

    from runner import local

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    stamp = Stamp.begin()
    with tempfile.TemporaryDirectory(prefix="rayjobs-bench-events-") as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["RAYJOBS_HOME"] = str(scratch / "home")
        cluster = local.start(name="bench-events", num_cpus=2)
        runs = iter(range(1_000))

        def side(as_events: bool):
            def run() -> dict:
                figures = follow_once(cluster, scratch, f"run{next(runs)}", args.events, args.seconds, as_events)
                print(f"{'events' if as_events else 'plain lines':12s} CPU {figures['cpu_s']:6.2f} s  "
                      f"peak RSS {figures['rss_mib']:6.1f} MiB  wall {figures['wall_s']:7.1f} s", flush=True)
                return figures

            return run

        try:
            results = alternate({"plain lines": side(False), "events": side(True)}, args.rounds, warmup=False)
        finally:
            local.stop(cluster.name)
    plain, events = results["plain lines"], results["events"]
    result = Result("follower_events", "The follower's cost over a run with thousands of progress events",
                    ["side", "follower CPU s", "peak RSS", "wall s"], [], stamp)
    for label, runs_of_side in (("plain lines of the same length (baseline)", plain), ("report events", events)):
        cpu = Spread.of([run["cpu_s"] for run in runs_of_side])
        rss = Spread.of([run["rss_mib"] for run in runs_of_side])
        wall = Spread.of([run["wall_s"] for run in runs_of_side])
        result.rows.append([label, cpu.text(2), rss.text(0, " MiB"), wall.text(0)])
    ratio = result.figure("cpu_ratio", Spread.ratio([run["cpu_s"] for run in events],
                                                    [run["cpu_s"] for run in plain]), "x")
    result.figure("events_cpu_s", Spread.of([run["cpu_s"] for run in events]), "s")
    result.figure("events_rss_mib", Spread.of([run["rss_mib"] for run in events]), "MiB")
    result.rows.append(["CPU ratio (events / plain)", ratio.times(2), "", ""])
    result.notes.append(f"{args.events} report events over {args.seconds:g} s per job, each beside one line of the "
                        f"job's own; {plural(args.rounds, 'job')} per side, alternating, each alone on a 2-CPU local "
                        "cluster; the follower writes to pipes.")
    print(f"\nfollower CPU, events / plain lines: {ratio.text(2)}x")
    result.save(args.json)


if __name__ == "__main__":
    main()
