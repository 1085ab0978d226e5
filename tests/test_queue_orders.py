"""The queue's orders and its care of jobs lost whole, decided by its keeper over a store that behaves as the
cluster's does (put-if-absent atomic) with Ray's job table beside it.

An order is a Ray job that waits PENDING while a keeper lives: the keeper reads it from Ray's table, carries it out
in the order Ray took it, and ends it STOPPED with its answer. tests/test_queue_cluster.py checks the same on a
real cluster; here every interleaving is set up by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayjobs_agent.retries import RetryPolicy
from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_PARENT, METADATA_QUEUE, METADATA_SPEC_HASH, RETRY_ENV_VAR
from tests.support.queue_store import Clock, DictStore, FakeRayJobs, enter, keeper_and_jobs
from rayjobs_agent import queueing as q
from rayjobs_agent.queue import keeper as kp, lost_jobs as ql, store as qs


_keeper = keeper_and_jobs


def _enqueue_order(store: DictStore, job_id: str, *, at_ms: float, queue: str = "team-a", priority: int = 0,
                   spec_hash: str = "hash-1") -> str:
    order = {"verb": "enqueue", "queue": queue, "id": job_id, "name": job_id, "priority": priority,
             "needs": {"CPU": 1.0},
             "request": {"submission_id": job_id, "entrypoint": "python -m rayjobs_agent.supervisor -- 'true'",
                         "metadata": {METADATA_SPEC_HASH: spec_hash}}}
    order_id = q.enqueue_order_id(job_id)
    store.order(order_id, order, start_time_ms=at_ms, metadata={"rayjobs.enqueues": queue})
    return order_id


def test_orders_are_carried_out_in_the_order_ray_took_them_and_answered_in_their_jobs():
    store = DictStore()
    qs.set_limits(store, "team-a", 0)  # nothing starts: the test reads the places
    late = _enqueue_order(store, "late", at_ms=2_000)
    early = _enqueue_order(store, "early", at_ms=1_000)
    keeper, jobs, _ = _keeper(store)
    snapshot = keeper.step()
    assert [job["id"] for job in snapshot["queues"][0]["waiting"]] == ["early", "late"]
    assert json.loads(store.get("waiting/team-a/early"))["submitted"] == 1.0
    assert [(job_id, status) for job_id, status, _ in jobs.settled] == [(early, "STOPPED"), (late, "STOPPED")]
    assert jobs.answer_to(early) == {"queued": "team-a", "position": 1, "waiting": 1, "running": 0,
                                     "max_running": 0}
    assert jobs.answer_to(late)["position"] == 2
    keeper.step()
    assert len(jobs.settled) == 2  # an order is carried out once


def test_an_order_to_enter_a_job_ray_already_has_is_answered_exists_and_enters_nothing():
    store = DictStore()
    store.set_job_status("job-1", "RUNNING", metadata={METADATA_SPEC_HASH: "hash-0"})
    order_id = _enqueue_order(store, "job-1", at_ms=1_000)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.answer_to(order_id)["exists"] == "ray"
    assert jobs.answer_to(order_id)["metadata"] == {METADATA_SPEC_HASH: "hash-0"}
    assert store.keys("waiting/") == []


def test_an_order_is_read_once_ray_has_created_its_supervisor_so_that_ending_it_takes_the_supervisor_down():
    # Ray lists a job before it creates its supervisor: an order ended in between would leave a supervisor created
    # afterwards that, once placed, holds most of the head's resource for ever.
    store = DictStore()
    clock = Clock(1000.0)
    order_id = _enqueue_order(store, "job-1", at_ms=clock.now * 1000)
    keeper, jobs, _ = _keeper(store, clock)
    created = {"yes": False}
    jobs.has_supervisor = lambda job_id: created["yes"]
    keeper.step()
    assert jobs.settled == [] and store.keys("waiting/") == []
    assert keeper.step_due(keeper.note_keys_after_step(), 0.0), "looked at again at the next tick"
    created["yes"] = True
    clock.now += kp.STEP_EVERY_S
    keeper.step()
    assert jobs.answer_to(order_id)["queued"] == "team-a"
    # One whose supervisor never comes (Ray failed to create it) is read all the same once the grace has passed.
    late = _enqueue_order(store, "job-2", at_ms=clock.now * 1000)
    created["yes"] = False
    clock.now += ql.PENDING_GRACE_S
    keeper.step()
    assert jobs.answer_to(late)["queued"] == "team-a"


def test_an_order_that_cannot_be_ended_with_its_answer_holds_up_none_of_the_orders_after_it():
    store = DictStore()
    stuck = _enqueue_order(store, "job-1", at_ms=1_000)
    later = _enqueue_order(store, "job-2", at_ms=2_000)
    keeper, jobs, said = _keeper(store)
    settle = jobs.settle

    def refuse_the_first(job_id, status, message, **kwargs):
        if job_id == stuck:
            raise ConnectionError("the GCS is restarting")
        settle(job_id, status, message, **kwargs)

    jobs.settle = refuse_the_first
    keeper.step()
    assert jobs.answer_to(later)["queued"] == "team-a"
    assert [line for line in said if stuck in line] == [
        f"order {stuck} was carried out, but could not be ended with its answer (ConnectionError: the GCS is "
        "restarting); it is read again"]
    jobs.settle = settle
    keeper.step()
    assert "exists" in jobs.answer_to(stuck) and jobs.ids().count("job-1") == 1, "read again, it enters nothing twice"


def test_the_supervisors_of_orders_that_ended_or_left_rays_table_are_taken_down_and_a_waiting_orders_is_not():
    store = DictStore()
    store.set_job_status("rayjobs-order-enqueue-waits", "PENDING", start_time=0)
    store.set_job_status("rayjobs-order-enqueue-ended", "STOPPED", start_time=0, end_time=0)
    killed: list[str] = []
    jobs = FakeRayJobs(store)
    jobs.supervised_orders = lambda: ["rayjobs-order-enqueue-waits", "rayjobs-order-enqueue-ended",
                                      "rayjobs-order-set-deleted"]
    jobs.kill_supervisor = killed.append
    said: list[str] = []
    assert kp.end_stray_order_supervisors(store, jobs, said.append) == killed == [
        "rayjobs-order-enqueue-ended", "rayjobs-order-set-deleted"]
    assert "held the head's resource" in said[0]
    # The keeper looks as it cleans; a cluster that cannot say is said once, and nothing is killed on it.
    keeper, keeper_jobs, keeper_said = _keeper(store)
    keeper_jobs.supervised_orders = lambda: (_ for _ in ()).throw(ConnectionError("GCS restarting"))
    keeper.step()
    assert [line for line in keeper_said if "supervisors of ended orders" in line] == [
        "could not look for the supervisors of ended orders: ConnectionError: GCS restarting"]


def test_an_order_whose_id_names_another_job_is_refused():
    store = DictStore()
    order = {"verb": "enqueue", "queue": "team-a", "id": "victim",
             "request": {"submission_id": "victim", "entrypoint": "x", "metadata": {}}}
    store.order(q.enqueue_order_id("mine"), order, start_time_ms=1_000)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert "does not enter job" in jobs.answer_to(q.enqueue_order_id("mine"))["error"]
    assert store.keys("waiting/") == []


@pytest.mark.parametrize("job_id", ["team-b/x", "../x", "x; touch /tmp/p", "", "a" * 300])
def test_an_order_whose_job_id_could_be_read_as_another_key_is_refused_and_enters_nothing(job_id):
    store = DictStore()
    qs.set_limits(store, "team-a", 0)
    order = {"verb": "enqueue", "queue": "team-a", "id": job_id,
             "request": {"submission_id": job_id, "entrypoint": "x", "metadata": {}}}
    store.order(q.enqueue_order_id(job_id), order, start_time_ms=1_000)
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": job_id}, start_time_ms=1_001)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert "no job id" in jobs.answer_to(q.enqueue_order_id(job_id))["error"]
    assert jobs.answer_to("rayjobs-order-stop-1") == {"unknown": job_id[:200]}
    assert store.keys("waiting/") == [] and jobs.submitted == []


def test_a_stop_that_comes_right_behind_its_jobs_entry_ends_it_without_running():
    store = DictStore()
    qs.set_limits(store, "team-a", 0)
    _enqueue_order(store, "job-1", at_ms=1_000)
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": "job-1"}, start_time_ms=1_000)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.answer_to("rayjobs-order-stop-1") == {"stopped": "job-1", "was": "waiting", "queue": "team-a"}
    (stand_in,) = jobs.submitted
    assert q.Admission.from_environment(stand_in["runtime_env"]["env_vars"]).outcome == "STOPPED"
    assert store.keys("waiting/") == []


def test_a_stop_of_a_job_nobody_knows_is_answered_unknown():
    store = DictStore()
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": "ghost"}, start_time_ms=1_000)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.answer_to("rayjobs-order-stop-1") == {"unknown": "ghost"}


def test_an_order_of_other_code_makes_the_keeper_step_aside_before_it_carries_out_any():
    store = DictStore()
    _enqueue_order(store, "mine", at_ms=998_000)
    store.set_job_status("rayjobs-order-set-1", "PENDING", start_time=999_000,  # a second before the keeper's now
                         metadata={"rayjobs.agent_version": "other"}, entrypoint=q.HELPER_ENTRYPOINT,
                         runtime_env={"env_vars": {q.REQUEST_ENV_VAR: "an order in a format this code cannot read"}})
    keeper, jobs, _ = _keeper(store)
    with pytest.raises(kp.StepAside):
        keeper.step()
    assert jobs.settled == [] and store.keys("waiting/") == []


def test_a_keeper_whose_steps_keep_failing_goes_stale_so_that_a_helper_replaces_it():
    # The heartbeat is the only thing a helper reads to leave a keeper be: one beaten before a step that then fails
    # would stay current for ever, its orders unanswered and never replaced.
    from rayjobs_agent.queue.actor import BEAT_FRESH_S, keeper_is_current

    store = DictStore()
    clock = Clock(1000.0)
    keeper, _, _ = _keeper(store, clock)
    keeper.step()
    assert keeper_is_current(store, clock.now), "a working keeper is current"

    def broken(now: float) -> None:
        raise ConnectionError("the job table cannot be read")

    keeper._take_orders = broken
    with pytest.raises(ConnectionError):
        keeper.step()  # its first failure comes right after a beat of its own
    assert keeper_is_current(store, clock.now)
    for _ in range(int(BEAT_FRESH_S / kp.STEP_EVERY_S) + 1):
        clock.now += kp.STEP_EVERY_S
        with pytest.raises(ConnectionError):
            keeper.step()
    assert not keeper_is_current(store, clock.now), "a keeper whose every step fails goes stale"
    del keeper._take_orders
    keeper.step()
    assert keeper_is_current(store, clock.now), "one whose steps go through again is current again"


def test_an_unreadable_order_is_answered_and_the_next_one_carried_out():
    store = DictStore()
    store.set_job_status("rayjobs-order-set-1", "PENDING", start_time=1_000,
                         runtime_env={"env_vars": {q.REQUEST_ENV_VAR: "not base64 at all"}})
    store.order("rayjobs-order-set-2", {"verb": "set", "queue": "team-a", "max_running": 2}, start_time_ms=2_000)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert "could not be read" in jobs.answer_to("rayjobs-order-set-1")["error"]
    assert jobs.answer_to("rayjobs-order-set-2")[0]["max_running"] == 2


def test_an_entry_order_stays_in_rays_table_until_its_job_is_there_so_the_id_is_never_free():
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 0)
    order_id = _enqueue_order(store, "job-1", at_ms=1_000)
    store.order("rayjobs-order-set-1", {"verb": "set", "queue": "team-b", "max_running": 1}, start_time_ms=1_000)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    clock.now += qs.HELPER_KEPT_S + kp.CLEAN_EVERY_S + 1
    keeper.step()
    assert jobs.deleted == ["rayjobs-order-set-1"]  # the other order goes; the entry's order holds job-1's id
    qs.set_limits(store, "team-a", 1)
    clock.now += kp.CLEAN_EVERY_S + 1
    keeper.step()  # job-1 is submitted now
    clock.now += kp.CLEAN_EVERY_S + 1
    keeper.step()
    assert jobs.ids() == ["job-1"] and jobs.deleted == ["rayjobs-order-set-1", order_id]


def test_a_job_whose_keeper_died_between_submitting_it_and_forgetting_its_entry_takes_no_second_slot():
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 2)
    enter(store, "job-1", submitted=1)
    enter(store, "job-2", submitted=2)
    keeper, jobs, _ = _keeper(store, clock)
    # The first keeper claimed slot 0 for job-1 and submitted it, then died before it took job-1's entry out.
    qs.claim(store, "team-a", qs.Slot(0, -1), {"id": "job-1", "since": 999.0, "needs": {"CPU": 1.0}})
    store.set_job_status("job-1", "RUNNING")
    keeper.step()
    holders = sorted(holder["id"] for holder in qs.held(qs.slots(store, "team-a", clock.now)).values())
    assert holders == ["job-1", "job-2"] and jobs.ids() == ["job-2"]


def test_a_submission_that_times_out_after_ray_created_the_job_keeps_its_slot():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "slow", submitted=1)
    enter(store, "next", submitted=2)
    keeper, jobs, said = _keeper(store)

    def created_then_timed_out(request):
        store.set_job_status(request["submission_id"], "RUNNING")
        raise TimeoutError("Ray's job API did not answer within 30s")

    jobs.submit = created_then_timed_out
    keeper.step()
    assert [holder["id"] for holder in qs.held(qs.slots(store, "team-a", 1000.0)).values()] == ["slow"]
    assert store.keys("waiting/team-a/slow") == [] and not any("trying again" in line for line in said)
    jobs.submit = FakeRayJobs.submit.__get__(jobs)
    keeper.step()
    assert jobs.ids() == []  # the queue of one still runs one: "slow"


def _retried_job(store: DictStore, job_id: str, *, status: str = "RUNNING", node: str = "node-gone",
                 max_retries: int = 2, queue: str | None = None, backoff_s: float = 5.0, **metadata: str) -> None:
    policy = RetryPolicy(max_retries, ("JOB_SUPERVISOR_ACTOR_DIED",), backoff_s, 300.0)
    store.set_job_status(job_id, status, driver_node_id=node, start_time=900_000, entrypoint="python -m x",
                         entrypoint_num_cpus=1,
                         runtime_env={"working_dir": "gcs://_ray_pkg_code.zip",
                                      "env_vars": {RETRY_ENV_VAR: policy.to_variable()}},
                         metadata={METADATA_SPEC_HASH: "hash-1", "rayjobs.name": "nightly",
                                   **({METADATA_QUEUE: queue, "rayjobs.priority": "3"} if queue else {}), **metadata})


def test_a_job_ray_says_runs_on_a_node_that_is_gone_is_lost_and_submitted_again_after_its_backoff():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1")
    keeper, jobs, said = _keeper(store, clock)
    keeper.step()
    assert jobs.settled == []  # gone at one look only: a second look, a moment later, decides
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert [(job_id, status) for job_id, status, _ in jobs.settled] == [("nightly-1", "FAILED")]
    info = qs.ray_job_info(store, "nightly-1")
    assert info["error_type"] == "JOB_SUPERVISOR_ACTOR_DIED" and "lost with its node" in info["message"]
    decided = keeper.step()["retries"]["nightly-1"]
    assert (decided["retry"], decided["next"], decided["attempt"]) == (True, "nightly-1-attempt2", 2)
    assert "the cluster submits attempt 2 of 3 in 5s" in decided["note"]
    assert jobs.ids() == []
    clock.now += 5 + ql.WATCH_EVERY_S
    keeper.step()
    (request,) = jobs.submitted
    assert request["submission_id"] == "nightly-1-attempt2" and request["entrypoint_num_cpus"] == 1
    assert request["metadata"][METADATA_ATTEMPT] == "2" and request["metadata"][METADATA_PARENT] == "nightly-1"
    assert request["runtime_env"]["working_dir"] == "gcs://_ray_pkg_code.zip"  # no upload: the same code
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert jobs.ids() == ["nightly-1-attempt2"]  # submitted once


def test_a_lost_job_counts_the_attempts_its_wrapper_made_in_place_and_gives_up_after_max_retries():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", status="FAILED")
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    store.put("attempts/nightly-1", json.dumps({"attempt": 3}).encode())  # retried in place twice already
    keeper, jobs, _ = _keeper(store, clock)
    decided = keeper.step()["retries"]["nightly-1"]
    assert decided["retry"] is False and jobs.ids() == []


def test_a_failed_entrypoint_is_left_to_the_agent_beside_it():
    store = DictStore()
    _retried_job(store, "nightly-1", status="FAILED")
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR", end_time=999_000)
    keeper, jobs, _ = _keeper(store)
    assert keeper.step()["retries"] == {} and jobs.ids() == []


def test_a_queued_job_lost_whole_goes_back_into_its_queue_at_its_first_place():
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 0)
    enter(store, "later", submitted=950.0)
    _retried_job(store, "nightly-1", queue="team-a", status="FAILED")
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    store.put("needs/nightly-1", json.dumps({"CPU": 2.0}).encode())
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    clock.now += 5 + ql.WATCH_EVERY_S
    snapshot = keeper.step()
    waiting = snapshot["queues"][0]["waiting"]
    assert [job["id"] for job in waiting] == ["nightly-1-attempt2", "later"]
    assert waiting[0]["priority"] == 3 and waiting[0]["needs"] == {"CPU": 2.0}


def _lost_by_ray_while_holding_the_only_slot(**retry: float) -> tuple[DictStore, Clock, kp.Keeper, FakeRayJobs]:
    """A queue of one: "nightly-1" let in, "later" waiting, then "nightly-1" ended FAILED as lost by Ray's job
    manager (its supervisor died with the head) before the keeper looked (``retry``: its retry rule's settings)."""
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 1)
    enter(store, "nightly-1", submitted=900.0)
    enter(store, "later", submitted=950.0)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == ["nightly-1"]
    _retried_job(store, "nightly-1", queue="team-a", **retry)
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=clock.now * 1000)
    return store, clock, keeper, jobs


