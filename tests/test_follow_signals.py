"""What the follower tells of a running job: errors always shown, one line per fact, resource waits named
(stalls: tests/test_follow_stalls.py).

Ray's lines are made by Ray's own code where it can run without a cluster (its log formatter, its printer
of forwarded lines, its message templates).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from runner.errors import ExitCode
from runner.follow.display import PlainProgress
from runner.follow.log_view import LogView, last_state
from rayjobs_agent.ray_lines import is_rays_own
from runner.follow.messages import summary_line
from runner.follow.progress import RunProgress
from rayjobs_agent.waits import resource_wait_in
from runner.follow.watching import FollowedJob
from rayjobs_agent import watch as agent_watch
from rayjobs_agent.watch import JobWatch
from rayjobs_agent.wire import RECORD_COMMAND


def ray_log_line(level: int, filename: str, lineno: int, message: str) -> str:
    """A line as Ray's Python loggers write it (Ray's own format string)."""
    from ray._private import ray_constants

    record = logging.LogRecord("ray", level, f"/venv/site-packages/ray/{filename}", lineno, message, None, None)
    return logging.Formatter(ray_constants.LOGGER_FORMAT).format(record)


def forwarded(lines: list[str], pid: object, actor_name: str | None = None) -> str:
    """The lines as Ray's driver prints them when another process of the job wrote them (prefix, colour)."""
    from ray._private import worker

    out = io.StringIO()
    data = {"pid": pid, "lines": lines, "ip": "127.0.0.1", "localhost": "127.0.0.1"}
    if actor_name:
        data["actor_name"] = actor_name
    worker.print_worker_logs(data, out)
    return out.getvalue()


@pytest.fixture
def autoscaler_printer(monkeypatch):
    """Ray's printer of the autoscaler's events, without the cluster it asks which autoscaler runs."""
    from ray._private import worker

    monkeypatch.setattr(worker, "filter_autoscaler_events", lambda lines: iter(lines))
    monkeypatch.setattr(worker, "time_string", lambda: "3s")
    return lambda line: forwarded([line], "autoscaler")


def infeasible_request(resources: dict) -> str:
    # ray/autoscaler/_private/autoscaler.py: the event it adds for a request no node type can take
    return ("Error: No available node types can fulfill resource request {}. Add suitable node types to this "
            "cluster to resolve this issue.".format(resources))


def train_v1_waiting(asked_cpus: float, cluster_cpus: float) -> str:
    """The warning Ray Train V1 logs each minute while its trainer and workers cannot be placed."""
    from ray.tune.execution import insufficient_resources_manager as manager

    message = ("Ignore this message if the cluster is autoscaling. " + manager.MSG_TRAIN_START.format(wait_time=60)
               + manager.MSG_TRAIN_INSUFFICIENT.format(asked_cpus=asked_cpus, asked_gpus=0,
                                                       cluster_cpus=cluster_cpus, cluster_gpus=0)
               + manager.MSG_TRAIN_END)
    return ray_log_line(logging.WARNING, "tune/execution/insufficient_resources_manager.py", 163, message)


class LocalCluster:
    """What the follower asks a cluster for here: each node's resources; a stack it cannot read."""

    def __init__(self, nodes: list[dict[str, float]], stacks: dict[str, str] | None = None) -> None:
        self.nodes = nodes
        self.stacks = stacks or {}

    def node_resources(self) -> list[dict[str, float]]:
        return self.nodes

    def process_traceback(self, pid: str, node_id: str | None = None, ip: str | None = None) -> str:
        return self.stacks[pid]

    def get_json(self, path: str) -> dict:
        assert path == "/api/cluster_status?format=1"  # the dashboard's `ray status` report
        return {"data": {"clusterStatus": self.status}}

    status = ""


def watch_of(cluster: LocalCluster, *, live: bool = False, beside_agent: bool = False,
             stall_after_s: float | None = None) -> tuple[FollowedJob, io.StringIO, io.StringIO]:
    """The follower's watch over a RUNNING job, submitted with the agent beside it or (by default) without."""
    logs, notes = io.StringIO(), io.StringIO()
    watch = FollowedJob(cluster, "raysubmit_x", logs, notes, raw=False, live=live, stream_logs=True,
                  stall_after_s=stall_after_s)
    watch.job_info({"entrypoint": f"{RECORD_COMMAND} 'python train.py'" if beside_agent else "python train.py",
                    "status": "RUNNING"})
    return watch, logs, notes


# --------------------------------------------------------------------------- errors are never chatter


