"""A pipeline run in the queue, decided by its keeper over a store that behaves as the cluster's does, with Ray's job
table beside it: jobs line up once the run is sealed and every job they run after SUCCEEDED; one that never will
ends without running, and so do the jobs after it. tests/test_pipeline_file.py reads the file; here every
interleaving is set up by hand. A run's one notification at its end is sent through a stand-in for
``notify.send`` here, and through the real one to a real JSON webhook in the last of those tests."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from jobs.notify import NotifyTarget, job_notify_settings
from rayjobs_agent import queueing as q
from rayjobs_agent.queue import pipelines as pl, store as qs
from rayjobs_agent.queue import keeper as kp
from rayjobs_agent.queue.keeper import NOTIFY_THREAD
from rayjobs_agent.wire import METADATA_SPEC_HASH
from runner.client.queue import ClusterQueue
from tests.support.notify_receivers import webhook_receiver
from tests.support.queue_store import Clock, DictStore, keeper_and_jobs
from tests.support.waiting import HANG_GUARD_S

RUN = "nightly-0a1b2c3d"


_keeper = keeper_and_jobs


def _job(name: str) -> str:
    return f"{RUN}-{name}"


def _enter(store: DictStore, name: str, after: list[str], *, at_ms: float, queue: str = "team-a",
           priority: int = 0, run: str = RUN) -> None:
    job_id = f"{run}-{name}"
    order = {"verb": "enqueue", "queue": queue, "id": job_id, "name": name, "priority": priority,
             "needs": {"CPU": 1.0}, "pipeline": run, "pipeline_job": name,
             "after": [f"{run}-{other}" for other in after],
             "request": {"submission_id": job_id, "entrypoint": "python -m rayjobs_agent.supervisor -- 'true'",
                         "metadata": {METADATA_SPEC_HASH: "hash"}}}
    store.order(q.enqueue_order_id(job_id), order, start_time_ms=at_ms, metadata={"rayjobs.enqueues": queue})


def _seal(store: DictStore, names: list[str], *, at_ms: float, run: str = RUN, notify: str | None = None) -> str:
    order_id = f"rayjobs-order-seal-{run}"
    order = {"verb": "seal", "run": run, "jobs": {name: f"{run}-{name}" for name in names}, "after": {}}
    if notify:
        order.update(pipeline="nightly", notify=notify)
    store.order(order_id, order, start_time_ms=at_ms)
    return order_id


def _diamond(store: DictStore, *, seal: bool = True) -> None:
    # prep → train-a, train-b → evaluate; entered in an order that puts the dependants first.
    _enter(store, "evaluate", ["train-a", "train-b"], at_ms=1_000_000, priority=5)
    _enter(store, "train-a", ["prep"], at_ms=1_000_001, priority=5)
    _enter(store, "train-b", ["prep"], at_ms=1_000_002)
    _enter(store, "prep", [], at_ms=1_000_003)
    if seal:
        _seal(store, ["prep", "train-a", "train-b", "evaluate"], at_ms=1_000_004)


def test_a_job_runs_only_after_every_job_it_runs_after_succeeded_and_the_ones_waiting_on_others_hold_up_no_one():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    _diamond(store)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    # evaluate and train-a come first by priority, yet wait on others: prep, last in order, takes the slot.
    assert jobs.ids() == [_job("prep")]
    (shown,) = keeper.step()["queues"]
    reasons = {row["id"]: row["reason"] for row in shown["waiting"]}
    assert reasons[_job("train-a")] == f"runs after {_job('prep')} is RUNNING"
    assert reasons[_job("evaluate")] == f"runs after {_job('train-a')} waits; {_job('train-b')} waits"
    jobs.settle(_job("prep"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids() == [_job("prep"), _job("train-a")]  # the limit holds: one at a time, by priority
    jobs.settle(_job("train-a"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids()[-1] == _job("train-b"), "evaluate still waits on train-b"
    jobs.settle(_job("train-b"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids()[-1] == _job("evaluate")


def test_the_jobs_of_a_run_never_sealed_wait_unseen_and_end_without_running_once_their_client_is_long_gone():
    store, clock = DictStore(), Clock()
    _diamond(store, seal=False)
    keeper, jobs, said = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == [], "no half a pipeline runs"
    clock.now += pl.UNSEALED_KEPT_S + 1
    keeper.step()
    outcomes = {request["submission_id"]: q.Admission.from_environment(request["runtime_env"]["env_vars"])
                for request in jobs.submitted}
    assert set(outcomes) == {_job(name) for name in ("prep", "train-a", "train-b", "evaluate")}
    assert {admission.outcome for admission in outcomes.values()} == {"FAILED"}
    assert "was never started" in outcomes[_job("prep")].reason
    assert store.keys("waiting/") == []


def test_a_seal_that_names_a_job_never_entered_is_refused_and_lets_nothing_run():
    store = DictStore()
    _enter(store, "prep", [], at_ms=1_000_000)
    order_id = _seal(store, ["prep", "train"], at_ms=1_000_001)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert "its jobs train are not waiting in their queues" in jobs.answer_to(order_id)["error"]
    assert jobs.ids() == []


@pytest.mark.parametrize("ending, said", [("FAILED", "prep failed: exit 3"), ("STOPPED", "prep was stopped: exit 3"),
                                          (None, "is gone from Ray's job table")])
def test_when_a_job_fails_is_stopped_or_deleted_every_job_after_it_ends_without_running_and_says_why(ending, said):
    store = DictStore()
    _diamond(store)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == [_job("prep")]
    if ending is None:
        jobs.delete(_job("prep"))
    else:
        jobs.settle(_job("prep"), ending, "exit 3")
    for _ in range(3):  # the chain ends one layer a step at most
        keeper.step()
    stand_ins = {request["submission_id"]: q.Admission.from_environment(request["runtime_env"]["env_vars"])
                 for request in jobs.submitted[1:]}
    assert set(stand_ins) == {_job("train-a"), _job("train-b"), _job("evaluate")}
    assert all(admission.outcome == "FAILED" for admission in stand_ins.values())
    assert said.replace("prep", _job("prep")) in stand_ins[_job("train-a")].reason
    assert stand_ins[_job("evaluate")].reason.startswith(f"not run: {_job('train-a')} was not run (not run: ")
    assert store.keys("waiting/") == []


def _prep_lost_whole(store: DictStore) -> tuple[Any, Any]:
    """prep → train, sealed, prep started and then lost whole (its supervisor died): the keeper and its jobs."""
    _enter(store, "prep", [], at_ms=1_000_000)
    _enter(store, "train", ["prep"], at_ms=1_000_001)
    _seal(store, ["prep", "train"], at_ms=1_000_002)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.set_job_status(_job("prep"), "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED")
    return keeper, jobs


def test_a_job_lost_whole_and_submitted_again_is_followed_to_its_last_attempt():
    store = DictStore()
    keeper, jobs = _prep_lost_whole(store)
    store.put(f"lost/{_job('prep')}", b'{"retry": true, "next": "' + f"{_job('prep')}-attempt2".encode() + b'"}')
    store.set_job_status(f"{_job('prep')}-attempt2", "RUNNING")
    keeper.step()
    assert _job("train") not in jobs.ids(), "its dependency's next attempt still runs"
    store.set_job_status(f"{_job('prep')}-attempt2", "SUCCEEDED")
    keeper.step()
    assert jobs.ids()[-1] == _job("train")


def test_two_jobs_whose_last_dependency_succeeds_at_once_with_one_slot_free_take_it_one_at_a_time():
    store = DictStore()
    qs.set_limits(store, "team-a", 2)
    _enter(store, "prep", [], at_ms=1_000_000)
    _enter(store, "a", ["prep"], at_ms=1_000_001)
    _enter(store, "b", ["prep"], at_ms=1_000_002)
    _enter(store, "hold", [], at_ms=1_000_003)
    _seal(store, ["prep", "a", "b", "hold"], at_ms=1_000_004)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == [_job("prep"), _job("hold")]
    jobs.settle(_job("prep"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids()[2:] == [_job("a")], "one slot freed: one job in"
    jobs.settle(_job("a"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids()[3:] == [_job("b")]


def test_a_seal_with_an_id_that_could_be_read_as_another_key_is_refused():
    store = DictStore()
    store.order("rayjobs-order-seal-x", {"verb": "seal", "run": "x/../y", "jobs": {"a": "x"}}, start_time_ms=1)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert "error" in jobs.answer_to("rayjobs-order-seal-x")
    assert store.keys("pipeline/") == []


def test_a_job_lost_whole_before_its_keeper_decided_its_retry_keeps_the_jobs_after_it_waiting():
    store = DictStore()
    # Ray ends it lost a moment before the keeper's next look at lost jobs (every 2 s): nothing is decided yet.
    keeper, jobs = _prep_lost_whole(store)
    keeper._watched_at = keeper.clock()
    (shown,) = keeper.step()["queues"]
    assert jobs.ids() == [_job("prep")], "train neither ran nor ended"
    assert "the keeper decides whether it runs again" in shown["waiting"][0]["reason"]


def test_a_run_still_being_sent_after_its_first_entrys_grace_is_not_given_up():
    store, clock = DictStore(), Clock()
    _enter(store, "a", [], at_ms=1_000_000)
    clock.now += pl.UNSEALED_KEPT_S + 60  # a run of hundreds of jobs, sent slowly
    _enter(store, "b", ["a"], at_ms=clock.now * 1000)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == [] and len(store.keys("waiting/")) == 2, "neither ended: the run is still being sent"
    _seal(store, ["a", "b"], at_ms=clock.now * 1000 + 1)
    keeper.step()
    assert jobs.ids() == [_job("a")]


def test_a_retried_jobs_run_folder_is_its_first_attempts_the_one_the_jobs_after_it_were_told():
    from rayjobs_agent.record_layout import run_of_this_submission
    from rayjobs_agent.wire import METADATA_PARENT, RAY_JOB_CONFIG_ENV_VAR, RUN_PER_SUBMISSION_ENV_VAR

    def folder(metadata: dict) -> str:
        return run_of_this_submission("/runs/quickstart", {RUN_PER_SUBMISSION_ENV_VAR: "1",
                                                           RAY_JOB_CONFIG_ENV_VAR: json.dumps({"metadata": metadata})})

    first = folder({"job_submission_id": _job("prep")})
    assert first == f"/runs/quickstart-{_job('prep')}"
    assert folder({"job_submission_id": f"{_job('prep')}-attempt2", METADATA_PARENT: _job("prep")}) == first


# A run's one notification ------------------------------------------------------------------------------------------

HOOK = "json://127.0.0.1:9/hooks/T0KEN1234abcd"


def _notify(url: str = HOOK, on: tuple[str, ...] = ("failed", "stopped"), *others: tuple[str, list[str]]) -> str:
    # What the client puts into the seal: the settings a job's wrapper reads, built by the same function.
    targets = [(url, list(on)), *others]
    return job_notify_settings([NotifyTarget(url=where, on=when) for where, when in targets], attempts=1)


class _Sender:
    """``notify.send``'s stand-in: keeps every message the keeper sends; ``hold`` keeps each send waiting, ``fails``
    makes it raise."""

    def __init__(self, hold: threading.Event | None = None, fails: bool = False) -> None:
        self.messages: list[dict[str, Any]] = []
        self.hold, self.fails = hold, fails

    def __call__(self, config: dict, event: str, title: str, body: str, **_options: Any) -> list[dict[str, Any]]:
        if self.hold is not None:
            self.hold.wait(HANG_GUARD_S)
        if self.fails:
            raise RuntimeError("the sender broke")
        self.messages.append({"config": config, "event": event, "title": title, "body": body})
        return [{"url": "json://127.0.0.1:9/***", "event": event, "sent": True}]


def _sends_finished() -> None:
    """Wait for every notification the keepers of this test have started to send."""
    for thread in threading.enumerate():
        if thread.name.startswith(NOTIFY_THREAD):
            thread.join(HANG_GUARD_S)


class _JobsApi:
    """Ray's job API as the client's queue calls it, over the test's store; asked for an order's answer, the keeper
    takes a step first, as the live one would meanwhile."""

    address = "http://cluster"

    def __init__(self, store: DictStore, keeper: Any, clock: Clock) -> None:
        self.store, self.keeper, self.clock = store, keeper, clock

    def submit(self, submission: dict[str, Any]) -> None:
        self.store.set_job_status(submission["submission_id"], "PENDING", start_time=self.clock.now * 1000,
                                  runtime_env=submission["runtime_env"], metadata=submission["metadata"],
                                  entrypoint=submission["entrypoint"])

    def get_job(self, job_id: str) -> dict[str, Any]:
        self.keeper.step()
        return {**qs.ray_job_info(self.store, job_id), "submission_id": job_id}


def _two_jobs(store: DictStore, notify: str) -> None:
    _enter(store, "prep", [], at_ms=1_000_000)
    _enter(store, "train", ["prep"], at_ms=1_000_001)
    _seal(store, ["prep", "train"], at_ms=1_000_002, notify=notify)


def test_a_runs_one_notification_goes_out_once_every_job_has_ended_naming_what_failed_and_never_twice():
    store, clock, sender = DictStore(), Clock(), _Sender()
    _diamond(store, seal=False)
    keeper, jobs, _ = _keeper(store, clock, sender)
    keeper.step()  # every job entered, then the client's last order
    names = ["prep", "train-a", "train-b", "evaluate"]
    sealed = ClusterQueue(_JobsApi(store, keeper, clock)).seal(
        RUN, {name: _job(name) for name in names}, {"train-a": ["prep"], "train-b": ["prep"],
                                                    "evaluate": ["train-a", "train-b"]},
        pipeline="nightly", notify=_notify())
    assert sealed["sealed"] == RUN
    keeper.step()
    assert jobs.ids() == [_job("prep")]
    clock.now += 300
    jobs.settle(_job("prep"), "FAILED", "Job entrypoint command failed with exit code 3, last available logs "
                                        "(truncated to 20,000 chars):\nTraceback (most recent call last):")
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    keeper.step()
    _sends_finished()
    assert store.keys(f"waiting/team-a/{_job('evaluate')}"), "the chain ends one layer a step"
    assert sender.messages == [], "evaluate has not ended yet"
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    snapshot = keeper.step()
    _sends_finished()
    [message] = sender.messages
    assert message["event"] == "failed" and message["title"] == "rayjobs: pipeline nightly FAILED"
    assert message["config"]["targets"] == [{"url": HOOK, "on": ["failed", "stopped"]}]
    assert message["body"].splitlines() == [
        f"pipeline nightly run {RUN} FAILED after 5m10s: 0 of 4 jobs succeeded",
        "prep failed: Job entrypoint command failed with exit code 3",
        "not run: train-a, train-b, evaluate",
        f"each job: rayjobs status {RUN}",
    ]
    assert "T0KEN1234abcd" not in json.dumps(snapshot), "the snapshot, a file in the head's log folder, shows no URL"
    keeper.step()
    restarted, _, _ = _keeper(store, clock, sender)  # the same store: a keeper Ray restarted
    restarted.step()
    # A keeper whose list of keys was read just before another's claim landed still sends nothing: the claim is
    # written only where absent.
    listed = store.keys
    store.keys = lambda prefix, namespace=q.NAMESPACE: [] if prefix == "notified/" else listed(prefix, namespace)
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    restarted.step()
    _sends_finished()
    assert len(sender.messages) == 1


@pytest.mark.parametrize("ending", ["SUCCEEDED", "STOPPED"])
def test_a_run_whose_last_job_succeeds_or_is_stopped_is_told_so_once_it_has_ended(ending):
    store, clock, sender = DictStore(), Clock(), _Sender()
    _two_jobs(store, _notify(on=("succeeded", "failed", "stopped")))
    keeper, jobs, _ = _keeper(store, clock, sender)
    keeper.step()
    jobs.settle(_job("prep"), "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids()[-1] == _job("train")
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    keeper.step()
    _sends_finished()
    assert sender.messages == [], "train still runs"
    jobs.settle(_job("train"), ending, "")
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    keeper.step()
    _sends_finished()
    [message] = sender.messages
    assert message["event"] == ending.lower()
    lines = message["body"].splitlines()
    assert lines[0].startswith(f"pipeline nightly run {RUN} {ending} after ")
    assert lines[1] == ("train was stopped" if ending == "STOPPED" else f"each job: rayjobs status {RUN}")


def test_a_slow_notification_target_never_holds_up_the_keeper_and_a_broken_sender_is_said_once():
    store, clock, released = DictStore(), Clock(), threading.Event()
    slow = _Sender(hold=released)
    _two_jobs(store, _notify())
    keeper, jobs, _ = _keeper(store, clock, slow)
    keeper.step()
    jobs.settle(_job("prep"), "FAILED", "exit 3")
    clock.now += kp.NOTIFY_LOOK_EVERY_S
    keeper.step()  # returns while the send waits on its target
    assert store.get(f"notified/{RUN}") is not None and slow.messages == []
    _enter(store, "later", [], at_ms=2_000_000, run="other-0a1b2c3d")
    _seal(store, ["later"], at_ms=2_000_001, run="other-0a1b2c3d")
    keeper.step()
    assert jobs.ids()[-1] == "other-0a1b2c3d-later", "the queue went on meanwhile"
    released.set()
    _sends_finished()
    assert len(slow.messages) == 1

    store = DictStore()
    _two_jobs(store, _notify())
    keeper, jobs, said = _keeper(store, clock, _Sender(fails=True))
    keeper.step()
    jobs.settle(_job("prep"), "FAILED", "exit 3")
    for _ in range(3):
        clock.now += kp.NOTIFY_LOOK_EVERY_S
        keeper.step()
    _sends_finished()
    assert [line for line in said if "notification" in line] == [
        f"pipeline run {RUN}: its notification failed (RuntimeError: the sender broke); the run is unchanged"]


def test_a_runs_seal_and_its_notification_claim_are_forgotten_with_the_run():
    store, clock = DictStore(), Clock()
    _two_jobs(store, _notify())
    keeper, jobs, _ = _keeper(store, clock, _Sender())
    keeper.step()
    jobs.settle(_job("prep"), "FAILED", "exit 3")
    clock.now += kp.NOTIFY_LOOK_EVERY_S  # the keeper looks for ended runs this often
    keeper.step()
    _sends_finished()
    assert store.keys("pipeline/") and store.keys("notified/")
    pl.forget_old_runs(store, clock.now + pl.RUN_KEPT_S + 1)
    assert store.keys("pipeline/") == [] and store.keys("notified/") == [] and store.keys("notrun/") == []


def test_a_runs_end_reaches_a_real_json_webhook_sent_by_the_keeper_and_only_the_targets_that_want_it():
    with webhook_receiver() as hook:
        store, clock = DictStore(), Clock()
        _two_jobs(store, _notify(hook.url("/hook"), ("failed",), (hook.url("/only-successes"), ["succeeded"])))
        keeper, jobs, _ = _keeper(store, clock)  # the real notify.send, through Apprise
        keeper.step()
        clock.now += 65
        jobs.settle(_job("prep"), "FAILED", "Job entrypoint command failed with exit code 3, last available logs "
                                            "(truncated to 20,000 chars):\nboom")
        keeper.step()
        assert hook.arrived.wait(HANG_GUARD_S)
        _sends_finished()
    [(path, body)] = hook.received
    assert path == "/hook" and body["title"] == "rayjobs: pipeline nightly FAILED"
    assert body["message"].splitlines() == [
        f"pipeline nightly run {RUN} FAILED after 1m05s: 0 of 2 jobs succeeded",
        "prep failed: Job entrypoint command failed with exit code 3",
        "not run: train",
        f"each job: rayjobs status {RUN}",
    ]


def test_a_job_past_its_queues_quota_whose_pipeline_will_never_let_it_run_ends_not_run():
    # Its quota holds it back only while it may still run: once a job it runs after failed, it ends, and with it the
    # run (whose client follows it, and whose message waits for it).
    store, clock = DictStore(free={"CPU": 8.0}), Clock()
    _enter(store, "prep", [], at_ms=1_000_000)
    _enter(store, "train", ["prep"], at_ms=1_000_001, queue="team-b")
    _seal(store, ["prep", "train"], at_ms=1_000_002)
    qs.set_limits(store, "team-b", None, {"CPU": 0.5})
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == [_job("prep")]
    jobs.settle(_job("prep"), "FAILED", "exit 3")
    keeper.step()
    assert store.keys("waiting/") == []
    assert jobs.ids()[-1] == _job("train") and "not run" in json.dumps(jobs.submitted[-1])


def test_one_queues_entry_that_cannot_be_compared_stops_neither_the_other_queues_nor_the_step():
    from tests.support.queue_store import enter

    store = DictStore(free={"CPU": 8.0})
    enter(store, "broken", queue="team-a", submitted=0.0, needs={"CPU": "1"})  # written by an older or hostile hand
    enter(store, "fine", queue="team-b", submitted=1.0)
    keeper, jobs, said = _keeper(store, Clock())
    for _ in range(2):
        snapshot = keeper.step()
    assert jobs.ids() == ["fine"] and snapshot["queues"]
    assert [line for line in said if "could not be looked at" in line] == [
        "queue team-a: its jobs could not be looked at (TypeError: '>' not supported between instances of 'str' and "
        "'float'); the other queues go on"]