def test_a_queued_job_ray_ends_as_lost_keeps_its_slot_until_its_next_attempt_takes_it():
    # The job behind must not take the slot before the keeper decides, or the next attempt waits behind it, first
    # place and all.
    store, clock, keeper, jobs = _lost_by_ray_while_holding_the_only_slot(backoff_s=0.0)
    clock.now += ql.WATCH_EVERY_S / 4  # a step between two of the keeper's looks at lost jobs
    snapshot = keeper.step()
    assert jobs.ids() == ["nightly-1"], snapshot["queues"]
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert jobs.ids() == ["nightly-1", "nightly-1-attempt2"]
    assert [job_id for job_id, _ in qs.waiting(store, "team-a")] == ["later"]


def test_a_lost_jobs_slot_waits_through_its_backoff_for_the_attempt_that_goes_back_to_its_place():
    store, clock, keeper, jobs = _lost_by_ray_while_holding_the_only_slot(backoff_s=5.0)
    clock.now += ql.WATCH_EVERY_S
    decided = keeper.step()["retries"]["nightly-1"]
    assert decided["retry"] and decided["due"] == clock.now + 5.0
    clock.now += 4.0  # within its backoff: the slot stays with the run
    keeper.step()
    assert jobs.ids() == ["nightly-1"]
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert jobs.ids() == ["nightly-1", "nightly-1-attempt2"]
    assert [job_id for job_id, _ in qs.waiting(store, "team-a")] == ["later"]


