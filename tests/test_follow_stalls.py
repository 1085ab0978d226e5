"""A stalled job, told in one line per process: Ray's chatter is no sign of life, and where each rank is comes
from py-spy reading a real process (or a real Ray Train job's dumps, kept in tests/data/stacks).
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runner.follow.stacks import ProcessStack, _library_call, where_in_own_code
from runner.run.stall import StallRule
from tests.test_follow_signals import LocalCluster, forwarded, ray_log_line, train_v1_waiting, watch_of


def test_rays_own_chatter_does_not_keep_a_deadlocked_job_from_being_called_stalled():
    """Ray Train's PlacementGroupCleaner warns every few seconds when a second Ray instance runs on the host."""
    from runner.follow.follower import Follower

    watch, _, _ = watch_of(LocalCluster([]), stall_after_s=0.0)
    stalls: list[float] = []
    follower = Follower(LocalCluster([]), "raysubmit_x", logs_out=watch.view, notes=io.StringIO(),
                        new_stall=watch.new_stall, on_stall=lambda silent, info: stalls.append(silent))
    cleaner = forwarded([ray_log_line(logging.WARNING, "_private/services.py", 443,
                                      "Found multiple active Ray instances: {'127.0.0.1:6379', '127.0.0.1:6380'}. "
                                      "Connecting to latest cluster at 127.0.0.1:6380. You can override this by "
                                      "setting the `--address` flag or `RAY_ADDRESS` environment variable.")],
                        4711, "PlacementGroupCleaner")
    asyncio.run(follower._watch_for_a_stall({}))
    for _ in range(3):
        follower.cursor.feed(cleaner.encode(), follower.cursor.written)
        asyncio.run(follower._watch_for_a_stall({}))
    assert len(stalls) == 1, "one hang, one warning, however much Ray talks"
    follower.cursor.feed(b"(RayTrainWorker pid=12) the job's own line\n", follower.cursor.written)
    asyncio.run(follower._watch_for_a_stall({}))
    assert len(stalls) == 2, "the job moved, so a later silence is a new stall"


DEADLOCK = textwrap.dedent("""\
    import sys
    import threading
    import concurrent.futures

    def wait_forever(lock):
        lock.acquire()
        lock.acquire()

    def loop():
        lock = threading.Lock()
        print("ready", flush=True)
        wait_forever(lock)

    def report(result):
        return result.result()

    threading.Thread(target=lambda: threading.Event().wait(), name="gc-idle", daemon=True).start()
    if sys.argv[1] == "0":
        print("ready", flush=True)
        report(concurrent.futures.Future())
    loop()
""")


def dump_of(script: Path, rank: int) -> str:
    """py-spy's dump of a real process of ``script`` blocked where it blocks; skips where py-spy may not read it."""
    py_spy = Path(sys.executable).with_name("py-spy")
    process = subprocess.Popen([sys.executable, str(script), str(rank)], stdout=subprocess.PIPE, text=True)
    blocked_at = "deadlock.py:15" if rank == 0 else "deadlock.py:7"
    try:
        assert process.stdout.readline().strip() == "ready"
        for _ in range(100):  # the step after "ready" is the blocking call; py-spy may catch the process before it
            done = subprocess.run([str(py_spy), "dump", "--pid", str(process.pid)], capture_output=True, text=True,
                                  timeout=60)
            if done.returncode != 0:
                pytest.skip(f"py-spy cannot read a process here: {done.stderr.strip()[:200]}")
            if blocked_at in done.stdout:
                return done.stdout
            time.sleep(0.1)
        return done.stdout
    finally:
        process.kill()
        process.wait()


def test_a_stall_is_told_in_one_line_per_process_and_the_whole_stacks_are_kept(tmp_path):
    script = tmp_path / "deadlock.py"
    script.write_text(DEADLOCK)
    dumps = {"100": dump_of(script, 0), "101": dump_of(script, 1)}
    assert "gc-idle" in dumps["101"]
    cluster = LocalCluster([], dumps)
    watch, _, notes = watch_of(cluster)
    watch.progress.workers = [{"rank": 0, "pid": "100", "node_id": "n1"}, {"rank": 1, "pid": "101", "node_id": "n1"}]

    class Connection:
        local_cluster = None

    cluster.connection = Connection()
    StallRule(cluster, "raysubmit_x", watch).on_stall(301.0, {"submission_id": "raysubmit_x"})
    said = notes.getvalue().splitlines()
    assert said[1:3] == ["rayjobs:   rank 0: waiting in concurrent.futures.Future.result (deadlock.py:15)",
                         "rayjobs:   rank 1: wait_forever (deadlock.py:7) ← loop (deadlock.py:12) ← <module> "
                         "(deadlock.py:21)"]
    assert said[0].endswith("Where each process is (the whole stacks: `rayjobs stack raysubmit_x`):")
    assert len(said) == 3 and "gc-idle" not in notes.getvalue()