def test_rays_error_lines_are_shown_and_its_other_lines_are_not():
    error = ray_log_line(logging.ERROR, "_private/worker.py", 2100, "Unhandled error (suppress with "
                         "'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::RayTrainWorker.run() (pid=12)")
    info = ray_log_line(logging.INFO, "_private/worker.py", 1778, "Connecting to existing Ray cluster at address: "
                        "127.0.0.1:6379...")
    fatal = "[2026-11-25 12:00:00,123 F 4242 4300] core_worker.cc:512: Check failed: worker != nullptr"
    core_error = "[2026-11-25 12:00:00,123 E 4242 4300] gcs_rpc_client.h:151: Failed to connect to GCS"
    core_info = "[2026-11-25 12:00:00,123 I 4242 4300] core_worker.cc:512: PreemptionWatcher started"
    log = forwarded([error, fatal], 4242, "RayTrainWorker") + info + "\n" + core_error + "\n" + core_info + "\n"
    out = io.StringIO()
    view = LogView(out, strip_ansi=True)
    view.write(log)
    view.close()
    assert out.getvalue().splitlines() == [f"(RayTrainWorker pid=4242) {error}", f"(RayTrainWorker pid=4242) {fatal}",
                                           core_error]
    judge = JobWatch(None, 0.0)
    for line in log.splitlines():
        judge.line(line, 10.0)
    assert judge.last_life == 0.0, "Ray's lines, errors included, are no sign of the job's own life"


# --------------------------------------------------------------------------- bars in a pipe


def tqdm_bar_text(total: int) -> str:
    """What Ray Data's Parquet sampling bar writes where no terminal is attached (Ray's tqdm arguments)."""
    import tqdm

    out = io.StringIO()
    bar = tqdm.tqdm(total=total, position=0, dynamic_ncols=True, unit=" file", unit_scale=True, file=out,
                    mininterval=0)
    bar.set_description("Parquet dataset sampling")
    for _ in range(total):
        bar.update(1)
    bar.close()
    return out.getvalue()


def test_a_bar_in_a_pipe_is_written_once_as_its_last_state():
    text = tqdm_bar_text(3)
    assert text.count("\r") > 2
    out = io.StringIO()
    view = LogView(out, strip_ansi=True, pipe=True)
    log = "reading the dataset\n" + text + "(TrainController pid=7) " + text.lstrip("\r") + "done\n"
    for start in range(0, len(log), 11):  # in pieces, the way a log stream delivers a bar
        view.write(log[start:start + 11])
    view.close()
    assert out.getvalue().splitlines() == ["reading the dataset", "Parquet dataset sampling: 100% 3/3",
                                           "(TrainController pid=7) Parquet dataset sampling: 100% 3/3", "done"]
    assert "\r" not in out.getvalue()
    assert last_state("10%|#    |\r20%|##   |\rfinished") == "finished"


# --------------------------------------------------------------------------- one fact, one line


def event(**fields) -> str:
    return "rayjobs-event " + json.dumps(fields)


VISION_TRAIN_LOG = [
    event(event="stage", name="train", state="start", index=2, count=3),
    event(event="train_start", epochs=3, workers=2, max_failures=0),
    # workloads/vision/training/loop.py, rank 0, then Ray Train's own line and the callback's report
    "(RayTrainWorker pid=12) epoch 1/3: train_loss 1.6660 val_loss 1.5021 val_accuracy 0.4125 (812.5 images/s, "
    "10.2s, data wait 0.3s, compute 9.1s)",
    "(RayTrainWorker pid=12) Reporting training result 1: TrainingReport(checkpoint=None, metrics={'epoch': 1}, "
    "validation_spec=None)",
    "(TrainController pid=7) " + event(event="report", time=10.0, iteration=1, epochs=3,
                                       metrics={"epoch": 1, "train_loss": 1.666, "val_loss": 1.5021,
                                                "val_accuracy": 0.4125}),
    # workloads/vision/__main__.py
    "Stage train finished in 33.3s",
    event(event="stage", name="train", state="end", index=2, count=3, seconds=33.31),
]


def test_in_a_pipe_each_epoch_and_stage_is_told_once_in_rayjobs_words():
    watch, logs, notes = watch_of(LocalCluster([{"CPU": 2.0}]))
    watch.view.write("\n".join(VISION_TRAIN_LOG) + "\n")
    watch.close()
    assert logs.getvalue() == ""
    said = notes.getvalue().splitlines()
    assert "rayjobs: stage train (2/3) finished in 33.3s" in said
    assert [line for line in said if "epoch 1/3" in line] == [
        "rayjobs: epoch 1/3 · train_loss 1.666 · val_loss 1.502 · val_accuracy 0.4125"]