def test_a_lost_jobs_slot_frees_if_no_keeper_decides_about_it_within_the_hold():
    store, clock, keeper, _ = _lost_by_ray_while_holding_the_only_slot()
    ended = clock.now
    assert qs.held(qs.slots(store, "team-a", ended + qs.LOST_UNDECIDED_HOLD_S))
    assert not qs.held(qs.slots(store, "team-a", ended + qs.LOST_UNDECIDED_HOLD_S + 1))


def test_an_id_deleted_from_rays_table_and_submitted_again_is_looked_at_again_when_lost():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", status="SUCCEEDED")
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()  # ended: the keeper no longer reads it
    store.set_job_status("nightly-1", None)  # `rayjobs delete nightly-1`
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    _retried_job(store, "nightly-1", status="FAILED")  # the same id submitted again, lost whole
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=clock.now * 1000)
    clock.now += ql.WATCH_EVERY_S
    assert keeper.step()["retries"]["nightly-1"]["retry"] is True


def test_a_slot_whose_job_was_lost_and_will_not_run_again_is_free_for_the_next_in_line():
    _, clock, keeper, jobs = _lost_by_ray_while_holding_the_only_slot(max_retries=0)
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert jobs.ids() == ["nightly-1", "later"]


def test_a_slot_of_a_job_the_keeper_never_retries_is_free_at_once_when_ray_ends_it_as_lost():
    # Its entry came with no spec (another hand's): no keeper decides about it, so nothing is waited for.
    store, clock, keeper, jobs = _lost_by_ray_while_holding_the_only_slot()
    info = qs.ray_job_info(store, "nightly-1")
    metadata = {key: value for key, value in info["metadata"].items() if key != METADATA_SPEC_HASH}
    store.set_job_status("nightly-1", "FAILED", metadata=metadata)
    clock.now += ql.WATCH_EVERY_S / 4
    keeper.step()
    assert jobs.ids() == ["nightly-1", "later"]


