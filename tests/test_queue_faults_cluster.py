"""The cluster queue at its edges, on a real cluster: Ctrl-C at each moment of a queued submission, one fixed id
submitted twice (by the same spec, and by two specs racing), a waiting job stopped whose code went through S3, a
job lost whole with nobody watching, a keeper whose process hangs, and the order jobs' own traces in Ray's table.

Most run on the session cluster, each in a queue of its own whose limit is 0 while the test needs its jobs to
wait (set through the client: ``rayjobs queue set`` takes 1 or more). A job that must never run prints ``FIRST LINE <name>`` first thing: its log shows whether it ever ran. Two
tests need a cluster whose nodes hold an S3 server's credentials (Ray's runtime environment agent downloads the
code), which this module starts itself.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rayjobs_agent import queueing as q
from runner.client.queue import ClusterQueue
from runner.errors import JobNotFound
from runner.local import loopback_env
from runner.local.state import LocalCluster
from tests.support.cli import cli_env, dashboard_port, direct_api, own_cluster, popen_rayjobs, run_rayjobs
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import aws_variables, create_bucket, object_keys
from tests.support.waiting import HANG_GUARD_S, wait_for_condition

# Waits for what the keeper does on its own: order jobs leave Ray's table 30 s after they ended (its cleaning
# looks every 10 s), a hung keeper is replaced once an order has waited ~20 s behind it.
KEEPER_GUARD_S = 180

WAIT_FOR_FLAG = """
import pathlib, sys, time
print("STARTED", flush=True)
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.1)
print("DONE", flush=True)
"""


def _spec(directory: Path, name: str, queue: str | None = None, *, submission_id: str | None = None,
          extra: str = "") -> Path:
    """A spec whose job prints ``FIRST LINE <name>`` and ends; in ``queue`` (needing no CPU), without a record."""
    # Printed as one line, written as two words: the log's line that names the entrypoint never reads as it.
    lines = [f"name: {name}", f"entrypoint: python -c 'print(\"FIRST\", \"LINE {name}\", flush=True)'",
             "record: false"]
    if queue:
        lines += [f"queue: {queue}", "needs: {CPU: 0}"]
    if submission_id:
        lines.append(f"submission_id: {submission_id}")
    spec = directory / f"{name}.yaml"
    spec.write_text("\n".join(lines) + "\n" + extra)
    return spec


def _waiting_spec(directory: Path, name: str, flag: Path, extra: str = "") -> Path:
    """A spec whose job prints STARTED, then waits until ``flag`` exists; retried once if lost whole, at once."""
    code = directory / f"{name}-code"
    code.mkdir()
    (code / "wait.py").write_text(WAIT_FOR_FLAG)
    spec = directory / f"{name}.yaml"
    spec.write_text(f"name: {name}\nentrypoint: python wait.py {flag}\nmax_retries: 1\n"
                    f"retry_backoff: {{initial_s: 0}}\n{extra}runtime_env:\n  working_dir: {code}\n")
    return spec


def _fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _ray_has(api, job_id: str) -> bool:
    try:
        api.get_job(job_id)
        return True
    except JobNotFound:
        return False


def _status(api, job_id: str) -> str | None:
    try:
        return api.get_job(job_id)["status"]
    except JobNotFound:
        return None


def _ended_as(api, job_id: str, *statuses: str) -> bool:
    return _status(api, job_id) in statuses


class _Stderr:
    """The stderr lines of a ``rayjobs`` subprocess, read as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(process.stderr), daemon=True)
        self._reader.start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str) -> None:
        wait_for_condition(lambda: text in self.text or self.process.poll() is not None, timeout_s=HANG_GUARD_S,
                           interval_s=0.05)
        assert text in self.text, f"never said {text!r}; exit code {self.process.poll()}, stderr:\n{self.text}"

    def finish(self) -> str:
        try:
            self.process.wait(timeout=HANG_GUARD_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        return self.text


def _actor_pid(api, name: str) -> int:
    """The process of the live actor named ``name`` on the cluster, from Ray's state API."""
    query = urllib.parse.urlencode({"filter_keys": "name", "filter_predicates": "=", "filter_values": name,
                                    "detail": "true"})
    actors = [actor for actor in api.get_json(f"/api/v0/actors?{query}")["data"]["result"]["result"]
              if actor.get("state") == "ALIVE"]
    assert len(actors) == 1, actors
    return int(actors[0]["pid"])


def _kill_supervisor(api, job_id: str) -> None:
    """SIGKILL job ``job_id``'s JobSupervisor actor: Ray ends the job FAILED with JOB_SUPERVISOR_ACTOR_DIED."""
    process = psutil.Process(_actor_pid(api, f"_ray_internal_job_actor_{job_id}"))
    assert process.cmdline()[0].startswith("ray::JobSupervisor"), process.cmdline()
    process.kill()


# Ctrl-C --------------------------------------------------------------------------------------------------------


# Where the submission is when Ctrl-C comes: the request held at the cluster's door (a slow network) until then, or
# none held and the job waiting in its queue. What the user is then told, and so what must hold of the job.
MOMENTS = {
    # Looking whether the fixed id is taken: no order has gone out.
    "before-the-order": ("GET", "/api/jobs/{job_id}", 0, "nothing"),
    # The order went out and has not reached the cluster: it gets there after the command has ended.
    "order-on-its-way": ("POST", "/api/jobs/", 0, "nothing"),
    # The order is in Ray's table and its answer is awaited (the first look at the order's id is the check above).
    "answer-awaited": ("GET", "/api/jobs/{order_id}", 1, "stopped"),
    # Submitted, and said so: the job waits in its queue.
    "job-waiting": None,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_during_a_queued_submission_never_leaves_a_job_that_runs_later(ray_cluster, ray_cluster_home, tmp_path,
                                                                             moment):
    api = direct_api(ray_cluster)
    queue, job_id = _fresh("ctrl-c"), _fresh(f"ctrl-c-{moment}")
    ClusterQueue(api).set_limit(queue, 0)
    spec = _spec(tmp_path, "ctrl-c", queue, submission_id=job_id)
    with FaultProxy(dashboard_port(ray_cluster)) as proxy:
        held = MOMENTS[moment]
        if held is not None:
            method, path, after, _ = held
            proxy.hold_path(path.format(job_id=job_id, order_id=q.enqueue_order_id(job_id)), method, after=after)
        process = popen_rayjobs("submit", str(spec), "--address", proxy.address, "--stop-on-interrupt",
                                home=ray_cluster_home, **loopback_env(ray_cluster))
        stderr = _Stderr(process)
        if held is None:
            stderr.wait_for(f"submitted ctrl-c as {job_id}")
        else:
            wait_for_condition(lambda: proxy.held_requests or process.poll() is not None, timeout_s=HANG_GUARD_S,
                               interval_s=0.05)
            assert proxy.held_requests == 1, stderr.text
        process.send_signal(signal.SIGINT)
        said = stderr.finish()
        posts_before = len([seen for seen in proxy.requests_to("/api/jobs/") if seen.method == "POST"])
        proxy.release()
        if moment == "order-on-its-way":
            # The held order reaches the dashboard now, after the command said what it did.
            wait_for_condition(lambda: len([seen for seen in proxy.requests_to("/api/jobs/") if seen.method == "POST"])
                               > posts_before, timeout_s=HANG_GUARD_S)

    assert process.returncode == 130, said
    assert "Traceback" not in said and q.ORDER_PREFIX not in said, said
    expected = "stopped" if held is None else held[3]
    if expected == "nothing":
        assert "rayjobs: interrupted: nothing was submitted" in said, said
    else:
        assert f"rayjobs: interrupted: stopping job {job_id} (--stop-on-interrupt)" in said, said

    # The queue is let go; a job entered after it runs to its end, so any job ahead of it has had its turn by then.
    ClusterQueue(api).set_limit(queue, 1)
    after = run_rayjobs("submit", str(_spec(tmp_path, "after-ctrl-c", queue)), home=ray_cluster_home)
    assert after.returncode == 0 and "FIRST LINE after-ctrl-c" in after.stdout, after.stderr
    if expected == "nothing":
        assert not _ray_has(api, job_id), api.get_job(job_id)
        assert ClusterQueue(api).place_of(job_id) is None
    else:
        wait_for_condition(lambda: _ended_as(api, job_id, "STOPPED", "SUCCEEDED", "FAILED"), timeout_s=HANG_GUARD_S)
        assert api.get_job(job_id)["status"] == "STOPPED"
        log = api.job_log(job_id)
        assert "FIRST LINE ctrl-c" not in log and f"stopped while it waited in queue {queue}" in log, log


# One fixed id, submitted twice ---------------------------------------------------------------------------------


def test_a_fixed_id_submitted_again_while_it_waits_attaches_and_a_stop_ends_it_without_running(rayjobs_cli,
                                                                                                ray_cluster, tmp_path):
    api = direct_api(ray_cluster)
    queue, job_id = _fresh("attach"), _fresh("attach")
    ClusterQueue(api).set_limit(queue, 0)
    spec = str(_spec(tmp_path, "attach", queue, submission_id=job_id))
    first = rayjobs_cli("submit", spec, "--no-wait")
    assert first.returncode == 0, first.stderr

    again = rayjobs_cli("submit", spec, "--no-wait")
    assert again.returncode == 0, again.stderr
    assert (f"job {job_id} was already submitted from this spec (waiting in queue {queue}); attaching to it"
            in again.stderr), again.stderr
    assert not _ray_has(api, job_id), "attaching submitted nothing"

    deleted = rayjobs_cli("delete", job_id)
    assert deleted.returncode == 2, deleted.stderr
    assert (f"job {job_id} is QUEUED; only finished jobs can be deleted (stop it first: rayjobs stop --wait {job_id})"
            in deleted.stderr), deleted.stderr

    stopped = rayjobs_cli("stop", job_id, "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {job_id} is STOPPED" in stopped.stderr, stopped.stderr
    log = rayjobs_cli("logs", job_id).stdout
    assert "FIRST LINE attach" not in log and f"stopped while it waited in queue {queue}" in log, log

    # Stopped, it is a finished job: deleted as any, after which the same spec enters the id afresh, and runs.
    deleted = rayjobs_cli("delete", job_id)
    assert deleted.returncode == 0, deleted.stderr
    ClusterQueue(api).set_limit(queue, 1)
    once_more = rayjobs_cli("submit", spec)
    assert once_more.returncode == 0, once_more.stderr
    assert "FIRST LINE attach" in once_more.stdout and "attaching" not in once_more.stderr, once_more.stderr


# (gap between the two starts in seconds, which spec starts first): both at once, and each ahead by a little.
RACE_ROUNDS = [(0.0, "a"), (0.0, "b"), (0.03, "a"), (0.15, "b")]


def test_two_specs_racing_for_one_fixed_id_one_gets_it_and_only_its_spec_ever_runs(ray_cluster, ray_cluster_home,
                                                                                  tmp_path):
    api = direct_api(ray_cluster)
    queue = _fresh("race")
    ClusterQueue(api).set_limit(queue, 0)
    winners: dict[str, str] = {}
    for index, (gap, first) in enumerate(RACE_ROUNDS):
        job_id = _fresh(f"race-{index}")
        specs = {side: _spec(tmp_path, f"race-{index}-{side}", queue, submission_id=job_id) for side in "ab"}
        order = [first, "b" if first == "a" else "a"]
        processes = {}
        for side in order:
            processes[side] = popen_rayjobs("submit", str(specs[side]), "--no-wait", home=ray_cluster_home)
            time.sleep(gap)  # the pause injected between the two submissions
        results = {side: (process.wait(timeout=HANG_GUARD_S), process.stderr.read())
                   for side, process in processes.items()}
        outcomes = sorted(code for code, _ in results.values())
        assert outcomes == [0, 2], results
        loser = next(side for side, (code, _) in results.items() if code == 2)
        assert "is already taken by a job with different content" in results[loser][1], results
        winners[job_id] = next(side for side, (code, _) in results.items() if code == 0)
    shown = {job["id"] for job in ClusterQueue(api).describe(queue)[0]["waiting"]}
    assert shown == set(winners), shown

    ClusterQueue(api).set_limit(queue, len(RACE_ROUNDS))
    wait_for_condition(lambda: all(_ended_as(api, job_id, "SUCCEEDED", "FAILED", "STOPPED") for job_id in winners),
                       timeout_s=HANG_GUARD_S)
    for index, (job_id, side) in enumerate(winners.items()):
        log = api.job_log(job_id)
        loser = "b" if side == "a" else "a"
        assert api.get_job(job_id)["status"] == "SUCCEEDED", log
        assert f"FIRST LINE race-{index}-{side}" in log and f"FIRST LINE race-{index}-{loser}" not in log, log


# Order jobs ----------------------------------------------------------------------------------------------------


def test_order_jobs_never_show_and_leave_rays_table_soon_but_an_entry_order_stays_until_its_job_is_there(
        rayjobs_cli, ray_cluster, tmp_path):
    api = direct_api(ray_cluster)
    queue, job_id = _fresh("orders"), _fresh("orders")
    since_ms = time.time() * 1000 - 1000
    limited = rayjobs_cli("queue", "set", queue, "--max-running", "1")
    assert limited.returncode == 0, limited.stderr
    ClusterQueue(api).set_limit(queue, 0)
    entered = rayjobs_cli("submit", str(_spec(tmp_path, "orders", queue, submission_id=job_id)), "--no-wait")
    assert entered.returncode == 0, entered.stderr
    entry_order = q.enqueue_order_id(job_id)

    def other_orders() -> list[str]:
        return [job["submission_id"] for job in api.list_jobs() if job["submission_id"].startswith(q.ORDER_PREFIX)
                and q.entered_job(job["submission_id"]) is None and (job.get("start_time") or 0) >= since_ms]

    assert len(other_orders()) >= 2, "the two limits were set through order jobs"
    listed = rayjobs_cli("list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    shown = {job["submission_id"]: job["status"] for job in json.loads(listed.stdout)}
    assert shown.get(job_id) == "QUEUED", shown
    assert not [shown_id for shown_id in shown if shown_id.startswith(q.ORDER_PREFIX)], shown

    wait_for_condition(lambda: not other_orders(), timeout_s=KEEPER_GUARD_S, interval_s=1)
    # The entry order holds the job's id for as long as the job waits: it is no Ray job yet.
    assert api.get_job(entry_order)["status"] == "STOPPED" and not _ray_has(api, job_id)

    ClusterQueue(api).set_limit(queue, 1)
    wait_for_condition(lambda: _ended_as(api, job_id, "SUCCEEDED", "FAILED"), timeout_s=HANG_GUARD_S)
    wait_for_condition(lambda: not _ray_has(api, entry_order), timeout_s=KEEPER_GUARD_S, interval_s=1)
    assert api.get_job(job_id)["status"] == "SUCCEEDED"


# Jobs lost whole -----------------------------------------------------------------------------------------------


def test_a_job_lost_whole_with_nobody_watching_is_submitted_again_by_the_keeper(rayjobs_cli, ray_cluster, tmp_path):
    api = direct_api(ray_cluster)
    flag = tmp_path / "let-it-end"
    submitted = rayjobs_cli("submit", str(_waiting_spec(tmp_path, "lost-unwatched", flag, "record: false\n")),
                            "--no-wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    wait_for_condition(lambda: "STARTED" in api.job_log(job_id), timeout_s=HANG_GUARD_S)

    _kill_supervisor(api, job_id)
    wait_for_condition(lambda: _ended_as(api, job_id, "FAILED"), timeout_s=HANG_GUARD_S)
    assert api.get_job(job_id)["error_type"] == "JOB_SUPERVISOR_ACTOR_DIED"
    attempt = f"{job_id}-attempt2"
    wait_for_condition(lambda: _ray_has(api, attempt), timeout_s=HANG_GUARD_S)
    # The keeper publishes its snapshot once its step is over, a moment after it submitted the attempt.
    decided = wait_for_condition(lambda: ClusterQueue(api).decision_about(job_id), timeout_s=HANG_GUARD_S)
    assert decided and decided["retry"] and decided["next"] == attempt and decided["attempt"] == 2, decided
    metadata = api.get_job(attempt)["metadata"]
    assert metadata["rayjobs.attempt"] == "2" and metadata["rayjobs.parent"] == job_id, metadata

    flag.touch()
    wait_for_condition(lambda: _ended_as(api, attempt, "SUCCEEDED", "FAILED", "STOPPED"), timeout_s=HANG_GUARD_S)
    assert api.get_job(attempt)["status"] == "SUCCEEDED", api.job_log(attempt)
    status = rayjobs_cli("status", job_id)
    assert f"2. {attempt}  SUCCEEDED" in status.stdout, status.stdout + status.stderr


def test_a_followed_job_lost_whole_is_followed_into_the_attempt_the_keeper_submits(ray_cluster, ray_cluster_home,
                                                                                   tmp_path):
    api = direct_api(ray_cluster)
    flag = tmp_path / "let-it-end"
    process = popen_rayjobs("submit", str(_waiting_spec(tmp_path, "lost-followed", flag, "record: false\n")),
                            home=ray_cluster_home)
    stderr = _Stderr(process)
    stderr.wait_for("submitted lost-followed as ")
    job_id = stderr.text.split("submitted lost-followed as ", 1)[1].split()[0]
    wait_for_condition(lambda: "STARTED" in api.job_log(job_id), timeout_s=HANG_GUARD_S)

    _kill_supervisor(api, job_id)
    attempt = f"{job_id}-attempt2"
    wait_for_condition(lambda: _ray_has(api, attempt), timeout_s=HANG_GUARD_S)
    flag.touch()
    said = stderr.finish()
    out = process.stdout.read()
    assert process.returncode == 0, said
    assert out.count("STARTED") == 2 and "DONE" in out, out
    assert attempt in said and "SUCCEEDED" in said, said
    assert [job["submission_id"] for job in api.list_jobs()
            if (job.get("metadata") or {}).get("rayjobs.parent") == job_id] == [attempt], "one attempt, the keeper's"


# A keeper that hangs -------------------------------------------------------------------------------------------


def test_an_order_behind_a_keeper_whose_process_hangs_is_answered_by_a_keeper_that_replaces_it(rayjobs_cli,
                                                                                                ray_cluster):
    api = direct_api(ray_cluster)
    queue = _fresh("hung")
    ClusterQueue(api).set_limit(queue, 0)  # a keeper runs, and has answered
    before = ClusterQueue(api).snapshot()["keeper"]["started"]
    hung = psutil.Process(_actor_pid(api, "rayjobs-queue-keeper"))
    hung.suspend()  # SIGSTOP: it holds its share of the head's resource, and reads no order
    try:
        limited = rayjobs_cli("queue", "set", queue, "--max-running", "2", timeout=KEEPER_GUARD_S)
        assert limited.returncode == 0, limited.stderr
        assert f"queue {queue}: 0 of 2 running" in limited.stdout, limited.stdout
        wait_for_condition(lambda: ClusterQueue(api).snapshot()["keeper"]["started"] > before, timeout_s=HANG_GUARD_S)
    finally:
        if hung.is_running():
            hung.resume()


# What a stray supervisor does: Ray lists a job before it creates its supervisor actor, so an order ended in that
# moment (or a keeper killed between ending an order and taking its supervisor down) leaves a supervisor that waits
# for the order's share of the head's resource; placed once the keeper dies, it finds its job ended and never exits.
STRAY_SUPERVISOR = """
import asyncio, os, signal, sys
import ray
from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient, JobStatus
from ray.util.state import list_actors

stray = sys.argv[1]
ray.init(address="auto")
asyncio.run(JobInfoStorageClient(ray._private.worker.global_worker.gcs_client).put_info(
    stray, JobInfo(status=JobStatus.STOPPED, entrypoint="true", message="ended before its supervisor was made")))

@ray.remote(num_cpus=0)
class Stray:
    def ping(self):
        return 1

Stray.options(name="_ray_internal_job_actor_" + stray, namespace="SUPERVISOR_ACTOR_RAY_NAMESPACE",
              lifetime="detached", resources={"node:__internal_head__": float(sys.argv[2])}).remote()
keeper = [actor for actor in list_actors(filters=[("name", "=", "rayjobs-queue-keeper")]) if actor.state == "ALIVE"]
os.kill(int(keeper[0].pid), signal.SIGKILL)
print("STRAY MADE, KEEPER KILLED", flush=True)
"""


def _live_actors_named(api, name: str) -> list[dict]:
    query = urllib.parse.urlencode({"filter_keys": "name", "filter_predicates": "=", "filter_values": name,
                                    "detail": "true"})
    return [actor for actor in api.get_json(f"/api/v0/actors?{query}")["data"]["result"]["result"]
            if actor.get("state") != "DEAD"]


def test_a_supervisor_of_an_ended_order_that_holds_the_heads_resource_is_taken_down_and_the_queue_answers(
        rayjobs_cli, ray_cluster, tmp_path):
    api = direct_api(ray_cluster)
    queue = _fresh("stray")
    ClusterQueue(api).set_limit(queue, 0)  # a keeper runs, and holds its share of the head's resource
    stray = f"rayjobs-order-set-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "stray.py"
    script.write_text(STRAY_SUPERVISOR)
    maker = f"stray-maker-{uuid.uuid4().hex[:8]}"
    api.submit({"submission_id": maker,
                "entrypoint": f"python {script} {stray} {q.ORDER_RESOURCES[q.HEAD_RESOURCE]}"})
    wait_for_condition(lambda: _status(api, maker) in ("SUCCEEDED", "FAILED", "STOPPED"), timeout_s=HANG_GUARD_S)
    assert _status(api, maker) == "SUCCEEDED", api.get_logs(maker)
    # The keeper, restarted by Ray, and the stray both wait for the head's resource: whichever is placed first, the
    # stray goes (by the keeper's cleaning, or by the helper of the order the client sends when no keeper answers).
    limited = rayjobs_cli("queue", "set", queue, "--max-running", "1", timeout=KEEPER_GUARD_S)
    assert limited.returncode == 0, limited.stderr
    assert f"queue {queue}: 0 of 1 running" in limited.stdout, limited.stdout
    wait_for_condition(lambda: _live_actors_named(api, f"_ray_internal_job_actor_{stray}") == [],
                       timeout_s=KEEPER_GUARD_S)
    wait_for_condition(lambda: [actor["state"] for actor in _live_actors_named(api, "rayjobs-queue-keeper")]
                       == ["ALIVE"], timeout_s=KEEPER_GUARD_S)


# What Ray Train's state actor does from a cluster's first training run on: a detached actor holding a sliver of the
# head's resource for as long as the cluster lives. The keeper is taken away for good, as on a cluster that never had
# one.
SLIVER_HOLDER = """
import sys
import ray

ray.init(address="auto")

@ray.remote(num_cpus=0)
class Sliver:
    def ping(self):
        return 1

holder = Sliver.options(name=sys.argv[1], namespace="rayjobs-tests", lifetime="detached",
                        resources={"node:__internal_head__": 0.001}).remote()
ray.get(holder.ping.remote())
try:
    ray.kill(ray.get_actor("rayjobs-queue-keeper", namespace="rayjobs"), no_restart=True)
except ValueError:
    pass  # no keeper yet
print("SLIVER HELD, NO KEEPER", flush=True)
"""

TAKE_AWAY = """
import sys
import ray

ray.init(address="auto")
ray.kill(ray.get_actor(sys.argv[1], namespace="rayjobs-tests"), no_restart=True)
"""


def _run_script(api, tmp_path: Path, code: str, *arguments: str) -> None:
    script = tmp_path / f"script-{uuid.uuid4().hex[:8]}.py"
    script.write_text(code)
    job = f"script-{uuid.uuid4().hex[:8]}"
    api.submit({"submission_id": job, "entrypoint": " ".join(["python", str(script), *arguments])})
    wait_for_condition(lambda: _status(api, job) in ("SUCCEEDED", "FAILED", "STOPPED"), timeout_s=HANG_GUARD_S)
    assert _status(api, job) == "SUCCEEDED", api.get_logs(job)


def test_a_cluster_whose_head_resource_holds_another_actors_sliver_gets_a_keeper_and_answers(rayjobs_cli, ray_cluster,
                                                                                             tmp_path):
    api = direct_api(ray_cluster)
    holder = _fresh("sliver-holder")
    _run_script(api, tmp_path, SLIVER_HOLDER, holder)
    try:
        wait_for_condition(lambda: _live_actors_named(api, "rayjobs-queue-keeper") == [], timeout_s=HANG_GUARD_S)
        queue = _fresh("sliver")
        limited = rayjobs_cli("queue", "set", queue, "--max-running", "1", timeout=KEEPER_GUARD_S)
        assert limited.returncode == 0, limited.stderr
        assert f"queue {queue}: 0 of 1 running" in limited.stdout, limited.stdout
        wait_for_condition(lambda: [actor["state"] for actor in _live_actors_named(api, "rayjobs-queue-keeper")]
                           == ["ALIVE"], timeout_s=KEEPER_GUARD_S)
        # An order of older code, which asks for the whole head, is answered: the keeper does not step aside for it.
        older = f"{q.ORDER_PREFIX}set-{uuid.uuid4().hex[:16]}"
        ClusterQueue(api)._send({"verb": "set", "queue": queue, "max_running": 3}, older,
                                {q.METADATA_AGENT_VERSION: "older"}, resources={q.HEAD_RESOURCE: 1.0})
        refused = ClusterQueue(api).answer(older, refusal_raises=False)
        assert "upgrade rayjobs" in refused["error"], refused
        again = rayjobs_cli("queue", "set", queue, "--max-running", "2", timeout=KEEPER_GUARD_S)
        assert again.returncode == 0 and f"queue {queue}: 0 of 2 running" in again.stdout, again.stderr
    finally:
        _run_script(api, tmp_path, TAKE_AWAY, holder)


# Code through S3 -----------------------------------------------------------------------------------------------


BUCKET = "queue-code"


@pytest.fixture(scope="module")
def s3_cluster(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A one-CPU cluster whose nodes hold the S3 server's credentials (Ray's agent downloads the code): its
    RAYJOBS_HOME and the environment of a ``rayjobs`` that reaches it and the bucket."""
    create_bucket(s3_endpoint, BUCKET)
    home = tmp_path_factory.mktemp("queue-s3-home")
    env = cli_env(home, **aws_variables(s3_endpoint))
    with own_cluster("queue-s3", home, env):
        yield home, env


def _s3_cluster_api(home: Path):
    return direct_api(LocalCluster.from_json((home / "clusters" / "queue-s3" / "cluster.json").read_text()))


@pytest.mark.cluster
def test_a_waiting_job_whose_code_went_through_s3_stopped_ends_stopped_with_its_record(s3_cluster, tmp_path):
    home, env = s3_cluster
    api = _s3_cluster_api(home)
    queue, job_id = _fresh("s3-wait"), _fresh("s3-wait")
    ClusterQueue(api).set_limit(queue, 0)
    code = tmp_path / "code"
    code.mkdir()
    (code / "first.py").write_text("print('FIRST LINE s3-wait', flush=True)\n")
    spec = tmp_path / "s3-wait.yaml"
    spec.write_text(f"name: s3-wait\nentrypoint: python first.py\nqueue: {queue}\nneeds: {{CPU: 0}}\n"
                    f"submission_id: {job_id}\ncode_path: s3://{BUCKET}/packages\n"
                    f"record_path: {tmp_path / 'records'}\nruntime_env:\n  working_dir: {code}\n")
    submitted = run_rayjobs("submit", str(spec), "--no-wait", "--cluster", "queue-s3", home=home, env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert "uploaded working_dir" in submitted.stderr, submitted.stderr

    stopped = run_rayjobs("stop", job_id, "--wait", "--cluster", "queue-s3", home=home, env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {job_id} is STOPPED" in stopped.stderr, stopped.stderr
    log = api.job_log(job_id)
    assert "FIRST LINE s3-wait" not in log and f"stopped while it waited in queue {queue}" in log, log
    # What ran in its place carried the agent's package from the bucket, as the job would have: on this cluster the
    # agent would import without it too (the nodes run this checkout's environment), on a team's cluster not.
    modules = api.get_job(job_id)["runtime_env"].get("py_modules") or []
    assert modules and all(module.startswith(f"s3://{BUCKET}/packages/") for module in modules), modules
    (record,) = (tmp_path / "records").iterdir()
    assert json.loads((record / "run.json").read_text())["status"] == "STOPPED"


@pytest.mark.cluster
def test_a_job_lost_whole_whose_code_went_through_s3_is_submitted_again_without_a_new_upload(s3_cluster, tmp_path,
                                                                                             s3_endpoint):
    home, env = s3_cluster
    api = _s3_cluster_api(home)
    flag = tmp_path / "let-it-end"
    spec = _waiting_spec(tmp_path, "lost-s3", flag, f"record: false\ncode_path: s3://{BUCKET}/lost\n")
    submitted = run_rayjobs("submit", str(spec), "--no-wait", "--cluster", "queue-s3", home=home, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    packages = object_keys(s3_endpoint, BUCKET, "lost/")
    working_dir = api.get_job(job_id)["runtime_env"]["working_dir"]
    assert working_dir.startswith(f"s3://{BUCKET}/lost/"), working_dir
    wait_for_condition(lambda: "STARTED" in api.job_log(job_id), timeout_s=HANG_GUARD_S)

    _kill_supervisor(api, job_id)
    attempt = f"{job_id}-attempt2"
    wait_for_condition(lambda: _ray_has(api, attempt), timeout_s=HANG_GUARD_S)
    assert api.get_job(attempt)["runtime_env"]["working_dir"] == working_dir
    flag.touch()
    wait_for_condition(lambda: _ended_as(api, attempt, "SUCCEEDED", "FAILED", "STOPPED"), timeout_s=HANG_GUARD_S)
    assert api.get_job(attempt)["status"] == "SUCCEEDED", api.job_log(attempt)
    assert object_keys(s3_endpoint, BUCKET, "lost/") == packages, "the request was reused: nothing was uploaded"