def test_a_call_into_ray_train_is_named_by_its_public_name():
    import inspect

    import ray.train

    source = inspect.getsourcefile(ray.train.report)
    assert _library_call(ray.train.report.__qualname__, source) == "ray.train.report"
    dump = (f'Thread 12 (idle): "MainThread"\n    report ({source.split("site-packages/")[-1]}:1)\n'
            "    train_func (deadlock.py:17)\n")
    assert ProcessStack("rank 0 (pid 12)", dump, who="rank 0").where() == \
        "rank 0: waiting in ray.train.report (deadlock.py:17)"
    assert where_in_own_code(dump.replace("deadlock.py", "threading.py")).startswith("no frame of the job's own")




def test_a_stall_of_a_job_that_waits_for_resources_names_the_wait_instead_of_stacks():
    cluster = LocalCluster([{"CPU": 2.0}])
    watch, _, notes = watch_of(cluster)
    watch.view.write(train_v1_waiting(3.0, 2.0) + "\n")
    StallRule(cluster, "raysubmit_x", watch).on_stall(301.0, {"submission_id": "raysubmit_x"})
    assert notes.getvalue().splitlines()[-1] == (
        "rayjobs: warning: job raysubmit_x is RUNNING but has made no progress for 301s: waiting for resources: "
        "3 CPUs for the trainer and workers, 2 on the cluster; it is left running")


@pytest.mark.parametrize(("recorded", "expected"), [
    ("ray_train_v2_both_ranks_in_report.txt", ["driver: waiting in ray.train.DataParallelTrainer.fit (train.py:78)",
                                               "rank 0: waiting in ray.train.report (train.py:51)",
                                               "rank 1: waiting in ray.train.report (train.py:54)"]),
    ("ray_train_v2_rank1_hangs.txt", ["driver: waiting in ray.train.DataParallelTrainer.fit (train.py:78)",
                                      "rank 0: waiting in torch.Tensor.backward (train.py:45)",
                                      "rank 1: train_func (train.py:39)"]),
])
def test_where_each_process_of_a_real_ray_train_job_is(recorded, expected):
    """Dumps a stalled Ray Train V2 job kept in its run record (tests/data/stacks/SOURCE.md): the worker's main
    thread is Ray's loop, the training runs in a thread of its own, next to Ray's idle GC and monitor threads."""
    text = (Path(__file__).parent / "data" / "stacks" / recorded).read_text()
    processes = [part.split(" ---\n", 1) for part in text.split("--- ")[1:]]
    assert [ProcessStack(label, body, who=label.split(" (")[0]).where() for label, body in processes] == expected


def test_a_job_without_the_agent_is_silent_only_from_when_it_starts_to_run():
    # A job that waited its turn for minutes has not stalled the moment it starts.
    from runner.follow.watching import FollowedJob

    watch = FollowedJob(LocalCluster([]), "raysubmit_x", io.StringIO(), io.StringIO(), raw=False, live=False,
                  stream_logs=True, stall_after_s=60.0)
    watch.job_info({"entrypoint": "python train.py", "status": "PENDING"})
    watch.judge.last_life -= 600.0
    watch.job_info({"entrypoint": "python train.py", "status": "RUNNING"})
    assert watch.new_stall() is None
    watch.judge.last_life -= 61.0
    assert watch.new_stall() is not None and watch.new_stall() is None, "one stall, said once"