def test_a_stop_of_a_lost_job_waiting_for_its_next_attempt_submits_none():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", status="FAILED")
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": "nightly-1"}, start_time_ms=1_001_000)
    clock.now += 1
    keeper.step()
    assert jobs.answer_to("rayjobs-order-stop-1") == {"stopped": "nightly-1", "was": "waiting to be submitted again"}
    clock.now += 600
    keeper.step()
    assert jobs.ids() == []


def test_a_job_that_is_not_rayjobs_own_is_never_retried_by_the_keeper():
    store = DictStore()
    clock = Clock(1000.0)
    store.set_job_status("theirs", "RUNNING", driver_node_id="node-gone", metadata={})
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    clock.now += ql.WATCH_EVERY_S
    keeper.step()
    assert jobs.settled == [] and qs.job_status(store, "theirs") == "RUNNING"


def test_a_cluster_that_names_no_live_node_at_all_loses_no_job():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", node="node-1")
    store.nodes = set()  # the autoscaler's view answered empty for a moment
    keeper, jobs, _ = _keeper(store, clock)
    for _ in range(3):
        keeper.step()
        clock.now += ql.WATCH_EVERY_S
    assert jobs.settled == []


def test_next_attempt_ids_skip_ids_an_earlier_run_of_the_same_fixed_id_used():
    ended = {"nightly-attempt2": "FAILED", "nightly-attempt2-2": "SUCCEEDED"}
    assert ql.next_attempt_id("nightly", 2, ended.get) == "nightly-attempt2-3"
    assert ql.next_attempt_id("nightly", 2, {"nightly-attempt2": "RUNNING"}.get) == "nightly-attempt2"


def test_a_job_that_takes_what_is_free_is_let_in_with_all_of_it_and_the_next_one_waits_for_it():
    # Its auto layout declares one CPU and takes every free CPU when it starts: the queue counts what it will take.
    store = DictStore(free={"CPU": 4.0})
    enter(store, "auto-1", submitted=1, needs={"CPU": 1.0})
    enter(store, "auto-2", submitted=2, needs={"CPU": 1.0})
    for job_id in ("auto-1", "auto-2"):
        entry = json.loads(store.get(f"waiting/team-a/{job_id}"))
        store.put(f"waiting/team-a/{job_id}", json.dumps({**entry, "grows": ["CPU"]}).encode())
    keeper, jobs, _ = _keeper(store)
    snapshot = keeper.step()
    (first,) = jobs.submitted
    admission = q.Admission.from_environment(first["runtime_env"]["env_vars"])
    assert admission.granted == {"CPU": 4.0}
    assert snapshot["queues"][0]["running"][0]["needs"] == {"CPU": 4.0}
    assert snapshot["queues"][0]["waiting"][0]["reason"] == "needs 1 CPU, 0 free"


def test_a_grant_leaves_out_what_the_entrypoint_holds_and_never_falls_below_what_the_workers_need():
    store = DictStore(free={"CPU": 3.0})
    enter(store, "auto", needs={"CPU": 2.0})  # one worker of one CPU, and an entrypoint of one
    request = json.loads(store.get("request/auto"))
    store.put("request/auto", json.dumps({**request, "entrypoint_num_cpus": 1}).encode())
    entry = json.loads(store.get("waiting/team-a/auto"))
    store.put("waiting/team-a/auto", json.dumps({**entry, "grows": ["CPU"]}).encode())
    keeper, jobs, _ = _keeper(store)
    snapshot = keeper.step()
    assert q.Admission.from_environment(jobs.submitted[0]["runtime_env"]["env_vars"]).granted == {"CPU": 2.0}
    assert snapshot["queues"][0]["running"][0]["needs"] == {"CPU": 3.0}


class _HeadsApi:
    """Ray's state API of a cluster whose head restarted: the node table keeps the dead head beside the new one, and
    the log API serves only a live node's files (``heads``: node id → alive, in the order the table lists them)."""

    def __init__(self, heads: dict[str, bool]) -> None:
        self.heads = heads
        self.read_from: list[str] = []

    def get_json(self, path: str) -> dict:
        nodes = [{"node_id": node, "is_head_node": True, "state": "ALIVE" if alive else "DEAD"}
                 for node, alive in self.heads.items()]
        return {"data": {"result": {"result": nodes}}}

    def get_raw(self, path: str) -> bytes:
        from urllib.parse import parse_qs, urlsplit

        from runner.errors import ClusterRequestFailed

        node = parse_qs(urlsplit(path).query)["node_id"][0]
        self.read_from.append(node)
        if not self.heads.get(node):
            raise ClusterRequestFailed(f"(500): Agent for node id: {node} doesn't exist.")
        return json.dumps({"at": 1.0, "queues": [{"queue": "team-a", "max_running": 1}]}).encode()


def test_the_snapshot_is_read_from_the_live_head_when_the_node_table_still_lists_the_dead_one():
    from runner.client.queue import ClusterQueue

    api = _HeadsApi({"old-head": False, "new-head": True})
    assert ClusterQueue(api).describe("team-a") == [{"queue": "team-a", "max_running": 1}]
    assert api.read_from == ["new-head"]


def test_a_client_that_knew_the_head_before_it_restarted_finds_the_new_one():
    from runner.client.queue import ClusterQueue

    api = _HeadsApi({"old-head": True})
    queue = ClusterQueue(api)
    assert queue.snapshot() is not None
    api.heads = {"old-head": False, "new-head": True}
    assert queue.snapshot() is not None
    assert api.read_from == ["old-head", "old-head", "new-head"]


