"""The queue's rules, decided by its keeper on a key-value store that behaves as the cluster's does.

The cluster's own store and a real keeper are used by tests/test_queue_cluster.py; here the store is a dict
(put-if-absent atomic, as the GCS's is) and Ray's job API a list of what was submitted.
"""

from __future__ import annotations

import json
import random
import threading

import pytest

from tests.support.cli import REPO_ROOT
from tests.support.queue_store import Clock, DictStore, FakeRayJobs, enter
from rayjobs_agent import queueing as q
from rayjobs_agent.wire import RAY_JOB_CONFIG_ENV_VAR
from rayjobs_agent.queue import keeper as kp, orders as qo, ray_jobs as rj, store as qs


def _keeper(store: DictStore, clock: Clock | None = None) -> tuple[kp.Keeper, FakeRayJobs, list[str]]:
    jobs, said = FakeRayJobs(store), []
    return kp.Keeper(store, jobs, clock=clock or Clock(), say=said.append), jobs, said


def _end(store: DictStore, job_id: str) -> None:
    """The job ended and its wrapper gave its slot back, as supervisor.py does."""
    store.set_job_status(job_id, "SUCCEEDED")
    for key in store.keys("slot/"):
        holder = json.loads(store.get(key))
        if holder["id"] == job_id:
            _, queue, index, generation = key.split("/")
            qs.release(store, queue, int(index), int(generation))


def test_the_first_by_priority_then_submission_time_goes_first():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "early-low", priority=0, submitted=1.0)
    enter(store, "late-high", priority=5, submitted=2.0)
    enter(store, "later-high", priority=5, submitted=3.0)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == ["late-high"]
    _end(store, "late-high")
    keeper.step()
    _end(store, "later-high")
    keeper.step()
    assert jobs.ids() == ["late-high", "later-high", "early-low"]


def test_a_full_queue_says_how_many_of_how_many_run_and_where_each_waiting_job_stands():
    store = DictStore()
    qs.set_limits(store, "team-a", 2)
    for index, name in enumerate("abcd"):
        enter(store, name, submitted=index)
    keeper, jobs, _ = _keeper(store)
    snapshot = keeper.step()
    assert jobs.ids() == ["a", "b"]
    (queue,) = snapshot["queues"]
    assert [job["id"] for job in queue["running"]] == ["a", "b"]
    assert [(job["id"], job["position"], job["reason"]) for job in queue["waiting"]] == [
        ("c", 1, "2 of 2 running in queue team-a"), ("d", 2, "1 ahead of it")]


def test_the_admitted_job_is_told_its_slot_and_how_long_it_waited_in_its_variables():
    store = DictStore()
    clock = Clock(1000.0)
    enter(store, "job", submitted=990.0)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    (request,) = jobs.submitted
    admission = q.Admission.from_environment(request["runtime_env"]["env_vars"])
    assert (admission.queue, admission.slot, admission.generation, admission.waited_s) == ("team-a", 0, 0, 10.0)
    assert store.keys("waiting/") == [] and store.keys("request/") == []


def test_a_job_waits_for_the_cluster_to_have_free_what_it_needs_counting_jobs_let_in_and_not_yet_placed():
    store = DictStore(free={"CPU": 4.0})
    clock = Clock(1000.0)
    enter(store, "big", submitted=1, needs={"CPU": 3.0})
    enter(store, "small", submitted=2, needs={"CPU": 2.0})
    keeper, jobs, _ = _keeper(store, clock)
    snapshot = keeper.step()
    # Ray has not placed big's workers yet: the 4 CPUs still look free, but 3 are spoken for.
    assert jobs.ids() == ["big"]
    assert snapshot["queues"][0]["waiting"][0]["reason"] == "needs 2 CPUs, 1 free"
    # However long big takes to place its workers (its environment set up, its imports done), they stay spoken for.
    clock.now += 600
    assert keeper.step()["queues"][0]["waiting"][0]["reason"] == "needs 2 CPUs, 1 free"
    # Half placed: Ray shows 1 of its 3 CPUs used, and the other 2 are still spoken for.
    store.placed["big"], store.free = {"CPU": 1.0}, {"CPU": 3.0}
    assert keeper.step()["queues"][0]["waiting"][0]["reason"] == "needs 2 CPUs, 1 free"
    # Placed whole: what Ray shows used is not counted twice.
    store.placed["big"], store.free = {"CPU": 3.0}, {"CPU": 1.0}
    assert keeper.step()["queues"][0]["waiting"][0]["reason"] == "needs 2 CPUs, 1 free"
    _end(store, "big")
    store.placed.pop("big")
    store.free = {"CPU": 4.0}
    keeper.step()
    assert jobs.ids() == ["big", "small"]


