"""A queue on the session cluster, its real keeper and its real key-value store.

Six jobs go into a queue limited to two, with mixed priorities: two hold the slots until the test lets
them go, four wait behind them (one submitted by a process killed right after submitting). Then: the
waiting jobs cost no process (they are entries in the store, not Ray jobs), never more than two ran
at once (from the moments the queue let each job in and the end times the jobs printed themselves),
the waiting ones were let in by priority, then submission, and one stopped while it waited reads
STOPPED without ever running. Beside it: claimers in separate processes race for one slot through the
real store with pauses between each read and write, a slot held by a job Ray no longer knows frees
itself, and a queued job whose entrypoint asks for the cluster's CPUs runs.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import re
import signal
import time
from pathlib import Path

from runner.client.queue import ClusterQueue
from rayjobs_agent.vocabulary import decode as parse_event
from runner.local import loopback_env
from tests.support.cli import direct_api, popen_rayjobs
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from rayjobs_agent import queueing as q
from rayjobs_agent.queue import store as qs

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


def _spec(directory: Path, name: str, priority: int, release_flag: str | None = None, queue: str = QUEUE,
          extra: str = "needs: {CPU: 0}\n") -> Path:
    env = f"  env_vars:\n    RELEASE_FLAG: '{release_flag}'\n" if release_flag else ""
    spec = directory / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python times.py\nqueue: {queue}\npriority: {priority}\n"
                    f"{extra}record_path: {directory / 'records'}\n"
                    f"runtime_env:\n  working_dir: {directory / 'code'}\n{env}")
    return spec


def _submitted_id(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _queue(rayjobs_cli, name: str = QUEUE) -> dict:
    shown = rayjobs_cli("queue", name, "--output", "json")
    assert shown.returncode == 0, shown.stderr
    (queue,) = json.loads(shown.stdout)
    return queue


def _admitted_at(log: str) -> float | None:
    """When the queue let the job in: the keeper's moment of admission (the head's clock), as its wrapper's
    ``admitted`` event carries it. (Two jobs let in at once may have their wrappers start in either order.)"""
    for line in log.splitlines():
        event = parse_event(line) if q.ANSWER_MARKER not in line else None
        if event is not None and event.get("event") == "queue" and event.get("state") == "admitted":
            return float(event["admitted_at"])
    return None


def _times(cluster, job_id: str) -> tuple[float, float]:
    """When the queue let the job in and when its entrypoint said it ended.

    The admission, not the entrypoint's own first line, orders the starts: a Python process that takes
    longer to start on a loaded machine must not read as a job let in later.
    """
    log = direct_api(cluster).job_log(job_id)
    admitted, ended = _admitted_at(log), re.search(r"queued-job ended ([\d.]+)", log)
    assert admitted is not None and "queued-job started" in log and ended, log
    return admitted, float(ended.group(1))


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
    wait_for_condition(lambda: all(api.job_log(job, 200).count("queued-job started") == 1 for job in blockers
                                   if _ray_has(api, job)) and all(_ray_has(api, job) for job in blockers),
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
    queue_view = ClusterQueue(api)
    # Placed, not only being entered: a job whose order the keeper has not read yet has no position, and the
    # positions of those behind it are not final.
    wait_for_condition(lambda: all((queue_view.place_of(job_id) or {}).get("position") for job_id in ids.values()),
                       timeout_s=HANG_GUARD_S, interval_s=1)
    # Waiting costs no Ray job: none of the four is in Ray's table, so none has a supervisor or a wrapper.
    assert not [job_id for job_id in ids.values() if _ray_has(api, job_id)]

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
    wait_for_condition(lambda: all(_ray_has(api, job_id) and api.get_job(job_id)["status"] in ("SUCCEEDED", "STOPPED")
                                   for job_id in everyone), timeout_s=HANG_GUARD_S, interval_s=1)
    assert json.loads(rayjobs_cli("status", ids["w-doomed"], "--output", "json").stdout)["status"] == "STOPPED"
    doomed_log = rayjobs_cli("logs", ids["w-doomed"]).stdout
    assert "queued-job started" not in doomed_log, "it never ran"
    assert f"stopped while it waited in queue {QUEUE}" in doomed_log

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
    wait_for_condition(lambda: _queue(rayjobs_cli)["running"] == [], timeout_s=HANG_GUARD_S, interval_s=1)
    assert _queue(rayjobs_cli) == {"queue": QUEUE, "max_running": 2, "running": [], "waiting": []}


def _ray_has(api, job_id: str) -> bool:
    from runner.errors import JobNotFound

    try:
        api.get_job(job_id)
        return True
    except JobNotFound:
        return False


def _claimer(address: str, environ: dict[str, str], name: str, seed: int, rounds: int, barrier, intervals) -> None:
    """One contender for the queue's one slot, in a process of its own, on the cluster's store."""
    import os

    os.environ.update(environ)  # the cluster's token, before Ray is imported
    store = qs.GcsKeyValue(address)
    rng = random.Random(seed)
    pause = lambda: time.sleep(rng.uniform(0, 0.004))  # noqa: E731 - between each read and write
    for turn in range(rounds):
        barrier.wait()
        job = f"{name}-{turn}"
        slot_map = qs.slots(store, "race-q", time.time())
        slot = qs.free_slot(slot_map, 1)
        pause()
        if slot is None:
            continue
        generation = qs.claim(store, "race-q", slot, {"id": job, "since": time.time()}, pause=pause)
        if generation is None:
            continue
        held_from = time.monotonic()
        time.sleep(rng.uniform(0, 0.01))
        intervals.append((held_from, time.monotonic(), job))
        qs.release(store, "race-q", slot.index, generation)


def _put(address: str, environ: dict[str, str], key: str, value: str) -> None:
    """Write one key of the queue's store, from a process that has the cluster's token before Ray is imported."""
    import os

    os.environ.update(environ)
    qs.GcsKeyValue(address).put(key, value.encode())


def test_claimers_racing_for_the_last_slot_through_the_clusters_store_never_both_hold_it(ray_cluster):
    contenders, rounds = 6, 25
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier, intervals = manager.Barrier(contenders), manager.list()
        processes = [context.Process(target=_claimer, args=(ray_cluster.gcs_address, loopback_env(ray_cluster),
                                                            f"claimer-{index}", index, rounds, barrier, intervals))
                     for index in range(contenders)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(HANG_GUARD_S)
            assert process.exitcode == 0
        held = sorted(intervals)
    assert len(held) >= rounds, held  # the slot changed hands through every round
    overlapping = [(first, second) for index, first in enumerate(held) for second in held[index + 1:]
                   if second[0] < first[1]]
    assert overlapping == []


def test_a_slot_held_by_a_job_ray_no_longer_knows_frees_itself(rayjobs_cli, ray_cluster, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(TIMES)
    assert rayjobs_cli("queue", "set", "orphan-q", "--max-running", "1").returncode == 0
    # A holder whose job was deleted from Ray's table after its wrapper was SIGKILLed: no done marker, no job info.
    holder = {"id": "raysubmit_deleted", "since": time.time() - qs.UNKNOWN_HOLDER_GRACE_S - 1, "needs": {}}
    writer = multiprocessing.get_context("spawn").Process(
        target=_put, args=(ray_cluster.gcs_address, loopback_env(ray_cluster), "slot/orphan-q/0/0", json.dumps(holder)))
    writer.start()
    writer.join(HANG_GUARD_S)
    assert writer.exitcode == 0
    result = rayjobs_cli("submit", str(_spec(tmp_path, "after-orphan", 0, queue="orphan-q")))
    assert result.returncode == 0, result.stderr
    assert "queued-job ended" in result.stdout


def test_a_queued_job_whose_entrypoint_asks_for_the_clusters_cpus_runs(rayjobs_cli, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(TIMES)
    spec = _spec(tmp_path, "entrypoint-cpus", 0, queue="cpu-q", extra="entrypoint_num_cpus: 2\n")
    result = rayjobs_cli("submit", str(spec))
    assert result.returncode == 0, result.stderr
    assert "queued-job ended" in result.stdout and "SUCCEEDED" in result.stderr


def test_a_queued_job_the_whole_cluster_cannot_hold_is_refused_at_submit(rayjobs_cli, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(TIMES)
    spec = _spec(tmp_path, "too-big", 0, extra="needs: {CPU: 64}\n")
    refused = rayjobs_cli("submit", str(spec), "--no-wait")
    assert refused.returncode == 2, refused.stderr
    assert "needs CPU 64" in refused.stderr and "have CPU 2 in all" in refused.stderr, refused.stderr
    assert f"wait in queue {QUEUE} forever" in refused.stderr


LATE_PLACER = """
import os, pathlib, time
import ray
print(f"queued-job started {time.time():.3f}", flush=True)
time.sleep(float(os.environ.get("PLACE_AFTER_S", "0")))  # a long environment set-up, imports, data download
ray.init()
group = ray.util.placement_group([{"CPU": float(os.environ["PLACE_CPUS"])}])
ray.get(group.ready())
print(f"placed {time.time():.3f}", flush=True)
flag = os.environ.get("RELEASE_FLAG")
while flag and not pathlib.Path(flag).exists():
    time.sleep(0.05)