def test_a_queued_job_lost_whole_goes_back_ahead_of_the_jobs_that_entered_its_queue_while_it_waited():
    # Its first place is where it entered its queue, not the moment its turn came and Ray took it: a job entered
    # while it waited must not overtake its next attempt.
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 1)
    policy = RetryPolicy(1, ("JOB_SUPERVISOR_ACTOR_DIED",), 0.0, 0.0)
    for job_id, submitted in (("first", 10.0), ("second", 20.0)):
        enter(store, job_id, submitted=submitted, needs={})
        request = json.loads(store.get(f"request/{job_id}"))
        request.update(runtime_env={"env_vars": {RETRY_ENV_VAR: policy.to_variable()}},
                       metadata={METADATA_SPEC_HASH: "hash-1", METADATA_QUEUE: "team-a", "rayjobs.name": job_id})
        store.put(f"request/{job_id}", json.dumps(request).encode())
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == ["first"]
    store.set_job_status("first", "RUNNING", start_time=clock.now * 1000)  # Ray took it when its turn came
    store.nodes = {"node-of-the-restarted-head"}  # its driver's node is gone
    for _ in range(3):
        clock.now += ql.WATCH_EVERY_S
        keeper.step()
    assert qs.job_status(store, "first") == "FAILED"
    assert [request["submission_id"] for request in jobs.submitted] == ["first", "first-attempt2"]
    assert [job_id for job_id, _ in qs.waiting(store, "team-a")] == ["second"]


def test_the_stand_in_of_a_job_stopped_while_it_waited_is_never_run_again_when_it_is_lost_whole():
    # The stand-in only writes the job's record and asks Ray to stop it; if the head dies first, nothing may run.
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 0)
    enter(store, "doomed", submitted=10.0, needs={})
    request = json.loads(store.get("request/doomed"))
    request.update(runtime_env={"env_vars": {RETRY_ENV_VAR: RetryPolicy(2, ("JOB_SUPERVISOR_ACTOR_DIED",), 0.0,
                                                                         0.0).to_variable()}},
                   metadata={METADATA_SPEC_HASH: "hash-1", METADATA_QUEUE: "team-a", "rayjobs.name": "doomed"})
    store.put("request/doomed", json.dumps(request).encode())
    keeper, jobs, _ = _keeper(store, clock)
    assert keeper.stop("doomed", clock.now)["was"] == "waiting"
    assert jobs.ids() == ["doomed"]  # its stand-in
    store.nodes = {"node-of-the-restarted-head"}
    for _ in range(3):
        clock.now += ql.WATCH_EVERY_S
        snapshot = keeper.step()
    assert qs.job_status(store, "doomed") == "FAILED"
    assert jobs.ids() == ["doomed"] and qs.waiting(store, "team-a") == []
    assert snapshot["retries"]["doomed"]["retry"] is False


@pytest.mark.parametrize(("was", "said"), [("waiting", "queued"), ("running", "stopped"), ("ended", "ended"),
                                           ("waiting to be submitted again", "withdrawn"),
                                           (None, "requested")])  # a helper job took the stop: no more is known
def test_a_stop_says_what_the_keeper_found_even_when_the_jobs_turn_came_while_the_stop_was_on_its_way(
        monkeypatch, was, said):
    # Ray did not know the job yet, so the stop went to the queue; the keeper let it in before it read the stop.
    from runner.client import queue as client_queue
    from runner.errors import JobNotFound

    class Api:
        address = "http://cluster"

        def stop_job(self, job_id: str) -> bool:
            raise JobNotFound(job_id)

    monkeypatch.setattr(client_queue.ClusterQueue, "place_of", lambda self, job_id, snapshot=None: {"id": job_id})
    monkeypatch.setattr(client_queue.ClusterQueue, "stop", lambda self, job_id: (
        {"stopped": job_id, "was": was} if was else {"stopping": job_id}))
    assert client_queue.stop_job(Api(), "job-1") == client_queue.StopFound(said)


_ENTERED = {"queued": "team-a", "position": 2, "waiting": 2}


# How a job under an enqueue order's id differs from what the client sends (None: as sent).
_NEIGHBOURS = {
    "its own command": {"entrypoint": "python -c 'print(\"rayjobs-queue {}\")'"},
    "the helper's command with its own code": {"runtime_env": {"working_dir": "gcs://_ray_pkg_theirs.zip"}},
    "the helper's command, another job's order": {"order_of": "job-2"},
}


@pytest.mark.parametrize(("answered_by", "published_at", "waits"), [
    ("keeper", 100.0, True),  # it answered the order (the job is in its queue) and died before it published
    ("keeper", 110.0, False),  # it published after it answered: a job missing from that snapshot is gone
    ("helper", None, True),  # no keeper was alive, and on a head just restarted none has published yet
    # Jobs of someone else's under the order's id that print an answer line: in their log, or in the message Ray
    # writes from a failed job's last lines.
    *((name, None, False) for name in _NEIGHBOURS),
    ("a neighbour that failed", 100.0, False),
])
def test_a_job_entered_after_the_last_snapshot_still_waits_for_its_follower(answered_by, published_at, waits):
    # Until a keeper publishes again, the job is missing from the snapshot, and its follower must not call it gone.
    # A helper job's answer is in its log, not in a message; a log is trusted only from what the client sends.
    from runner.client import queue as client_queue
    from runner.errors import JobNotFound

    order_id = q.enqueue_order_id("job-1")
    differs = dict(_NEIGHBOURS.get(answered_by, {}))
    order = {"verb": "enqueue", "id": differs.pop("order_of", "job-1"), "format": q.ORDER_FORMAT}
    sent = q.order_submission(order, order_id, ["gcs://_ray_pkg_agent.zip"],
                              {"rayjobs.enqueues": "team-a", "rayjobs.priority": "5"})
    status, message = {"keeper": ("STOPPED", q.answer_text(_ENTERED)),
                       "a neighbour that failed": ("FAILED", "Job entrypoint command failed with exit code 1, last "
                                                             f"available logs:\n{q.answer_text(_ENTERED)}\n")
                       }.get(answered_by, ("SUCCEEDED", "Job finished successfully."))

    class Api:
        address = "http://cluster"

        def get_job(self, job_id: str) -> dict:
            if job_id != order_id:
                raise JobNotFound(job_id)
            return {**sent, **differs, "status": status, "start_time": 104_000, "end_time": 105_000,
                    "driver_node_id": "head", "message": message}

        def job_log(self, job_id: str, tail: int | None = None, driver_node_id: str | None = None) -> str:
            assert (job_id, driver_node_id) == (order_id, "head") and tail is not None
            return "starting\n" + q.answer_text(_ENTERED) + "\n"

    snapshot = {} if published_at is None else {
        "at": published_at, "queues": [{"queue": "team-a", "max_running": 1, "running": [], "waiting": []}]}
    place = client_queue.ClusterQueue(Api()).place_of("job-1", snapshot)
    assert (place is not None) == waits
    if waits:
        assert place["queue"] == "team-a" and place["priority"] == 5 and "published" in place["reason"]