def test_what_a_job_of_another_queue_has_not_placed_yet_is_spoken_for_too():
    store = DictStore(free={"CPU": 4.0})
    enter(store, "first", queue="team-a", submitted=1, needs={"CPU": 3.0})
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    enter(store, "second", queue="team-b", submitted=2, needs={"CPU": 2.0})
    snapshot = keeper.step()
    assert jobs.ids() == ["first"]
    (team_b,) = [queue for queue in snapshot["queues"] if queue["queue"] == "team-b"]
    assert team_b["waiting"][0]["reason"] == "needs 2 CPUs, 1 free"


def test_a_queued_job_with_entrypoint_cpus_runs_on_a_cluster_that_has_them_free():
    # What it needs counts its entrypoint's CPUs (jobs/queueing.py), and nothing holds them while it waits:
    # the entrypoint is not placed until the keeper submits the job.
    store = DictStore(free={"CPU": 2.0})
    enter(store, "entrypoint-cpus", needs={"CPU": 2.0})
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == ["entrypoint-cpus"]


def test_the_first_job_in_order_is_never_overtaken_by_a_smaller_one_behind_it():
    store = DictStore(free={"CPU": 1.0})
    enter(store, "large", submitted=1, needs={"CPU": 4.0})
    enter(store, "small", submitted=2, needs={"CPU": 1.0})
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == []


def test_a_claim_made_from_a_stale_read_loses_to_the_claim_made_in_between():
    # The race: a claimer reads the slot's generation, another claims that slot meanwhile.
    store = DictStore()
    first_look = qs.slots(store, "team-a", now=0)
    stale = qs.free_slot(first_look, limit=1)
    assert qs.claim(store, "team-a", qs.free_slot(qs.slots(store, "team-a", 0), 1), {"id": "b", "since": 0}) == 0
    store.set_job_status("b", "RUNNING")
    assert qs.claim(store, "team-a", stale, {"id": "a", "since": 0}) is None
    assert {index: holder["id"] for index, holder in qs.held(qs.slots(store, "team-a", 0)).items()} == {0: "b"}


def test_a_claim_at_a_generation_that_was_cleaned_up_withdraws():
    # A claimer that paused long enough for the slot to change hands twice (and its old generations to be
    # removed) may write a generation that no longer exists: it finds a newer one and withdraws.
    store = DictStore()
    stale = qs.free_slot(qs.slots(store, "team-a", 0), 1)  # generation -1: would write 0
    for generation, job in enumerate(["b", "c", "d"]):
        slot = qs.free_slot(qs.slots(store, "team-a", 0), 1)
        assert qs.claim(store, "team-a", slot, {"id": job, "since": 0}) == generation
        store.set_job_status(job, "RUNNING")
        if job != "d":
            qs.release(store, "team-a", 0, generation)
            store.set_job_status(job, "SUCCEEDED")
    assert store.get("slot/team-a/0/0") is None  # cleaned up
    assert qs.claim(store, "team-a", stale, {"id": "a", "since": 0}) is None
    assert store.get("slot/team-a/0/0") is None
    assert [holder["id"] for holder in qs.held(qs.slots(store, "team-a", 0)).values()] == ["d"]


