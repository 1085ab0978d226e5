"""A cluster queue: how soon the next job starts when a slot frees, and what a waiting job costs the head.

    python benchmarks/queue_admission.py [--rounds 5] [--waiting 6] [--json PATH]

Submission. ``rayjobs submit --no-wait`` of one spec, into a queue and not, timed as whole processes,
alternating: what a team submitting many jobs waits at the terminal for each. The **baseline** is the
plain submission of the same spec (no ``queue:``). Goal: within 1.2× of it.

Handover. Two jobs of a queue limited to one: the first holds the slot until the benchmark lets
it go, the second waits. The figure is the time from the first job's last line (its own clock) to
the second job's first line: the first job's interpreter ending, its wrapper giving the slot back,
the queue's keeper seeing it (it looks every 0.1 s while a job waits) and submitting the second job
to Ray, and that job starting. The **baseline** is what a queue replaces: a submitter that waits for
the first job to end, then submits the second (`rayjobs submit`, then `rayjobs submit` again),
measured between the same two lines. Goal: under 2 s.

Memory. ``--waiting`` jobs wait in the queue behind a holder, and the proportional set size (PSS) of
every process of the cluster is summed before and after: the cost per waiting job. The **baseline**
is the same number of plain Ray jobs left PENDING (their entrypoint asks for more CPUs than the
cluster has, so Ray holds them back as it would jobs that do not fit). Goal: under 1 MiB per
waiting job. Jobs are submitted ``--parallel`` at a time, as a team's script would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from benchmarks.common import Result, Spread, Stamp, add_json_option, timed_command  # noqa: E402
from runner.client.queue import ClusterQueue  # noqa: E402
from runner.local import start as start_local_cluster  # noqa: E402
from runner.local import stop as stop_local_cluster  # noqa: E402

HOLDER = """
import os, pathlib, time
print(f"bench-job started {time.time():.3f}", flush=True)
flag = os.environ.get("RELEASE_FLAG")
while flag and not pathlib.Path(flag).exists():
    time.sleep(0.01)
print(f"bench-job ended {time.time():.3f}", flush=True)
"""
QUEUE = "bench"


def spec(directory: Path, name: str, *, queued: bool, flag: Path | None = None, cpus: float | None = None) -> Path:
    """A spec of the holder script: in the queue or not, held by ``flag``, its entrypoint asking ``cpus``."""
    lines = [f"name: {name}", "entrypoint: python holder.py", f"record_path: {directory / 'records'}"]
    if queued:
        lines += [f"queue: {QUEUE}", "needs: {CPU: 0}"]
    if cpus is not None:
        lines.append(f"entrypoint_num_cpus: {cpus}")
    lines += ["runtime_env:", f"  working_dir: {directory / 'code'}"]
    if flag is not None:
        lines += ["  env_vars:", f"    RELEASE_FLAG: '{flag}'"]
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Cli:
    """The `rayjobs` command against the benchmark's cluster, and its client for the polls between commands.

    The polls go through the cluster client in this process: a `rayjobs` process every 0.2 s would load
    the two cores that the job starts being measured run on.
    """

    def __init__(self, home: Path) -> None:
        self.env = {**os.environ, "RAYJOBS_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        self.command = str(Path(sys.executable).parent / "rayjobs")
        self.api: Any = None

    def connect(self, cluster: str) -> None:
        """Poll the local cluster ``cluster`` from here on."""
        from runner.client.jobs_api import connect

        self.api = connect(cluster=cluster)

    def run(self, *args: str, code: int | None = 0) -> str:
        """Run ``rayjobs ARGS`` to its end; its stdout (it must exit with ``code``, unless that is None)."""
        if code is not None:
            return timed_command([self.command, *args], code, env=self.env, cwd=REPO)[1].stdout
        return subprocess.run([self.command, *args], capture_output=True, text=True, env=self.env, cwd=REPO,
                              stdin=subprocess.DEVNULL).stdout

    def submit(self, spec_path: Path, *flags: str) -> str:
        """Submit without following; the job's id."""
        return self.run("submit", str(spec_path), "--no-wait", *flags).strip().splitlines()[-1]

    def moment(self, job_id: str, word: str) -> float | None:
        """The time the job printed ``bench-job WORD``, once it has."""
        from runner.errors import JobNotFound

        try:
            found = re.search(rf"bench-job {word} ([\d.]+)", self.api.job_log(job_id))
        except JobNotFound:  # still waiting in its queue
            return None
        return float(found.group(1)) if found else None

    def wait_for(self, job_id: str, word: str) -> float:
        """Poll the job's log until it printed ``bench-job WORD``."""
        while (value := self.moment(job_id, word)) is None:
            time.sleep(0.2)
        return value

    def wait_ended(self, job_id: str) -> None:
        """Poll until the job is no longer PENDING or RUNNING."""
        from runner.errors import JobNotFound

        while True:
            try:
                if self.api.get_job(job_id).get("status") not in ("PENDING", "RUNNING"):
                    return
            except JobNotFound:
                pass
            time.sleep(0.2)