def test_a_stop_of_a_lost_job_says_it_had_ended_or_that_its_next_attempt_is_withdrawn_never_that_it_never_starts(
        monkeypatch):
    # The keeper had submitted the next attempt by the time the stop came: the stop finds the lost job ended. Or the
    # next attempt was still due: the stop withdraws it. Either way the job had run, so the stop must not say that it
    # was taken out of a queue and never starts.
    from runner.client import queue as client_queue

    class Api:
        address = "http://cluster"

        def stop_job(self, job_id: str) -> bool:
            return False  # it ended (FAILED, lost)

    monkeypatch.setattr(client_queue.ClusterQueue, "decision_about",
                        lambda self, job_id: {"retry": True, "next": f"{job_id}-attempt2"})
    monkeypatch.setattr(client_queue.ClusterQueue, "stop", lambda self, job_id: {"stopped": job_id, "was": "ended"})
    assert client_queue.stop_job(Api(), "job-1") == client_queue.StopFound("ended")
    monkeypatch.setattr(client_queue.ClusterQueue, "stop",
                        lambda self, job_id: {"stopped": job_id, "was": "waiting to be submitted again"})
    assert client_queue.stop_job(Api(), "job-1") == client_queue.StopFound("withdrawn")


@pytest.mark.parametrize("supervisor", [False, True])
def test_a_job_whose_supervisor_went_with_the_head_before_it_started_is_lost_and_retried_at_once(supervisor):
    # Ray's job manager waits out its start timeout (15 min) for a PENDING job whose supervisor it cannot find; the
    # job holds its queue slot meanwhile. A supervisor that exists (its job waits for resources) is left alone.
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", status="PENDING", node="", queue="team-a")
    store.set_job_status("nightly-1", "PENDING", start_time=(clock.now - ql.PENDING_GRACE_S) * 1000)
    keeper, jobs, _ = _keeper(store, clock)
    jobs.has_supervisor = lambda job_id: supervisor
    for _ in range(2):
        keeper.step()
        clock.now += ql.WATCH_EVERY_S
    snapshot = keeper.step()
    if supervisor:
        assert qs.job_status(store, "nightly-1") == "PENDING" and jobs.settled == []
    else:
        assert [(job_id, status) for job_id, status, _ in jobs.settled] == [("nightly-1", "FAILED")]
        assert snapshot["retries"]["nightly-1"]["next"] == "nightly-1-attempt2"


def test_a_stop_of_a_lost_job_whose_next_attempt_runs_stops_that_attempt():
    store = DictStore()
    clock = Clock(1000.0)
    _retried_job(store, "nightly-1", status="FAILED", max_retries=2)
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    clock.now += 5 + kp.WATCH_EVERY_S
    keeper.step()
    assert jobs.ids() == ["nightly-1-attempt2"]
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": "nightly-1"}, start_time_ms=clock.now * 1000)
    keeper.step()
    assert jobs.answer_to("rayjobs-order-stop-1") == {"stopped": "nightly-1", "was": "running",
                                                       "attempt": "nightly-1-attempt2"}
    assert jobs.stopped[-1] == "nightly-1-attempt2"
    from runner.client import queue as client_queue

    assert client_queue._what_the_stop_found(jobs.answer_to("rayjobs-order-stop-1")) == client_queue.StopFound(
        "stopped", "nightly-1-attempt2")


def test_a_stop_of_a_lost_job_whose_next_attempt_waits_in_its_queue_names_that_attempt_not_the_job_that_ran():
    # The job had run: "waiting in its queue: it never starts" is true of its next attempt only.
    from runner.client import queue as client_queue

    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 0)  # nothing is let in: the next attempt waits in the queue
    _retried_job(store, "nightly-1", status="FAILED", queue="team-a")
    store.set_job_status("nightly-1", "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    clock.now += 5 + kp.WATCH_EVERY_S
    keeper.step()
    assert [job_id for job_id, _ in qs.waiting(store, "team-a")] == ["nightly-1-attempt2"]
    store.order("rayjobs-order-stop-1", {"verb": "stop", "id": "nightly-1"}, start_time_ms=clock.now * 1000)
    keeper.step()
    found = client_queue._what_the_stop_found(jobs.answer_to("rayjobs-order-stop-1"))
    assert found == client_queue.StopFound("queued", "nightly-1-attempt2")


@pytest.mark.parametrize("hangs", ["starting the keeper", "leaving after its answer"])
def test_a_helper_job_that_hangs_answers_with_what_it_did_and_leaves_so_that_the_head_is_free_for_a_keeper(tmp_path,
                                                                                                          hangs):
    # A helper holds most of the head's resource: one hung in starting the keeper, or in Ray's shutdown once it has
    # answered, would keep every order waiting. Either way it answers once, with what the order did.
    from rayjobs_agent.pinning import ADDRESS_VARIABLE
    from tests.support.waiting import HANG_GUARD_S

    script = tmp_path / "hung_helper.py"
    script.write_text(
        "import sys, time\n"
        "from rayjobs_agent.queue import orders\n"
        "from tests.support.queue_store import DictStore\n"
        "store = DictStore()\n"
        "orders.GcsKeyValue = lambda address: store\n"
        f"orders.ensure_keeper = lambda store, now: time.sleep(3600 if {hangs == 'starting the keeper'} else 0)\n"
        "orders.HELPER_DEADLINE_S = 0.5\n"
        "code = orders.main()\n"
        "time.sleep(3600)\n"
        "sys.exit(code)\n")
    environ = {**q.order_variables({"verb": "set", "queue": "team-a", "max_running": 1, "format": q.ORDER_FORMAT}),
               ADDRESS_VARIABLE: "127.0.0.1:1"}
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, **environ, "PYTHONPATH": repo},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    # The order was carried out before the hang: its one answer says so.
    assert [line for line in done.stdout.splitlines() if line.startswith(q.ANSWER_MARKER)] == [q.answer_text(
        [{"queue": "team-a", "max_running": 1, "running": [], "waiting": []}])]
    assert "ran past 0.5s and leaves" in done.stdout


_SHARE = q.ORDER_RESOURCES[q.HEAD_RESOURCE]


