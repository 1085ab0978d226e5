"""The agent's watch (``rayjobs_agent.watch``): a wait for resources and a stall, each decided once from the
job's log as it grows; Ray's own lines, progress bars and the agent's own words are no sign of the job's life.
Then the same decisions made by the wrapper on a real entrypoint, said as events in its log."""

from __future__ import annotations

import pytest

import json
import os
import signal
import time

from rayjobs_agent.vocabulary import EVENT_MARKER, decode
from rayjobs_agent.watch import STALL_FLOOR_S, JobWatch, StallDecision, WaitDecision, stall_limit_s
from rayjobs_agent.wire import NOTIFY_ENV_VAR, WATCH_ENV_VAR
from tests.support.notify_receivers import webhook_receiver
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.test_record import config_for, keeper_env, python_command, run_keeper

# Copied from a real run (Ray 2.60): a Ray Dataset fed to a TorchTrainer whose 2 workers hold both CPUs of a
# 2-CPU cluster. The split coordinator's warning, then its progress bar repainted every second.
STARVED = ("(SplitCoordinator pid=16481) Cluster resources are not enough to run any task from "
           "TaskPoolMapOperator[ReadRange->MapBatches(<lambda>)]. The job may hang forever unless the cluster "
           "scales up.")
DATA_BAR = ("(pid=16481) Running Dataset: train_0355A5qHJBBam2vYWiegeO_0. Active & requested resources: 1/0 CPU, "
            "0.0B/3.5GiB object store: : 0.00 row [01:07, ? row/s]")
DATA_OPERATOR = ("(pid=16481) - ReadRange->MapBatches(<lambda>): Tasks: 1 [backpressured:tasks(ResourceBudget)]; "
                 "Actors: 0; Queued blocks: 3 (0.0B); Resources: 1.0 CPU, 0.0B object store: 0% 0/1")
RAY_CORE = ("(TrainController pid=16174) [2026-11-28 01:32:30,997 E 16174 16204] core_worker.cc:2465: Actor with "
            "class name: 'PreemptionWatcher' has constructor arguments in the object store")


def _event(kind: str, **fields: object) -> str:
    return f"(TrainController pid=1) {EVENT_MARKER} " + json.dumps({"event": kind, "time": 0, **fields})


def _training(watch: JobWatch, now: float) -> None:
    watch.line(_event("train_start", workers=2, use_gpu=False, resources_per_worker={"CPU": 1.0}), now)
    watch.line(_event("attempt", attempt=1, workers=[{}, {}], nodes=1, cluster={"nodes": 1, "cpus": 2, "gpus": 0}),
               now)


def test_a_silence_past_the_limit_is_one_stall_and_speaking_again_ends_it():
    watch = JobWatch(60.0, 0.0)
    watch.line("epoch 1 of the job's own", 10.0)
    assert watch.decide(69.0) is None
    stall = watch.decide(70.0)
    assert stall == StallDecision(60.0, 60.0)
    assert watch.decide(500.0) is None  # said once per silence
    watch.line("the job's own line again", 501.0)
    assert watch.decide(561.0) == StallDecision(60.0, 60.0)


def test_rays_lines_progress_bars_and_the_agents_own_words_are_no_sign_of_life():
    watch = JobWatch(60.0, 0.0)
    for second, line in enumerate([RAY_CORE, DATA_BAR, DATA_OPERATOR, "step 3/10\r step 4/10",
                                   _event("resources", cpu=1.9, cpus=2, rss_bytes=1 << 30),
                                   _event("cause", cause="unknown"), _event("stall", silent_s=1)], start=1):
        watch.line(line, float(second * 10))
    assert isinstance(watch.decide(70.0), StallDecision)
    # The agent reads its own words on the stall back from the log: the silence goes on, and is not said again.
    watch.line("rayjobs: the job has printed nothing of its own and reported no progress for 60s (stall limit 60s); "
               "it is left running", 71.0)
    assert watch.decide(200.0) is None


def test_without_stall_after_s_the_limit_follows_the_pace_of_reports():
    assert stall_limit_s(None, None) == STALL_FLOOR_S
    assert stall_limit_s(None, 400.0) == 1200.0 and stall_limit_s(30.0, 400.0) == 30.0
    watch = JobWatch(None, 0.0)
    watch.line(_event("report", iteration=1), 0.0)
    watch.line(_event("report", iteration=2), 500.0)
    assert watch.limit_s() == 1500.0
    assert watch.decide(1999.0) is None and isinstance(watch.decide(2000.0), StallDecision)


def test_ray_datas_starved_tasks_are_a_wait_named_with_the_training_workers_that_hold_the_cpus():
    watch = JobWatch(60.0, 0.0)
    _training(watch, 1.0)
    watch.line(STARVED, 5.0)
    wait = watch.decide(5.0)
    assert isinstance(wait, WaitDecision)
    assert wait.text == ("waiting for resources: Ray Data's tasks of ReadRange->MapBatches(<lambda>) cannot start "
                         "(each needs a CPU by default), and the 2 training workers hold all 2 CPUs")
    assert "fewer training workers" in wait.advice and wait.evidence.startswith("Cluster resources are not enough")
    for second in range(6, 200):
        watch.line(DATA_BAR, float(second))
        watch.line(STARVED, float(second))
        assert watch.decide(float(second)) is None, "said once, and a wait is never called a stall"
    watch.line(_event("report", iteration=1), 200.0)
    assert watch.waiting is None