def submission_seconds(cli: Cli, directory: Path, pairs: int) -> tuple[list[float], list[float]]:
    """Wall seconds of ``submit --no-wait`` of one spec into the queue and not, ``pairs`` of each, alternating.

    Each job ends at once (no release flag); all have ended when this returns, so the next figure starts on a
    quiet cluster.
    """
    queued, plain, submitted = [], [], []
    for index in range(pairs):
        for side in ((True, False) if index % 2 == 0 else (False, True)):
            path = spec(directory, f"submit-{index}-{'queued' if side else 'plain'}", queued=side)
            seconds, done = timed_command([cli.command, "submit", str(path), "--no-wait"], 0, env=cli.env, cwd=REPO)
            (queued if side else plain).append(seconds)
            submitted.append(done.stdout.strip().splitlines()[-1])
    for job_id in submitted:
        cli.wait_ended(job_id)
    return queued, plain


def handover(cli: Cli, directory: Path, round_index: int, *, queued: bool) -> float:
    """Seconds from the first job's last line to the second job's first line."""
    flag = directory / f"release-{round_index}-{int(queued)}"
    first = cli.submit(spec(directory, f"first-{round_index}", queued=queued, flag=flag))
    cli.wait_for(first, "started")
    if queued:
        second = cli.submit(spec(directory, f"second-{round_index}", queued=True))
        while ClusterQueue(cli.api).place_of(second) is None:
            time.sleep(0.2)
        flag.touch()
    else:
        flag.touch()
        cli.wait_ended(first)
        second = cli.submit(spec(directory, f"second-{round_index}", queued=False))
    started = cli.wait_for(second, "started")
    ended = cli.moment(first, "ended")
    cli.wait_ended(second)
    return started - ended


def cluster_pss(token_file: str) -> float:
    """MiB of proportional set size of every process of the cluster (they carry its token file's path)."""
    total = 0
    for process in psutil.process_iter(["pid"]):
        try:
            if process.environ().get("RAY_AUTH_TOKEN_PATH") == token_file:
                total += process.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


def settled_pss(token_file: str) -> float:
    """The cluster's PSS once it has stopped changing by more than 2 MiB in a second."""
    previous = cluster_pss(token_file)
    while True:
        time.sleep(1.0)
        now = cluster_pss(token_file)
        if abs(now - previous) < 2:
            return now
        previous = now