@pytest.mark.parametrize(("asked", "sent_s_ago", "aside_s_ago", "refused"), [
    (1.0, 0.0, None, True),  # older code asked for the whole head: never placed where other code holds a sliver
    (_SHARE, 90.0, q.OTHER_CODE_PLACED_WITHIN_S, True),  # a keeper stepped aside for it long ago: never placed
    (_SHARE, 1.0, None, False),  # just sent: the keeper steps aside for it
    # Sent long ago while a helper or a keeper being replaced held the head, and never stepped aside for: its time
    # counts from the first keeper that steps aside, not from when it was sent.
    (_SHARE, q.OTHER_CODE_PLACED_WITHIN_S + 30, None, False),
    (_SHARE, 90.0, 1.0, False),
    # What no keeper wrote for this order is not believed: it counts from now.
    (_SHARE, 90.0, "an earlier order of the same id", False),
    (_SHARE, 90.0, "in the future", False),
    (_SHARE, 90.0, "not a time", False),
])
def test_an_order_of_other_code_that_could_never_be_placed_is_refused_not_stepped_aside_for(
        asked, sent_s_ago, aside_s_ago, refused):
    # A keeper that stepped aside for such an order would leave it waiting, and so would every keeper after it.
    store = DictStore()
    clock = Clock(1000.0)
    mine = _enqueue_order(store, "mine", at_ms=(clock.now - sent_s_ago - 1) * 1000)
    store.set_job_status("rayjobs-order-set-1", "PENDING", start_time=(clock.now - sent_s_ago) * 1000,
                         metadata={"rayjobs.agent_version": "other"}, entrypoint=q.HELPER_ENTRYPOINT,
                         entrypoint_resources={q.HEAD_RESOURCE: asked},
                         runtime_env={"env_vars": q.order_variables({"verb": "set", "queue": "team-a",
                                                                     "max_running": 1, "format": q.ORDER_FORMAT})})
    sent = clock.now - sent_s_ago
    kept = {"an earlier order of the same id": {"sent": sent - 3600, "since": sent - 3600},
            "in the future": {"sent": sent, "since": clock.now + 3600},
            "not a time": {"sent": sent, "since": "yesterday"}}.get(aside_s_ago)
    if aside_s_ago is not None:
        kept = kept or {"sent": sent, "since": clock.now - aside_s_ago}
        store.put(f"{qs.STEPPED_ASIDE_PREFIX}rayjobs-order-set-1", json.dumps(kept).encode())
        aside_s_ago = aside_s_ago if isinstance(aside_s_ago, float) else None
    keeper, jobs, _ = _keeper(store, clock)
    if not refused:
        with pytest.raises(kp.StepAside):
            keeper.step()
        # The keeper started next steps aside as well, until the order has waited that long since the first did.
        clock.now += q.OTHER_CODE_PLACED_WITHIN_S - (aside_s_ago or 0) - 1
        with pytest.raises(kp.StepAside):
            _keeper(store, clock)[0].step()
        clock.now += 1
        keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert "upgrade rayjobs" in jobs.answer_to("rayjobs-order-set-1")["error"]
    assert jobs.answer_to(mine)["queued"] == "team-a"
    assert qs.max_running(store, "team-a") is None, "the other code's order was not carried out"
    keeper.step()
    assert store.keys(qs.STEPPED_ASIDE_PREFIX) == [], "what was kept of an order that waits no more is forgotten"


def test_a_helper_whose_keeper_could_not_be_started_answers_what_the_order_did(monkeypatch, capsys):
    # The order stands (the job waits in its queue): telling the client it failed would have it called gone.
    from rayjobs_agent.queue import orders

    done = [{"queue": "team-a", "max_running": 1, "running": [], "waiting": []}]

    def carried_out_then_no_keeper(environ, reply):
        reply.result = done
        raise ConnectionError("the GCS did not answer")

    monkeypatch.setattr(orders, "helper", carried_out_then_no_keeper)
    monkeypatch.setattr(orders, "HELPER_DEADLINE_S", None)  # no timer in this process
    assert orders.main() == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith(q.ANSWER_MARKER)] == [q.answer_text(done)]
    assert "no keeper could be started (ConnectionError: the GCS did not answer)" in out


def test_a_helper_whose_keeper_could_not_be_started_says_so_in_its_answer_and_the_client_prints_it(monkeypatch,
                                                                                                   capsys):
    # Told only "queued", a user would wait for a keeper that never comes: the answer carries why, and the client
    # says it once, the order's result kept as it was.
    from rayjobs_agent.queue import orders
    from runner.client.queue import ClusterQueue

    done = {"queued": "team-a", "position": 1}

    def carried_out_then_no_keeper(environ, reply):
        reply.result = done
        raise ConnectionError("the GCS did not answer")

    monkeypatch.setattr(orders, "helper", carried_out_then_no_keeper)
    monkeypatch.setattr(orders, "HELPER_DEADLINE_S", None)
    assert orders.main() == 0
    log = capsys.readouterr().out
    answered = q.answer_in(log)
    assert answered == {**done, q.NO_KEEPER_ANSWER_KEY: "ConnectionError: the GCS did not answer"}

    class EndedHelper:  # Ray's job API as the client reads an order that ran as a helper job
        def get_job(self, order_id):
            return {"submission_id": order_id, "status": "SUCCEEDED", "message": "", "driver_node_id": "head"}

        def job_log(self, order_id, tail=None, driver_node_id=None):
            return "".join(log.splitlines(keepends=True)[-tail:]) if tail else log

    assert ClusterQueue(EndedHelper()).answer("rayjobs-order-enqueue-x")["queued"] == "team-a"
    said = capsys.readouterr().err
    assert "could not start the queue's keeper (ConnectionError: the GCS did not answer)" in said
    assert said.count("rayjobs: ") == 1


@pytest.mark.processes
def test_a_helper_whose_answer_is_stuck_in_a_blocked_print_ends_at_its_deadline_without_writing(tmp_path):
    # The deadline's own print would block on the same pipe: the process ends before writing anything.
    done = _run_helper_script(tmp_path, "blocked_helper.py",
                              "from rayjobs_agent.queue import orders\n"
                              "orders.ANSWER_LOCK_WAIT_S = 0.2\n"
                              "reply = orders.Reply(0.3)\n"
                              "reply._lock.acquire()  # as a main thread blocked in its answer's print holds it\n"
                              "import time; time.sleep(3600)\n")
    assert done.returncode == 1 and done.stdout == ""