def test_many_claimers_racing_with_pauses_between_read_and_write_never_hold_a_slot_twice():
    store = DictStore()
    limit, rounds, claimers = 1, 30, 8
    holding: list[str] = []
    overlap: list[list[str]] = []
    lock = threading.Lock()

    def claimer(name: str, seed: int) -> None:
        rng = random.Random(seed)
        for turn in range(rounds):
            job = f"{name}-{turn}"  # a job id is never used twice
            slot_map = qs.slots(store, "team-a", 0)
            slot = qs.free_slot(slot_map, limit)
            threading.Event().wait(rng.uniform(0, 0.003))  # between the read and the write
            if slot is None:
                continue
            generation = qs.claim(store, "team-a", slot, {"id": job, "since": 0},
                                 pause=lambda: threading.Event().wait(rng.uniform(0, 0.002)))
            if generation is None:
                continue
            store.set_job_status(job, "RUNNING")
            with lock:
                holding.append(job)
                if len(holding) > limit:
                    overlap.append(list(holding))
            threading.Event().wait(rng.uniform(0, 0.002))
            with lock:
                holding.remove(job)
            store.set_job_status(job, "SUCCEEDED")
            qs.release(store, "team-a", slot.index, generation)

    threads = [threading.Thread(target=claimer, args=(f"job-{index}", index)) for index in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlap == []


def test_a_slot_whose_job_died_without_saying_so_is_free_again():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "holder", submitted=1)
    enter(store, "waiter", submitted=2)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.set_job_status("holder", "FAILED")  # its node died with it: no done marker was written
    keeper.step()
    assert jobs.ids() == ["holder", "waiter"]


def test_a_slot_held_by_a_job_ray_no_longer_knows_frees_after_the_grace_by_the_heads_clock():
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 1)
    enter(store, "holder", submitted=1)
    enter(store, "waiter", submitted=2)
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    store.set_job_status("holder", None)  # `rayjobs delete` after its wrapper was SIGKILLed
    clock.now += qs.UNKNOWN_HOLDER_GRACE_S - 1
    keeper.step()
    assert jobs.ids() == ["holder"]
    clock.now += 2
    keeper.step()
    assert jobs.ids() == ["holder", "waiter"]


def test_a_stop_asked_while_the_job_waits_ends_it_without_running_through_a_light_stand_in():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "running", submitted=0)
    enter(store, "doomed", submitted=1)
    request = json.loads(store.get("request/doomed"))
    request.update(runtime_env={"working_dir": "gcs://_ray_pkg_code.zip", "pip": ["torch"],
                                "py_modules": ["gcs://_ray_pkg_agent.zip", "gcs://_ray_pkg_mine.zip"],
                                "env_vars": {"RAYJOBS_RECORD": "{}"}},
                   entrypoint_num_cpus=8, entrypoint_resources={"TPU": 4})
    store.put("request/doomed", json.dumps(request).encode())
    entry = json.loads(store.get("waiting/team-a/doomed"))
    store.put("waiting/team-a/doomed", json.dumps({**entry, "agent_modules": ["gcs://_ray_pkg_agent.zip"]}).encode())
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.put("stop/doomed", b"{}")
    keeper.step()
    stand_in = jobs.submitted[-1]
    assert stand_in["submission_id"] == "doomed"
    assert stand_in["runtime_env"]["py_modules"] == ["gcs://_ray_pkg_agent.zip"]
    assert set(stand_in["runtime_env"]) == {"py_modules", "env_vars"}  # no code, no environment to build
    assert "entrypoint_num_cpus" not in stand_in and "entrypoint_resources" not in stand_in
    admission = q.Admission.from_environment(stand_in["runtime_env"]["env_vars"])
    assert admission.outcome == "STOPPED" and "stopped while it waited in queue team-a (position 1)" in admission.reason
    assert store.keys("waiting/") == [] and store.keys("stop/") == []