def waiting_memory(cli: Cli, directory: Path, token_file: str, count: int, parallel: int, *, queued: bool) -> float:
    """MiB the head holds per job left waiting: in the queue behind a holder, or PENDING for CPUs.

    The jobs are left where they are: the cluster is stopped after both sides are measured.
    """
    if queued:
        holder = cli.submit(spec(directory, "holder", queued=True, flag=directory / "release-never"))
        cli.wait_for(holder, "started")
    before = settled_pss(token_file)
    # The plain jobs ask for more CPUs than the cluster has, which pre-flight would refuse: Ray is to hold them.
    specs = [spec(directory, f"waiting-{'queued' if queued else 'pending'}-{index}", queued=queued,
                  cpus=None if queued else 64) for index in range(count)]
    with ThreadPoolExecutor(parallel) as pool:
        waiting = list(pool.map(lambda path: cli.submit(path, *([] if queued else ["--no-preflight"])), specs))
    if queued:
        while len((json.loads(cli.run("queue", QUEUE, "--output", "json"))[0]).get("waiting") or []) < count:
            time.sleep(0.5)
    assert len(set(waiting)) == count
    after = settled_pss(token_file)
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="handovers on each side (medians are reported)")
    parser.add_argument("--waiting", type=int, default=200, help="jobs left waiting for the memory figure")
    parser.add_argument("--parallel", type=int, default=8, help="submissions at once for the memory figure")
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    result = Result("queue_admission", "A cluster queue: handover and memory",
                    ["figure", "queue", "baseline", "ratio (min–max)"], [], stamp)
    with tempfile.TemporaryDirectory(prefix="rayjobs-queue-bench-") as scratch:
        directory = Path(scratch)
        (directory / "code").mkdir()
        (directory / "code" / "holder.py").write_text(HOLDER)
        os.environ["RAYJOBS_HOME"] = str(directory / "home")
        cluster = start_local_cluster(name="bench-queue", num_cpus=2)
        try:
            cli = Cli(directory / "home")
            cli.run("queue", "set", QUEUE, "--max-running", "1", "--cluster", "bench-queue")
            os.environ["RAYJOBS_CLUSTER"] = cli.env["RAYJOBS_CLUSTER"] = "bench-queue"
            cli.connect("bench-queue")
            handover(cli, directory, -1, queued=True)  # warm-up: the cluster's first jobs, the page cache
            submit_queued, submit_plain = submission_seconds(cli, directory, 3 * args.rounds)
            queued, plain = [], []
            for index in range(args.rounds):
                # Alternating which side goes first, so neither always meets the cluster right after the other.
                for side in ((True, False) if index % 2 == 0 else (False, True)):
                    (queued if side else plain).append(handover(cli, directory, index, queued=side))
                print(f"round {index + 1}: queue {queued[-1]:.2f}s, submit after the end {plain[-1]:.2f}s", flush=True)
            memory_queued = waiting_memory(cli, directory, cluster.token_file, args.waiting, args.parallel, queued=True)
            memory_pending = waiting_memory(cli, directory, cluster.token_file, args.waiting, args.parallel,
                                            queued=False)
        finally:
            stop_local_cluster("bench-queue")
    ours = result.figure("submit queued", Spread.of(submit_queued), "s")
    baseline = result.figure("submit plain", Spread.of(submit_plain), "s")
    ratios = Spread.ratio(submit_queued, submit_plain)
    result.rows.append(["`rayjobs submit --no-wait`, from the command to its end", f"{ours.text(2, ' s')}",
                        f"{baseline.text(2, ' s')} (the same spec without `queue:`)",
                        f"**{ratios.median:.2f}×** ({ratios.low:.2f}–{ratios.high:.2f})"])
    ours = result.figure("handover queued", Spread.of(queued), "s")
    baseline = result.figure("handover submit after the end", Spread.of(plain), "s")
    ratios = Spread.ratio(queued, plain)
    result.rows.append(["from a slot freeing to the next job's first line", f"{ours.text(2, ' s')}",
                        f"{baseline.text(2, ' s')} (a submitter that waits, then submits)",
                        f"**{ratios.median:.2f}×** ({ratios.low:.2f}–{ratios.high:.2f})"])
    result.figures["memory per waiting job"] = {"unit": "MiB", "queued": memory_queued, "pending": memory_pending}
    result.rows.append([f"the cluster's memory (PSS) per waiting job, {args.waiting} waiting",
                        f"{memory_queued:.2f} MiB", f"{memory_pending:.2f} MiB (a plain Ray job left PENDING)",
                        f"{memory_queued / memory_pending:.1f}×" if memory_pending > 1 else "–"])
    result.figures["waiting jobs"] = args.waiting
    print("\n".join(" | ".join(row) for row in result.rows), flush=True)
    result.save(args.json)


if __name__ == "__main__":
    main()