def test_a_job_without_the_agent_that_moved_on_after_a_wait_is_called_stalled_when_it_hangs():
    # Once named, a wait must not turn the judge off for the rest of the job: a line of the job's own ends it. A wait
    # the cluster names for a quiet job (perhaps another job's demand) holds back no stall.
    watch, _, notes = watch_of(LocalCluster([{"CPU": 2.0}]), stall_after_s=60.0)
    watch.view.write(train_v1_waiting(3.0, 2.0) + "\n")
    assert "waiting for resources" in notes.getvalue() and watch.waiting_text() is not None
    watch.view.write("(RayTrainWorker pid=7) epoch 1 of the job's own\n")
    assert watch.waiting_text() is None
    watch.judge.last_life -= 61.0
    assert watch.new_stall() is not None

    quiet, _, _ = watch_of(LocalCluster([{"CPU": 2.0}]), stall_after_s=60.0)
    quiet.judge.demand_pending({"CPU": 4.0}, "a placement group", {"CPU": 2.0})
    quiet.judge.last_life -= 61.0
    assert quiet.new_stall() is not None, "a guess from the cluster's demand is no reason to stay silent on a hang"


def test_a_wait_is_named_after_the_lines_before_it_and_before_those_after_it():
    from runner.follow.watching import FollowedJob

    both = io.StringIO()
    watch = FollowedJob(LocalCluster([{"CPU": 2.0}]), "raysubmit_x", both, both, raw=False, live=False,
                        stream_logs=True)
    watch.job_info({"entrypoint": "python train.py", "status": "RUNNING"})
    watch.view.write(f"before the wait\n{train_v1_waiting(3.0, 2.0)}\nafter the wait\n")
    text = both.getvalue()
    assert text.index("before the wait") < text.index("rayjobs: waiting for resources") < text.index("after the wait")


def test_a_silence_judged_while_the_job_waited_its_turn_is_no_stall_once_it_runs():
    # An older Ray streams the log while the job is PENDING: nothing judged then is said once it runs.
    from runner.follow.watching import FollowedJob

    watch = FollowedJob(LocalCluster([]), "raysubmit_x", io.StringIO(), io.StringIO(), raw=False, live=False,
                        stream_logs=True, stall_after_s=60.0)
    watch.job_info({"entrypoint": "python train.py", "status": "PENDING"})
    watch.judge.last_life -= 600.0
    watch.view.write("Connecting to existing Ray cluster at address: 127.0.0.1:6379...\n")
    assert watch.new_stall() is None
    watch.job_info({"entrypoint": "python train.py", "status": "RUNNING"})
    assert watch.new_stall() is None


def test_a_line_the_judge_chokes_on_stops_the_judging_once_and_never_the_following():
    # A job without the agent may print anything, an event of its own making included: the follower shows its log
    # to the end whatever the judge makes of it, and says once that waits and stalls are no longer named.
    watch, logs, notes = watch_of(LocalCluster([]), stall_after_s=0.0)
    bad = 'rayjobs-event {"event":"train_start","t":1,"resources_per_worker":"all of them"}\n'
    watch.view.write(f"{bad}the job's own line\n{bad}and the next\n")
    watch.view.write("one more\n")
    assert watch.new_stall() is None and watch.new_stall() is None, "the judge has stopped"
    assert logs.getvalue().splitlines() == ["the job's own line", "and the next", "one more"]
    said = [line for line in notes.getvalue().splitlines() if "the watch over the job stopped" in line]
    assert len(said) == 1 and said[0].startswith("rayjobs: the watch over the job stopped (ValueError: ")


def test_events_of_the_wrong_shapes_are_skipped_once_said_and_the_log_goes_on():
    watch, logs, notes = watch_of(LocalCluster([]))
    for bad in ('{"event":"stall","t":1,"silent_s":"x"}', '{"event":"attempt","t":1,"attempt":"x","workers":5}',
                '{"event":"report","t":"x","metrics":[1]}'):
        watch.view.write(f"rayjobs-event {bad}\nthe job's own line\n")
    assert logs.getvalue().splitlines() == ["the job's own line"] * 3
    assert len([line for line in notes.getvalue().splitlines() if "could not be read and is skipped" in line]) == 1


def test_rays_repeated_wait_line_asks_the_cluster_for_its_nodes_once():
    asked = []
    cluster = LocalCluster([{"CPU": 2.0}])
    real = cluster.node_resources

    def counted():
        asked.append(1)
        return real()

    cluster.node_resources = counted
    watch, _, notes = watch_of(cluster)
    line = ("(autoscaler +3s) Error: No available node types can fulfill resource request {'CPU': 3.0}. Add "
            "suitable node types to this cluster to resolve this issue.\n")
    watch.view.write(line * 200)
    assert len(asked) == 1 and notes.getvalue().count("waiting for resources") == 1
