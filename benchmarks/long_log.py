"""A long log followed through connection cuts: bytes downloaded against the log's size.

    python benchmarks/long_log.py [--megabytes 200] [--seconds 180] [--cut-every 3] [--rounds 2]

Starts a private loopback cluster; a job prints ``--megabytes`` of numbered 100-byte lines
over about ``--seconds`` while `rayjobs logs --follow` follows it through a fault proxy
that cuts every connection every ``--cut-every`` seconds. Every job runs alone on a fresh
private cluster, one after the other: the baseline's reconnects have killed Ray's
dashboard agent before, and its full-log fetch at the end loads the head heavily, so no
run inherits the state another left behind. The two followers are:

  * this checkout's follower, which resumes a dropped log near where it stopped;
  * the **baseline**: the follower of ``--baseline-ref`` (a git ref), whose log websocket
    replays the log from byte 0 on every reconnect.

Each follower first follows a small warm-up job (``--warmup-megabytes``), then the two
alternate their order for ``--rounds`` rounds. For each run it prints: whether every line
arrived once and in order (and stdout equals the driver log byte for byte), bytes
downloaded / log size, the follower's peak RSS and CPU seconds, and its wall time from
the job's start; then the medians with the lowest and highest run. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural  # noqa: E402
from runner.local import loopback_env  # noqa: E402
from runner.local import start as start_local_cluster  # noqa: E402
from runner.local import stop as stop_local_cluster  # noqa: E402
from tests.support.fault_proxy import FaultProxy  # noqa: E402

LINE_BYTES = 100
BATCH_S = 0.25
JOB = """import sys, time
lines, batches = {lines}, {batches}
per_batch = lines // batches
out = sys.stdout.buffer
started = time.monotonic()
for batch in range(batches):
    first = batch * per_batch
    out.write(b"".join(b"%09d %s\\n" % (i, b"x" * 89) for i in range(first, first + per_batch)))
    out.flush()
    time.sleep(max(0.0, started + (batch + 1) * {batch_s} - time.monotonic()))
"""
NUMBERED = re.compile(rb"^(\d{9}) x{89}$")
CLUSTERS = itertools.count()


class Follower:
    """One `rayjobs logs --follow` process behind its own cutting proxy; checks its stdout as it streams."""

    def __init__(self, label: str, code_dir: Path, job_id: str, cluster: Any, env: dict[str, str],
                 cut_every_s: float) -> None:
        self.label = label
        self.proxy = FaultProxy(int(urllib.parse.urlsplit(cluster.dashboard_url).port), max_lifetime_s=3600)
        self.proxy.__enter__()
        self.started = time.monotonic()
        # The command line was one module, runner/cli.py, until it became a package (runner/cli/app.py).
        cli = "runner.cli.app" if (code_dir / "runner" / "cli" / "app.py").exists() else "runner.cli"
        self.process = subprocess.Popen(
            [sys.executable, "-m", cli, "logs", "--follow", job_id, "--address", self.proxy.address,
             "--give-up-after", "120",
             # The log exactly as written, to compare byte for byte (followers that filter Ray's lines have --raw).
             *(["--raw"] if (code_dir / "runner" / "follow" / "log_view.py").exists() else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=code_dir, stdin=subprocess.DEVNULL,
            env=dict(env, PYTHONPATH=str(code_dir)))
        self.digest = hashlib.sha256()
        self.stdout_bytes = self.numbered = self.out_of_order = 0
        self.cuts = 0
        self.stderr = b""
        self.rusage: Any = None
        self.wall_s = 0.0
        self.exit_code: int | None = None
        self._exited = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._cut, args=(cut_every_s,), daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        expected = 0
        for line in self.process.stdout:
            self.digest.update(line)
            self.stdout_bytes += len(line)
            match = NUMBERED.match(line.rstrip(b"\n"))
            if match:
                self.numbered += 1
                self.out_of_order += int(match.group(1)) != expected
                expected = int(match.group(1)) + 1

    def _read_stderr(self) -> None:
        self.stderr = self.process.stderr.read()

    def _cut(self, every_s: float) -> None:
        # Not process.poll(): that would reap the follower before os.wait4 reads its resource usage.
        while not self._exited.wait(every_s):
            self.cuts += self.proxy.cut_all() > 0

    def wait(self) -> None:
        """Wait for the follower to exit; keep its exit code, resource usage and wall time."""
        _, status, self.rusage = os.wait4(self.process.pid, 0)
        self._exited.set()
        self.wall_s = time.monotonic() - self.started
        self.exit_code = os.waitstatus_to_exitcode(status)
        self.process.returncode = self.exit_code
        for thread in self._threads:
            thread.join(timeout=30)
        self.proxy.close()


def raw_log_digest(cluster: Any, job_id: str) -> tuple[int, str]:
    """Size and SHA-256 of the job's driver log as the cluster holds it."""
    node_id = _job(cluster, job_id)["driver_node_id"]
    query = urllib.parse.urlencode({"submission_id": job_id, "node_id": node_id, "lines": -1, "timeout": 600})
    digest, size = hashlib.sha256(), 0
    with urllib.request.urlopen(f"{cluster.dashboard_url}/api/v0/logs/file?{query}", timeout=120) as response:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _job(cluster: Any, job_id: str) -> dict[str, Any]:
    import json

    with urllib.request.urlopen(f"{cluster.dashboard_url}/api/jobs/{job_id}", timeout=30) as response:
        return json.load(response)