def test_a_stand_ins_entrypoint_is_always_the_wrapper_never_the_jobs_own_command():
    request = {"submission_id": "x", "entrypoint": "rm -rf /data", "runtime_env": {}}
    stand_in = kp.stand_in(request, {}, q.Admission("team-a", outcome="STOPPED"))
    assert stand_in["entrypoint"].startswith("python -m rayjobs_agent.supervisor -- ")
    assert "rm -rf" not in stand_in["entrypoint"]


def test_a_job_an_earlier_rayjobs_entered_keeps_its_own_wrapper_which_its_agent_package_has():
    # Its package is the earlier agent's, whose wrapper module had another name: the stand-in runs that one.
    former = "python -m rayjobs_agent.record -- 'python train.py'"
    request = {"submission_id": "x", "entrypoint": former, "runtime_env": {}}
    stand_in = kp.stand_in(request, {"agent_modules": ["gcs://earlier.zip"]}, q.Admission("team-a", outcome="STOPPED"))
    assert stand_in["entrypoint"] == former and stand_in["runtime_env"]["py_modules"] == ["gcs://earlier.zip"]
    from rayjobs_agent.wire import user_entrypoint

    assert user_entrypoint(former) == "python train.py"


def test_a_stop_asked_once_the_job_runs_is_passed_to_ray():
    store = DictStore()
    enter(store, "job")
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.put("stop/job", b"{}")
    keeper.step()
    assert jobs.stopped == ["job"] and qs.job_status(store, "job") == "STOPPED"


def test_a_request_ray_refuses_ends_failed_and_the_queue_moves_on():
    store = DictStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "bad", submitted=1)
    enter(store, "good", submitted=2)
    keeper, jobs, said = _keeper(store)
    jobs.refuse["bad"] = rj.Refused("runtime_env is malformed")
    keeper.step()
    assert jobs.ids() == ["bad", "good"]  # the stand-in, then the next job in the freed slot
    admission = q.Admission.from_environment(jobs.submitted[0]["runtime_env"]["env_vars"])
    assert admission.outcome == "FAILED" and "runtime_env is malformed" in admission.reason
    assert any("Ray refused job bad" in line for line in said)


def test_a_submission_that_fails_for_now_gives_the_slot_back_and_keeps_the_jobs_place():
    store = DictStore()
    clock = Clock()
    qs.set_limits(store, "team-a", 1)
    enter(store, "first", submitted=1)
    enter(store, "second", submitted=2)
    keeper, jobs, _ = _keeper(store, clock)
    jobs.refuse["first"] = ConnectionError("the dashboard is restarting")
    snapshot = keeper.step()
    assert jobs.ids() == [] and qs.held(qs.slots(store, "team-a", clock.now)) == {}
    assert [job["id"] for job in snapshot["queues"][0]["waiting"]] == ["first", "second"]
    clock.now += kp.RETRY_SUBMIT_S
    keeper.step()
    assert jobs.ids() == ["first"]


def test_a_job_ray_already_has_counts_as_admitted():
    # Its keeper died after submitting it, before it took its entry out.
    store = DictStore()
    enter(store, "job")
    keeper, jobs, _ = _keeper(store)
    jobs.refuse["job"] = rj.AlreadySubmitted("job")
    keeper.step()
    assert store.keys("waiting/") == []
    assert [holder["id"] for holder in qs.held(qs.slots(store, "team-a", 1000.0)).values()] == ["job"]


def test_a_job_submitted_a_moment_ago_is_not_overtaken_while_its_entry_is_being_written():
    store = DictStore()
    clock = Clock(1000.0)
    qs.set_limits(store, "team-a", 1)
    enter(store, "low", priority=0, submitted=990.0)
    # The helper job that enters "high" was submitted at 995 s and has not written its entry yet.
    store.set_job_status("helper-1", "RUNNING", start_time=995_000,
                         metadata={"rayjobs.enqueues": "team-a", "rayjobs.priority": "10", "rayjobs.queued_id": "high"})
    keeper, jobs, _ = _keeper(store, clock)
    snapshot = keeper.step()
    assert jobs.ids() == []
    assert snapshot["queues"][0]["waiting"][0]["reason"] == "high, submitted just before it, is still being queued"
    enter(store, "high", priority=10, submitted=995.0)
    store.set_job_status("helper-1", "SUCCEEDED")
    keeper.step()
    assert jobs.ids() == ["high"]