def test_a_stop_follows_a_job_lost_twice_to_the_attempt_that_runs_and_a_looping_chain_ends():
    store = DictStore()
    clock = Clock(1000.0)
    keeper, jobs, _ = _keeper(store, clock)
    for job_id in ("nightly-1", "nightly-1-attempt2"):
        _retried_job(store, job_id, status="FAILED")
        store.set_job_status(job_id, "FAILED", error_type="JOB_SUPERVISOR_ACTOR_DIED", end_time=999_000)
    _retried_job(store, "nightly-1-attempt3", status="RUNNING", node="node-1")
    store.put("lost/nightly-1", json.dumps({"retry": True, "next": "nightly-1-attempt2"}).encode())
    store.put("lost/nightly-1-attempt2", json.dumps({"retry": True, "next": "nightly-1-attempt3"}).encode())
    found = keeper.stop("nightly-1", clock.now)
    assert (found["stopped"], found["attempt"], found["was"]) == ("nightly-1", "nightly-1-attempt3", "running")

    # Written by another hand, the chain loops back: the stop ends, saying the job had ended.
    store.put("lost/nightly-1-attempt2", json.dumps({"retry": True, "next": "nightly-1"}).encode())
    store.set_job_status("nightly-1-attempt3", "FAILED", end_time=999_000)
    found = keeper.stop("nightly-1", clock.now)
    assert (found["stopped"], found["was"]) == ("nightly-1", q.STOP_FOUND_ENDED)


def test_a_head_clock_behind_the_orders_sending_keeps_the_time_a_keeper_first_stepped_aside():
    # Reset at every step, the time would never reach the window and the order would be stepped aside for forever.
    store = DictStore()
    sent = 2000.0
    assert qs.stepped_aside_since(store, {"order-1": sent}, now=1990.0) == {"order-1": sent}
    assert qs.stepped_aside_since(store, {"order-1": sent}, now=1995.0) == {"order-1": sent}
    assert qs.stepped_aside_since(store, {"order-1": sent}, now=2100.0) == {"order-1": sent}


def test_a_sending_just_beyond_the_clock_skew_keeps_the_time_first_stepped_aside_as_the_clock_comes_near():
    store = DictStore()
    now = 1000.0
    sent = now + qs.ORDER_CLOCK_SKEW_S + 1  # far ahead at the first look: counted from the head's present
    assert qs.stepped_aside_since(store, {"order-1": sent}, now=now) == {"order-1": now}
    for later in (now + 2, now + qs.ORDER_CLOCK_SKEW_S, sent + 10):
        assert qs.stepped_aside_since(store, {"order-1": sent}, now=later) == {"order-1": now}
    # A time no keeper writes (written by another hand, or by a clock that stepped back) is replaced.
    for written in (sent - 50, sent + 500):
        store.put("aside/order-1", json.dumps({"sent": sent, "since": written}).encode())
        assert qs.stepped_aside_since(store, {"order-1": sent}, now=now + 10) == {"order-1": sent}


def test_keepers_step_aside_for_a_bounded_number_of_orders_of_other_code_and_refuse_the_rest_at_once():
    # Anyone who can submit a job can send an "order of other code" under a fresh id every minute: each would cost
    # the queue a keeper's restart. Past the bound they are refused at once, and the window passing lets one in.
    store = DictStore()
    clock = Clock(10_000.0)

    def other_code_order(index: int) -> str:
        order_id = f"rayjobs-order-set-flood{index}"
        store.set_job_status(order_id, "PENDING", start_time=clock.now * 1000, metadata={"rayjobs.agent_version": "x"},
                             entrypoint=q.HELPER_ENTRYPOINT,
                             entrypoint_resources={q.HEAD_RESOURCE: q.ORDER_RESOURCES[q.HEAD_RESOURCE]},
                             runtime_env={"env_vars": q.order_variables({"verb": "set", "queue": "team-a",
                                                                         "max_running": 1, "format": q.ORDER_FORMAT})})
        return order_id

    for index in range(q.MOST_STEP_ASIDES):
        order_id = other_code_order(index)
        with pytest.raises(kp.StepAside):
            _keeper(store, clock)[0].step()
        with pytest.raises(kp.StepAside):  # the same order again (its own keeper not up yet): no new step-aside
            _keeper(store, clock)[0].step()
        store.set_job_status(order_id, "STOPPED")  # carried out by a keeper of its code
        clock.now += 50
    flood = other_code_order(q.MOST_STEP_ASIDES)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert "stepped aside for 5 such orders within 10 minutes" in jobs.answer_to(flood)["error"]
    clock.now += q.STEP_ASIDE_WINDOW_S
    other_code_order(q.MOST_STEP_ASIDES + 1)
    with pytest.raises(kp.StepAside):
        _keeper(store, clock)[0].step()


@pytest.mark.processes
def test_a_helper_whose_stdout_blocks_outside_its_answer_still_ends_at_its_deadline(tmp_path):
    # The deadline's timer takes the lock and prints the answer; a stdout that blocks would hold it there for good.
    done = _run_helper_script(tmp_path, "blocked_stdout.py",
                              "import time\n"
                              "from rayjobs_agent.queue import orders\n"
                              "orders.ANSWER_LOCK_WAIT_S = 0.2\n"
                              "orders.answer = lambda document: time.sleep(3600)  # a print to a pipe nobody reads\n"
                              "reply = orders.Reply(0.3)\n"
                              "time.sleep(3600)\n")
    assert done.returncode == 1


def _run_helper_script(tmp_path: Path, name: str, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` as a Python script with the project importable, bounded by the hang guard."""
    from tests.support.waiting import HANG_GUARD_S

    script = tmp_path / name
    script.write_text(body)
    repo = str(Path(__file__).resolve().parents[1])
    return subprocess.run([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": repo},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_a_job_under_an_orders_id_that_is_no_helper_or_stamped_far_ahead_is_never_stepped_aside_for_long():
    # A neighbour may submit any job under an order's id, with any metadata and a start time of its choosing.
    store = DictStore()
    clock = Clock(10_000.0)
    store.set_job_status("rayjobs-order-set-fake", "PENDING", start_time=clock.now * 1000,
                         metadata={"rayjobs.agent_version": "x"}, entrypoint="sleep 3600",
                         entrypoint_resources={"no-such-resource": 1.0})
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()  # no step-aside: it is refused at once
    assert "upgrade rayjobs" in jobs.answer_to("rayjobs-order-set-fake")["error"]

    ahead = "rayjobs-order-set-ahead"
    store.set_job_status(ahead, "PENDING", start_time=(clock.now + 10 ** 6) * 1000,
                         metadata={"rayjobs.agent_version": "x"}, entrypoint=q.HELPER_ENTRYPOINT,
                         entrypoint_resources=dict(q.ORDER_RESOURCES))
    with pytest.raises(kp.StepAside):
        _keeper(store, clock)[0].step()
    clock.now += q.OTHER_CODE_PLACED_WITHIN_S
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert "upgrade rayjobs" in jobs.answer_to(ahead)["error"], "its time to be placed ran out all the same"
    store.put(qs.STEP_ASIDE_LOG_KEY, json.dumps({"o": 10 ** 400}).encode())
    assert qs.order_to_step_aside_for(store, [], {}, clock.now) == (None, q.UNPLACEABLE_ORDER)