def baseline_code(ref: str, into: Path) -> Path:
    """The follower of git ref ``ref`` (its runner and jobs packages) unpacked into ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "runner", "jobs"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def write_job(home: Path, name: str, megabytes: float, seconds: float) -> tuple[Path, int]:
    """A spec whose job prints ``megabytes`` of numbered lines over ``seconds``; return it and its line count."""
    lines = int(megabytes * 1e6 / LINE_BYTES)
    batches = max(1, int(seconds / BATCH_S))
    lines -= lines % batches
    job_dir = home / name
    job_dir.mkdir()
    (job_dir / "job.py").write_text(JOB.format(lines=lines, batches=batches, batch_s=BATCH_S))
    spec = home / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python job.py\nruntime_env:\n  working_dir: {job_dir}\n")
    return spec, lines


def follow_one(label: str, code_dir: Path, spec: Path, lines: int, home: Path, cut_every: float) -> dict[str, Any]:
    """On a fresh cluster, submit the job of ``spec`` and follow it with the follower in ``code_dir``.

    Prints the run's table row and returns its figures.
    """
    name = f"bench-long-log-{next(CLUSTERS)}"
    cluster = start_local_cluster(name=name, num_cpus=2, auth=False)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "RAY_AUTH"))}
        env.update(loopback_env(cluster), RAYJOBS_HOME=str(home), PYTHONUNBUFFERED="1")
        return _follow(label, code_dir, spec, lines, cluster, env, cut_every)
    finally:
        stop_local_cluster(name)


def _follow(label: str, code_dir: Path, spec: Path, lines: int, cluster: Any, env: dict[str, str],
            cut_every: float) -> dict[str, Any]:
    submitted = subprocess.run([sys.executable, "-m", "runner.cli.app", "submit", str(spec), "--no-wait",
                                "--address", cluster.dashboard_url], capture_output=True, text=True,
                               env=env, cwd=REPO, check=True)
    job_id = submitted.stdout.strip()
    f = Follower(label, code_dir, job_id, cluster, env, cut_every)
    f.wait()
    try:
        size, digest = raw_log_digest(cluster, job_id)
    except OSError as exc:
        size, digest = 0, f"unreadable ({exc})"
    run = {"exit": f.exit_code, "in_order": f.numbered == lines and f.out_of_order == 0, "lines": f.numbered,
           "out_of_order": f.out_of_order, "same_as_log": f.digest.hexdigest() == digest,
           "downloaded_ratio": f.proxy.bytes_down / max(size, 1), "downloaded_mb": f.proxy.bytes_down / 1e6,
           "log_mb": size / 1e6, "peak_rss_mib": f.rusage.ru_maxrss / 1024,
           "cpu_s": f.rusage.ru_utime + f.rusage.ru_stime, "cuts": f.cuts, "wall_s": f.wall_s}
    in_order = "yes" if run["in_order"] else f"no ({f.numbered} lines, {f.out_of_order} out of order)"
    print(f"| {label} | {f.exit_code} | {in_order} | {'yes' if run['same_as_log'] else 'no'} "
          f"| {run['downloaded_ratio']:.2f} ({run['downloaded_mb']:.0f} MB of {run['log_mb']:.0f}) "
          f"| {run['peak_rss_mib']:.0f} MiB | {run['cpu_s']:.1f} | {f.cuts} | {f.wall_s:.0f} |", flush=True)
    if f.exit_code != 0:
        print(f"  {label} stderr: {f.stderr.decode('utf-8', 'replace')[-1500:]}", flush=True)
    return run


def summary_row(label: str, runs: list[dict[str, Any]]) -> list[str]:
    """One follower's runs as a table row: counts of complete runs, medians with their range."""
    def count(key: str) -> str:
        good = sum(bool(r[key]) for r in runs)
        return f"yes, {good} of {len(runs)}" if good == len(runs) else f"**no**: {len(runs) - good} of {len(runs)}"

    ratio = Spread.of([r["downloaded_ratio"] for r in runs])
    return [label, " ".join(sorted({str(r["exit"]) for r in runs})), count("in_order"), count("same_as_log"),
            f"**{ratio.text(2)}** ({statistics.median(r['downloaded_mb'] for r in runs):.0f} MB of "
            f"{statistics.median(r['log_mb'] for r in runs):.0f})",
            Spread.of([r["peak_rss_mib"] for r in runs]).text(0, " MiB"),
            Spread.of([r["cpu_s"] for r in runs]).text(1), Spread.of([r["cuts"] for r in runs]).text(0),
            Spread.of([r["wall_s"] for r in runs]).text(0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=200, help="size of the job's log (MB, 10^6 bytes)")
    parser.add_argument("--seconds", type=float, default=180, help="how long the job takes to print it")
    parser.add_argument("--cut-every", type=float, default=3.0, help="seconds between connection cuts")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per follower, alternating (default 2)")
    parser.add_argument("--warmup-megabytes", type=float, default=2, help="log of each follower's warm-up job")
    parser.add_argument("--baseline-ref", default="ebc2255",
                        help="git ref of the replay-from-0 follower (default: the last commit before resuming)")
    parser.add_argument("--no-baseline", action="store_true", help="follow with this checkout only")
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    home = Path(tempfile.mkdtemp(prefix="rayjobs-bench-long-log-"))
    os.environ["RAYJOBS_HOME"] = str(home)
    spec, lines = write_job(home, "long-log", args.megabytes, args.seconds)
    warmup_spec, warmup_lines = write_job(home, "warm-up", args.warmup_megabytes, 5)
    followers = {"this checkout": REPO}
    if not args.no_baseline:
        followers[f"baseline {args.baseline_ref} (replay from 0)"] = baseline_code(args.baseline_ref, home / "baseline")
    print(f"{lines} lines ({lines * LINE_BYTES / 1e6:.0f} MB) over {args.seconds:g} s per job; cuts every "
          f"{args.cut_every:g} s; {plural(args.rounds, 'round')}, a fresh cluster for every job")
    print("| follower | exit | lines once, in order | stdout = log | downloaded / log | peak RSS | CPU s "
          "| cuts | wall s |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)

    def side(label: str, code_dir: Path, job: Path, job_lines: int):
        return lambda: follow_one(label, code_dir, job, job_lines, home, args.cut_every)

    try:
        runs = alternate({label: side(label, code, spec, lines) for label, code in followers.items()}, args.rounds,
                         warmup={label: side(label, code, warmup_spec, warmup_lines)
                                 for label, code in followers.items()})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result = Result("long_log", "A long log followed through connection cuts",
                    ["follower", "exit", "every line once, in order", "stdout = driver log", "downloaded / log size",
                     "peak RSS", "CPU s", "cuts", "wall s"], [summary_row(label, r) for label, r in runs.items()],
                    stamp)
    result.figures = {f"{label}: {key}": {"values": [r[key] for r in found]} for label, found in runs.items()
                      for key in ("downloaded_ratio", "peak_rss_mib", "cpu_s", "wall_s", "in_order")}
    result.notes.append(f"A {lines * LINE_BYTES / 1e6:.0f} MB log over {args.seconds:g} s per job, every connection "
                        f"cut every {args.cut_every:g} s; {plural(args.rounds, 'job')} per follower, alternating, "
                        "after a "
                        f"{args.warmup_megabytes:g} MB warm-up job each.")
    print()
    for row in result.rows:
        print("| " + " | ".join(row) + " |")
    result.save(args.json)


if __name__ == "__main__":
    main()