def test_a_helper_that_never_wrote_its_entry_holds_nobody_back_for_long():
    store = DictStore()
    clock = Clock(1000.0)
    enter(store, "low", submitted=990.0)
    store.set_job_status("helper-1", "PENDING", start_time=(1000 - qs.ENQUEUE_IN_FLIGHT_S - 1) * 1000,
                         metadata={"rayjobs.enqueues": "team-a", "rayjobs.priority": "10", "rayjobs.queued_id": "high"})
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.ids() == ["low"]


class FlakyStore(DictStore):
    """A store whose reads fail while ``down`` is set (a GCS restarting under the keeper)."""

    down = False

    def keys(self, prefix, namespace=q.NAMESPACE):
        if self.down:
            raise ConnectionError("GCS unavailable")
        return super().keys(prefix, namespace)


def test_a_store_that_fails_mid_wait_costs_time_not_order_nor_a_second_holder():
    store = FlakyStore()
    qs.set_limits(store, "team-a", 1)
    enter(store, "first", submitted=1)
    enter(store, "second", submitted=2)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.down = True
    with pytest.raises(ConnectionError):
        keeper.step()  # the actor's loop says so once and tries again (KeeperActor._loop)
    store.down = False
    snapshot = keeper.step()
    assert jobs.ids() == ["first"]
    assert [job["id"] for job in snapshot["queues"][0]["waiting"]] == ["second"]
    _end(store, "first")
    keeper.step()
    assert jobs.ids() == ["first", "second"]


def test_finished_helper_jobs_are_deleted_soon_after_and_nothing_else_is():
    store = DictStore()
    clock = Clock(1000.0)
    helper = {"metadata": {"rayjobs.name": q.HELPER_NAME}}
    store.set_job_status("old-helper", "SUCCEEDED", end_time=(1000 - qs.HELPER_KEPT_S - 1) * 1000, **helper)
    store.set_job_status("new-helper", "SUCCEEDED", end_time=999_000, **helper)
    store.set_job_status("running-helper", "RUNNING", **helper)
    store.set_job_status("old-team-job", "SUCCEEDED", end_time=1_000, metadata={"rayjobs.name": "eval"})
    keeper, jobs, _ = _keeper(store, clock)
    keeper.step()
    assert jobs.deleted == ["old-helper"]


def test_a_waiting_jobs_packages_are_pinned_again_while_it_waits():
    store = DictStore()
    qs.set_limits(store, "team-a", 0)
    enter(store, "job")
    entry = json.loads(store.get("waiting/team-a/job"))
    store.put("waiting/team-a/job", json.dumps({**entry, "packages": ["gcs://_ray_pkg_code.zip"]}).encode())
    clock = Clock()
    keeper, _, _ = _keeper(store, clock)
    keeper.step()
    clock.now += kp.PIN_EVERY_S
    keeper.step()
    assert store.pinned == [("gcs://_ray_pkg_code.zip", qs.PIN_FOR_S)] * 2


def test_an_admission_survives_its_variable_with_dollars_left_unexpanded():
    admission = q.Admission("team-a", 1, 4, 2.5, 3, "FAILED", "Ray refused: $HOME is not a path")
    text = admission.to_json()
    assert "$" not in text
    assert q.Admission.from_environment({q.ADMISSION_ENV_VAR: text}) == admission


def test_a_large_order_is_split_over_variables_no_larger_than_the_kernel_takes():
    order = {"verb": "enqueue", "request": {"env_vars": {f"V{index}": random.randbytes(900).hex()
                                                         for index in range(300)}}}
    variables = q.order_variables(order)
    assert len(variables) > 1 and all(len(value) < 128 * 1024 for value in variables.values())
    assert q.order_from(variables) == order