print(f"queued-job ended {time.time():.3f}", flush=True)
"""


def test_what_a_job_let_in_declared_stays_its_own_however_late_it_places_it(rayjobs_cli, ray_cluster, tmp_path):
    """The session cluster has 2 CPUs. A job that declares both and places them 15 s after it starts (longer than
    any grace) keeps the job behind it waiting the whole time, before and after it placed them; the next starts
    once it has ended."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "times.py").write_text(LATE_PLACER)
    flag = tmp_path / "release"
    queue = "late-q"
    assert rayjobs_cli("queue", "set", queue, "--max-running", "2").returncode == 0

    def spec(name: str, cpus: int, place_after_s: int) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nentrypoint: python times.py\nqueue: {queue}\nneeds: {{CPU: {cpus}}}\n"
                        f"record: false\nruntime_env:\n  working_dir: {tmp_path / 'code'}\n  env_vars:\n"
                        f"    RELEASE_FLAG: '{flag}'\n    PLACE_CPUS: '{cpus}'\n    PLACE_AFTER_S: '{place_after_s}'\n")
        return str(path)

    first = _submitted_id(rayjobs_cli("submit", spec("late-placer", 2, 15), "--no-wait"))
    second = _submitted_id(rayjobs_cli("submit", spec("behind-it", 1, 0), "--no-wait"))
    api = direct_api(ray_cluster)
    wait_for_condition(lambda: "placed" in api.job_log(first, 50), timeout_s=HANG_GUARD_S, interval_s=1)
    time.sleep(3)  # a few of the keeper's steps with the 2 CPUs placed: the second job still waits
    assert not _ray_has(api, second)
    assert "needs 1 CPU, 0 free" in (ClusterQueue(api).place_of(second) or {}).get("reason", "")
    flag.touch()
    wait_for_condition(lambda: _ray_has(api, second) and api.get_job(second)["status"] == "SUCCEEDED",
                       timeout_s=HANG_GUARD_S, interval_s=1)
    first_ended = float(re.search(r"queued-job ended ([\d.]+)", api.job_log(first)).group(1))
    assert _admitted_at(api.job_log(second)) >= first_ended - 1.0  # the head's clock and the job's, one machine