def test_a_line_of_the_job_between_its_epoch_line_and_the_report_lets_the_epoch_line_out():
    out, notes = io.StringIO(), io.StringIO()
    view = LogView(out, PlainProgress(RunProgress(), notes).event, strip_ansi=True, pipe=True,
                   echoed=("stage", "report"))
    view.write("\n".join([*VISION_TRAIN_LOG[:3], "(RayTrainWorker pid=13) rank 1 is done with epoch 1",
                          VISION_TRAIN_LOG[4]]) + "\n")
    view.close()
    assert [line.split(" ", 2)[2][:9] for line in out.getvalue().splitlines()] == ["epoch 1/3", "rank 1 is"]


def test_the_live_view_keeps_the_jobs_epoch_lines_and_tells_the_stage_once():
    watch, logs, _ = watch_of(LocalCluster([]), live=True)
    try:
        watch.view.write("\n".join(VISION_TRAIN_LOG) + "\n")
    finally:
        watch.close()
    shown = logs.getvalue()
    assert "epoch 1/3: train_loss 1.6660" in shown, "the live block prints no line per epoch: the job's stays"
    assert "Stage train finished in 33.3s" not in shown and "stage train (2/3) finished in 33.3s" in shown


# --------------------------------------------------------------------------- waiting for resources


def test_a_train_v1_wait_is_named_once_with_its_numbers(autoscaler_printer):
    watch, logs, notes = watch_of(LocalCluster([{"CPU": 2.0}]))
    waiting = train_v1_waiting(3.0, 2.0)
    watch.view.write(f"{waiting}\n{autoscaler_printer(infeasible_request({'CPU': 1.0}))}"
                     f"{waiting}\n")
    said = [line for line in notes.getvalue().splitlines() if "waiting for resources" in line]
    assert said[0].startswith("rayjobs: waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster")
    assert len(said) == 2, said  # the trainer's wait, then the task the autoscaler names; each once
    assert "1 CPU for one task or actor, 2 on its largest node" in said[1]
    assert said[1].endswith("Ask for less, or add nodes: Ray keeps it waiting until they are free or the cluster grows")
    life = watch.judge.last_life
    assert logs.getvalue() == ""
    assert watch.waiting_text() == "waiting for resources: 1 CPU for one task or actor, 2 on its largest node"
    watch.view.write(event(event="attempt", attempt=1, workers=[], nodes=1) + "\n")
    assert watch.waiting_text() is None and watch.judge.last_life > life


def test_a_job_beside_the_agent_is_judged_there_and_the_follower_only_shows_what_it_said():
    watch, _, notes = watch_of(LocalCluster([{"CPU": 2.0}]), beside_agent=True, stall_after_s=0.0)
    watch.view.write(train_v1_waiting(3.0, 2.0) + "\n")
    assert notes.getvalue() == "" and watch.new_stall() is None, "the agent names waits and stalls, not the follower"
    watch.view.write(event(event="wait", text="waiting for resources: 3 CPUs") + "\n")
    assert watch.waiting_text() == "waiting for resources: 3 CPUs"
    watch.view.write(event(event="stall", silent_s=400.0, limit_s=300.0) + "\n")
    assert (watch.new_stall(), watch.stall_limit_s(), watch.new_stall()) == (400.0, 300.0, None)


def test_the_autoscalers_infeasible_request_is_read_from_rays_own_line(autoscaler_printer):
    line = autoscaler_printer(infeasible_request({"CPU": 3.0}))
    plain = line.replace("\x1b[33m", "").replace("\x1b[0m", "").strip()
    assert is_rays_own(plain)
    wait = resource_wait_in(plain).with_nodes([{"CPU": 2.0, "memory": 1e9}, {"CPU": 1.0}])
    assert wait.text() == "waiting for resources: 3 CPUs for one task or actor, 2 on its largest node"
    # the autoscaler v2 words (ray/autoscaler/v2/event_logger.py), for a placement group
    group = ("No available node types can fulfill placement group requests (detail=train): {'CPU': 1.0}*3. "
             "Add suitable node types to this cluster to resolve this issue.")
    assert resource_wait_in(group).with_nodes([{"CPU": 2.0}]).text() == \
        "waiting for resources: 3 CPUs for a placement group, 2 on the cluster"


def cluster_status_pending(lines: list[str]) -> str:
    """The part of the autoscaler's status report (`ray status`) that lists what waits for resources."""
    return ("Resources\n" + "-" * 57 + "\nTotal Usage:\n 0.0/2.0 CPU\n\nFrom request_resources:\n (none)\n"
            "Pending Demands:\n" + "\n".join(lines) + "\n")