def test_rays_own_wait_lines_are_named_with_the_clusters_size():
    watch = JobWatch(60.0, 0.0)
    _training(watch, 0.0)
    watch.line("(autoscaler +3s) Error: No available node types can fulfill resource request {'CPU': 3.0}. Add "
               "suitable node types to this cluster to resolve this issue.", 3.0)
    wait = watch.decide(3.0)
    assert isinstance(wait, WaitDecision) and wait.text == ("waiting for resources: 3 CPUs for one task or actor, "
                                                            "2 on the cluster")


def test_a_demand_the_cluster_has_pending_is_the_wait_of_a_quiet_job():
    watch = JobWatch(60.0, 0.0)
    watch.demand_pending({"CPU": 4.0}, "a placement group", {"CPU": 2.0})
    wait = watch.decide(50.0)
    assert isinstance(wait, WaitDecision)
    assert wait.text == "waiting for resources: 4 CPUs for a placement group, 2 on the cluster"


@pytest.mark.processes
def test_the_wrapper_says_a_stall_once_as_an_event_and_a_notification_and_leaves_the_job_running(tmp_path):
    log, marker = tmp_path / "log", tmp_path / "go-on"
    job = python_command(f"""
        import pathlib, time
        print("started", flush=True)
        while not pathlib.Path({str(marker)!r}).exists():
            time.sleep(0.1)
        print("went on", flush=True)
    """)
    with webhook_receiver() as hook:
        environ = keeper_env(config_for(tmp_path / "run"))
        environ[WATCH_ENV_VAR] = json.dumps({"stall_after_s": 2})
        environ[NOTIFY_ENV_VAR] = json.dumps({"targets": [{"url": hook.url(), "on": ["stalled"]}]})
        keeper = run_keeper(job, log, environ)
        wait_for_condition(lambda: hook.received, timeout_s=HANG_GUARD_S)
        # The silence goes on past two more limits after the stall was said: it is still one stall.
        time.sleep(5)
        marker.write_text("")
        assert keeper.wait(timeout=HANG_GUARD_S) == 0
    text = log.read_text()
    stalls = [event for line in text.splitlines() if (event := decode(line)) and event["event"] == "stall"]
    assert len(stalls) == 1 and stalls[0]["limit_s"] == 2 and stalls[0]["silent_s"] >= 2
    assert "it is left running" in text and "went on" in text
    assert hook.received[0][1]["title"] == "rayjobs: rec stalled"


@pytest.mark.processes
def test_the_wrapper_names_ray_datas_starved_tasks_from_the_log_as_it_is_written(tmp_path):
    log = tmp_path / "log"
    lines = [_training_line for _training_line in (
        _event("train_start", workers=2, use_gpu=False, resources_per_worker={"CPU": 1.0}),
        _event("attempt", attempt=1, workers=[{}, {}], nodes=1, cluster={"nodes": 1, "cpus": 2, "gpus": 0}),
        STARVED)]
    job = python_command(f"""
        import time
        for line in {lines!r}:
            print(line, flush=True)
        for _ in range(600):
            print({DATA_BAR!r}, flush=True)
            time.sleep(0.1)
    """)
    keeper = run_keeper(job, log, keeper_env(config_for(tmp_path / "run")))
    wait_for_condition(lambda: '"event":"wait"' in log.read_text(), timeout_s=HANG_GUARD_S)
    os.killpg(keeper.pid, signal.SIGTERM)  # Ray's stop, to the job's process group
    keeper.wait(timeout=HANG_GUARD_S)
    [wait] = [event for line in log.read_text().splitlines() if (event := decode(line)) and event["event"] == "wait"]
    assert "the 2 training workers hold all 2 CPUs" in wait["text"]
    assert f"rayjobs: {wait['text']}. Leave a CPU to Ray Data" in log.read_text()


@pytest.mark.processes
def test_an_event_the_watch_chokes_on_stops_the_watch_once_and_a_failure_after_it_is_still_named(tmp_path):
    # Hostile input from the job's own output: a train_start event whose resources are no mapping. The watch
    # stops and says so once; the job runs on, and its failure is still named with its own exit code.
    log = tmp_path / "log"
    bad = f"{EVENT_MARKER} " + json.dumps({"event": "train_start", "time": 0, "workers": 2,
                                           "resources_per_worker": "x"})
    job = python_command(f"""
        import time
        print({bad!r}, flush=True)
        time.sleep(2.5)
        print("went on", flush=True)
        print({bad!r}, flush=True)
        raise SystemExit(3)
    """)
    environ = keeper_env(config_for(tmp_path / "run"))
    environ[WATCH_ENV_VAR] = json.dumps({"stall_after_s": 60})
    keeper = run_keeper(job, log, environ)
    assert keeper.wait(timeout=HANG_GUARD_S) == 3
    text = log.read_text()
    assert text.count("rayjobs: the watch over the job stopped (") == 1 and "went on" in text
    assert "Traceback" not in text
    [cause] = [event for line in text.splitlines() if (event := decode(line)) and event["event"] == "cause"]
    assert cause["exit_code"] == 3