def test_an_enqueue_writes_the_entry_by_its_orders_submission_time_and_refuses_a_second():
    store = DictStore()
    order = {"queue": "team-a", "id": "job-1", "name": "eval", "priority": 3, "needs": {"CPU": 2.0},
             "request": {"submission_id": "job-1", "entrypoint": "x", "metadata": {"rayjobs.spec_hash": "abc"}},
             "packages": ["gcs://_ray_pkg_code.zip"]}
    placed = qs.enqueue(store, order, 1234.5)
    assert placed["queued"] == "team-a" and placed["position"] == 1
    entry = json.loads(store.get("waiting/team-a/job-1"))
    assert (entry["submitted"], entry["priority"], entry["spec_hash"]) == (1234.5, 3, "abc")
    assert store.pinned == [("gcs://_ray_pkg_code.zip", qs.PIN_FOR_S)]
    again = qs.enqueue(store, order, 1240.0)
    assert again["exists"] == "queue" and again["metadata"] == {"rayjobs.spec_hash": "abc"}


def test_an_order_job_that_ran_as_a_helper_enters_its_job_by_its_own_submission_time(monkeypatch):
    store = DictStore()
    order_id = q.enqueue_order_id("job-1")
    store.set_job_status(order_id, "RUNNING", start_time=1_234_500)
    order = {"verb": "enqueue", "queue": "team-a", "id": "job-1", "name": "eval", "priority": 3,
             "request": {"submission_id": "job-1", "entrypoint": "x", "metadata": {}}}
    environ = {**q.order_variables({**order, "format": q.ORDER_FORMAT}), "RAY_ADDRESS": "127.0.0.1:1",
               RAY_JOB_CONFIG_ENV_VAR: json.dumps({"metadata": {"job_submission_id": order_id}})}
    started: list[str] = []
    monkeypatch.setattr(qo, "GcsKeyValue", lambda address: store)
    monkeypatch.setattr(qo, "ensure_keeper", lambda store, now: started.append("keeper"))
    assert qo.helper(environ, qo.Reply(deadline_s=None)) == 0
    assert json.loads(store.get("waiting/team-a/job-1"))["submitted"] == 1234.5
    assert started == ["keeper"]  # placed once this helper job ends: the head's resource is the helper's until then


@pytest.mark.parametrize("name", ["x; touch FILE", "Team-A", "a/b", "", "-a", "a" * 64, "a b", "$(id)"])
def test_a_queue_name_outside_the_pattern_is_refused(name):
    with pytest.raises(q.QueueNameError, match="cannot name a queue"):
        q.checked_queue_name(name)


@pytest.mark.parametrize("needs, free, expected", [
    ({"CPU": 2.0}, {"CPU": 2.0}, ""),
    ({"CPU": 4.0}, {"CPU": 2.0}, "needs 4 CPUs, 2 free"),
    ({"GPU": 1.0}, {"CPU": 8.0}, "needs 1 GPU, 0 free"),
])
def test_shortfall_names_the_resource_and_the_numbers(needs, free, expected):
    assert qs.shortfall(needs, free, {}) == expected


def test_an_auto_layout_is_queued_as_taking_the_cpus_free_when_it_starts_and_named_needs_as_what_they_say(tmp_path):
    from jobs.loader import load_spec
    from jobs.queueing import queue_config

    quickstart = load_spec(REPO_ROOT / "specs" / "quickstart.yaml", overrides=["queue=team-a"])
    assert queue_config(quickstart)["grows"] == ["CPU"]
    fixed = load_spec(REPO_ROOT / "specs" / "quickstart.yaml",
                      overrides=["queue=team-a", "workload.train.num_workers=2", "workload.train.cpus_per_worker=1"])
    assert queue_config(fixed)["grows"] == []
    named = load_spec(REPO_ROOT / "specs" / "quickstart.yaml", overrides=["queue=team-a", "needs.CPU=3"])
    assert queue_config(named) == {"name": "team-a", "priority": 0, "needs": {"CPU": 3.0}, "grows": []}