def test_a_quiet_job_that_waits_for_its_worker_group_is_named_from_the_clusters_pending_demand(monkeypatch):
    """Ray Train V2 waits for its workers' placement group without a word: the cluster's demand says it."""
    from ray.autoscaler._private.util import format_pg, format_resource_demand_summary

    from runner.follow import follower as following
    from runner.run.stall import StallRule

    cluster = LocalCluster([{"CPU": 2.0}])
    group = format_pg({"strategy": "PACK", "bundles": [({"CPU": 1.0}, 3)]})
    cluster.status = cluster_status_pending([f" {group}: 1+ pending placement groups"])
    watch, _, notes = watch_of(cluster)
    monkeypatch.setattr(agent_watch, "QUIET_S", 0.0)
    quiet = following.Follower(cluster, "raysubmit_x", logs_out=watch.view, notes=io.StringIO(),
                               new_stall=watch.new_stall, on_stall=StallRule(cluster, "raysubmit_x", watch).on_stall)
    asyncio.run(quiet._watch_for_a_stall({}))
    asyncio.run(quiet._watch_for_a_stall({}))
    assert [line for line in notes.getvalue().splitlines() if "waiting" in line] == [
        "rayjobs: waiting for resources: 3 CPUs for a placement group, 2 on the cluster. Ask for less, or add nodes: "
        "Ray keeps it waiting until they are free or the cluster grows"]

    running, _, running_notes = watch_of(cluster)
    running.view.write(event(event="attempt", attempt=1, workers=[], nodes=1) + "\n")
    cluster.status = cluster_status_pending(format_resource_demand_summary([({"CPU": 3.0}, 1)]))
    running.new_stall()
    assert "waiting" not in running_notes.getvalue(), "a job whose workers run is not waiting for them"
    cluster.status = cluster_status_pending([" (no resource demands)"])
    idle, _, idle_notes = watch_of(cluster)
    idle.new_stall()
    assert idle_notes.getvalue() == ""


def test_a_run_stopped_at_its_timeout_says_what_it_was_waiting_for():
    info = {"status": "STOPPED", "start_time": 1_000, "end_time": 361_000}
    line = summary_line("raysubmit_x", ExitCode.TIMEOUT, info, "the job ran past its timeout_s of 360s",
                        "waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster")
    assert line == ("job raysubmit_x STOPPED after 6m00s: the job ran past its timeout_s of 360s; it was still "
                    "waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster")


def test_raw_keeps_a_bar_as_written_even_in_a_pipe():
    text = tqdm_bar_text(2)
    out = io.StringIO()
    view = LogView(out, raw=True, pipe=True)
    view.write(text)
    view.close()
    assert out.getvalue() == text


def test_what_rays_own_processes_print_is_no_sign_of_the_jobs_life():
    traceback_line = forwarded(["ConnectionError: Found multiple active Ray instances: {'127.0.0.1:6379', "
                                "'127.0.0.1:6380'}. Please specify the one to connect to by setting the `--address` "
                                "flag or `RAY_ADDRESS` environment variable."], 4711, "PlacementGroupCleaner")
    out = io.StringIO()
    view = LogView(out, strip_ansi=True)
    view.write(traceback_line)
    assert "Found multiple active Ray instances" in out.getvalue(), "shown: it is an error"
    judge = JobWatch(None, 0.0)
    for line in traceback_line.splitlines():
        judge.line(line, 10.0)
    assert judge.last_life == 0.0
    judge.line(forwarded(["loss went down"], 12, "RayTrainWorker").rstrip("\n"), 11.0)
    assert judge.last_life == 11.0


def test_the_agents_lines_go_among_rayjobs_lines_and_the_jobs_output_keeps_only_the_jobs():
    out, agent = io.StringIO(), []
    view = LogView(out, on_agent_line=agent.append)
    view.write("epoch 1 done\nrayjobs: waiting for resources: 4 CPUs for a placement group, 2 on the cluster. Ask")
    view.write(" for less\n(TrainController pid=3) rayjobs: progress unavailable: no callback\nepoch 2 done\n")
    view.close()
    assert agent == ["rayjobs: waiting for resources: 4 CPUs for a placement group, 2 on the cluster. Ask for less"]
    # A line another process wrote is forwarded with its prefix: it stays the job's (Ray put it there).
    assert out.getvalue() == ("epoch 1 done\n(TrainController pid=3) rayjobs: progress unavailable: no callback\n"
                              "epoch 2 done\n")
    raw = io.StringIO()
    LogView(raw, on_agent_line=agent.append, raw=True).write("rayjobs: said\n")
    assert raw.getvalue() == "rayjobs: said\n", "--raw shows the log as written"
