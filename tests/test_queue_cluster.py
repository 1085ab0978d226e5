"""A queue on the session cluster: six jobs into a queue limited to two, mixed priorities.

Two jobs hold the queue's slots until the test lets them go; four more wait behind them, one of them
submitted by a process killed right after submitting. Then: never more than two ran at once (from
the moments the queue let each job in and the end times the jobs printed themselves), the three left
waiting were let in by priority, then submission (a low one submitted first goes last; of two equal
ones, the first goes first), and a job stopped while it waited left the queue. Every job costs the
cluster a driver and a worker process, so there are no more of them than these checks need, and
waits poll in this process.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from runner.cli.queue import queue_state_from_log, with_queue_place
from tests.support.cli import direct_api, popen_rayjobs
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

QUEUE = "suite-q"
TIMES = """
import os, pathlib, time
print(f"queued-job started {time.time():.3f}", flush=True)
flag = os.environ.get("RELEASE_FLAG")
while flag and not pathlib.Path(flag).exists():
    time.sleep(0.05)
time.sleep(0.3)
print(f"queued-job ended {time.time():.3f}", flush=True)
"""


def _spec(directory: Path, name: str, priority: int, release_flag: str | None = None) -> Path:
    env = f"  env_vars:\n    RELEASE_FLAG: '{release_flag}'\n" if release_flag else ""
    spec = directory / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python times.py\nqueue: {QUEUE}\npriority: {priority}\n"
                    f"needs: {{CPU: 0}}\nrecord_path: {directory / 'records'}\n"
                    f"runtime_env:\n  working_dir: {directory / 'code'}\n{env}")
    return spec


def _submitted_id(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _queue(rayjobs_cli) -> dict:
    shown = rayjobs_cli("queue", QUEUE, "--output", "json")
    assert shown.returncode == 0, shown.stderr
    (queue,) = json.loads(shown.stdout)
    return queue


def _jobs_seen_here(cluster, ids: list[str]) -> dict[str, dict]:
    """What `rayjobs list` shows of each job (`queue` while it waits), read by the same code in this process."""
    api = direct_api(cluster)
    return {job_id: with_queue_place(api, api.get_job(job_id)) for job_id in ids}


def _times(cluster, job_id: str) -> tuple[float, float]:
    """When the queue let the job in (its keeper's ``admitted`` event) and when its entrypoint said it ended.

    The admission, not the entrypoint's own first line, orders the starts: a Python process that takes
    longer to start on a loaded machine must not read as a job let in later.
    """
    log = direct_api(cluster).job_log(job_id)
    admitted = queue_state_from_log(log)
    ended = re.search(r"queued-job ended ([\d.]+)", log)
    assert admitted and admitted["state"] == "admitted" and "queued-job started" in log and ended, log
    return float(admitted["time"]), float(ended.group(1))


def test_six_jobs_in_a_queue_of_two_run_two_at_a_time_by_priority_then_time(rayjobs_cli, ray_cluster,
                                                                           ray_cluster_home, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(TIMES)
    flag = tmp_path / "release"
    limited = rayjobs_cli("queue", "set", QUEUE, "--max-running", "2")
    assert limited.returncode == 0, limited.stderr
    assert f"queue {QUEUE}: 0 of 2 running" in limited.stdout, limited.stdout

    blockers = [_submitted_id(rayjobs_cli("submit", str(_spec(tmp_path, f"hold-{index}", 0, str(flag))), "--no-wait"))
                for index in range(2)]
    api = direct_api(ray_cluster)
    wait_for_condition(lambda: [job.get("status") for job in _jobs_seen_here(ray_cluster, blockers).values()]
                       == ["RUNNING"] * 2 and api.job_log(blockers[1], 200).count("queued-job started") == 1,
                       timeout_s=HANG_GUARD_S, interval_s=1)

    # (name, priority) in submission order; expected start order: priority first, then submission.
    waiting = [("w-low-1", 0), ("w-high-1", 5), ("w-high-2", 5), ("w-doomed", 9)]
    ids: dict[str, str] = {}
    for name, priority in waiting:
        spec = str(_spec(tmp_path, name, priority))
        if name == "w-high-2":
            # Its submitter dies right after submitting: the job is the cluster's, not the submitter's.
            follower = popen_rayjobs("submit", spec, home=ray_cluster_home)
            line = ""
            while "submitted" not in line:
                line = follower.stderr.readline()
                assert line, "the submitter ended before it submitted"
            follower.send_signal(signal.SIGKILL)
            follower.wait(timeout=HANG_GUARD_S)
            ids[name] = re.search(r"as (\S+) to", line).group(1)
        else:
            ids[name] = _submitted_id(rayjobs_cli("submit", spec, "--no-wait"))
    wait_for_condition(lambda: sum("queue" in job for job in _jobs_seen_here(ray_cluster, list(ids.values())).values())
                       == len(waiting),
                       timeout_s=HANG_GUARD_S, interval_s=1)

    status = rayjobs_cli("status", ids["w-low-1"])
    assert status.returncode == 0, status.stderr
    assert f"QUEUED: position 4 in queue {QUEUE}" in status.stdout, status.stdout
    listed = rayjobs_cli("list")
    assert re.search(rf"{ids['w-doomed']}\s+QUEUED \(1\)", listed.stdout), listed.stdout
    stopped = rayjobs_cli("stop", ids["w-doomed"], "--wait")
    assert stopped.returncode == 0, stopped.stderr
    queue = _queue(rayjobs_cli)
    assert sorted(job["id"] for job in queue["running"]) == sorted(blockers), queue
    assert [job["id"] for job in queue["waiting"]] == \
        [ids[name] for name in ("w-high-1", "w-high-2", "w-low-1")], queue

    flag.touch()
    everyone = [*blockers, *ids.values()]
    wait_for_condition(lambda: all(api.get_job(job_id)["status"] in ("SUCCEEDED", "STOPPED") for job_id in everyone),
                       timeout_s=HANG_GUARD_S, interval_s=1)
    assert json.loads(rayjobs_cli("status", ids["w-doomed"], "--output", "json").stdout)["status"] == "STOPPED"
    assert "queued-job started" not in rayjobs_cli("logs", ids["w-doomed"]).stdout, "it never ran"

    ran = {name: _times(ray_cluster, job_id) for name, job_id in [*zip(("hold-0", "hold-1"), blockers), *ids.items()]
           if name != "w-doomed"}
    moments = sorted([(start, 1) for start, _ in ran.values()] + [(end, -1) for _, end in ran.values()])
    running, most = 0, 0
    for _, change in moments:
        running += change
        most = max(most, running)
    assert most == 2, ran
    started_in = sorted((start, name) for name, (start, _) in ran.items() if name.startswith("w-"))
    assert [name for _, name in started_in] == ["w-high-1", "w-high-2", "w-low-1"]
    assert _queue(rayjobs_cli) == {"queue": QUEUE, "max_running": 2, "running": [], "waiting": []}


def test_a_queued_job_the_whole_cluster_cannot_hold_is_refused_at_submit(rayjobs_cli, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(TIMES)
    spec = _spec(tmp_path, "too-big", 0)
    spec.write_text(spec.read_text().replace("needs: {CPU: 0}", "needs: {CPU: 64}"))
    refused = rayjobs_cli("submit", str(spec), "--no-wait")
    assert refused.returncode == 2, refused.stderr
    assert "needs CPU 64" in refused.stderr and "have CPU 2 in all" in refused.stderr, refused.stderr
    assert f"wait in queue {QUEUE} forever" in refused.stderr
