"""The queue's rules, decided on a key-value store that behaves as the cluster's does (put-if-absent is atomic).

The cluster's own store is used by tests/test_queue_cluster.py; here the one seam, the store, is a dict.
"""

from __future__ import annotations

import json
import threading

import pytest

from workloads.rayjobs_observe import queueing as q


class DictStore:
    """The key-value store's contract in memory: one lock makes put-if-absent atomic, as the GCS does."""

    def __init__(self, free: dict[str, float] | None = None) -> None:
        self.data: dict[tuple[bytes, str], bytes] = {}
        self.lock = threading.Lock()
        self.free = free if free is not None else {"CPU": 100.0}

    def get(self, key, namespace=q.NAMESPACE):
        return self.data.get((namespace, key))

    def put(self, key, value, *, only_if_absent=False):
        with self.lock:
            if only_if_absent and (q.NAMESPACE, key) in self.data:
                return False
            self.data[(q.NAMESPACE, key)] = value
            return True

    def delete(self, key):
        self.data.pop((q.NAMESPACE, key), None)

    def keys(self, prefix):
        return [key for namespace, key in list(self.data) if namespace == q.NAMESPACE and key.startswith(prefix)]

    def free_resources(self):
        return dict(self.free)

    def set_job_status(self, job_id: str, status: str) -> None:
        self.data[(b"job", f"_ray_internal_job_info_{job_id}")] = json.dumps({"status": status}).encode()


def _admission(store, job, priority=0, submitted=0.0, needs=None, queue="team-a"):
    admission = q.Admission(store, queue, job, priority, needs or {"CPU": 1.0}, submitted)
    admission.register()
    return admission


def test_the_first_by_priority_then_submission_time_goes_first():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    early_low = _admission(store, "early-low", priority=0, submitted=1.0)
    late_high = _admission(store, "late-high", priority=5, submitted=2.0)
    later_high = _admission(store, "later-high", priority=5, submitted=3.0)
    assert early_low.look(now=10).position == 3
    assert later_high.look(now=10).position == 2
    assert late_high.look(now=10).slot == 0
    late_high.leave()
    assert later_high.look(now=11).slot == 0
    later_high.leave()
    assert early_low.look(now=12).slot == 0


def test_a_full_queue_says_how_many_of_how_many_run():
    store = DictStore()
    q.set_limits(store, "team-a", 2)
    first, second, third = (_admission(store, name, submitted=index) for index, name in enumerate("abc"))
    assert first.look(now=1).slot == 0 and second.look(now=1).slot == 1
    turn = third.look(now=1)
    assert turn.slot is None and turn.position == 1
    assert turn.reason == "2 of 2 running in queue team-a"


def test_a_job_waits_for_the_cluster_to_have_free_what_it_needs_counting_jobs_just_let_in():
    store = DictStore(free={"CPU": 4.0})
    big = _admission(store, "big", submitted=1, needs={"CPU": 3.0})
    assert big.look(now=100).slot == 0
    # Ray has not placed big's workers yet: the 4 CPUs still look free, but 3 are spoken for.
    small = _admission(store, "small", submitted=2, needs={"CPU": 2.0})
    assert small.look(now=101).reason == "needs 2 CPUs, 1 free"
    store.free = {"CPU": 1.0}
    assert small.look(now=100 + q.PLACEMENT_GRACE_S + 1).reason == "needs 2 CPUs, 1 free"
    big.leave()
    store.free = {"CPU": 4.0}
    assert small.look(now=200).slot is not None


def test_two_jobs_racing_for_the_last_slot_cannot_both_take_it():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    contenders = [q.Admission(store, "team-a", f"job-{index}", 0, {"CPU": 1.0}, 0.0) for index in range(8)]
    for admission in contenders:
        # Each sees itself first: the others have not registered yet, the race the store must settle.
        store.put(f"waiting/team-a/{admission.job_id}", json.dumps({"priority": 0, "submitted": 0}).encode())
    barrier = threading.Barrier(len(contenders))
    results: list[int | None] = []

    def race(admission):
        barrier.wait()
        results.append(_take_unordered(admission))

    threads = [threading.Thread(target=race, args=(admission,)) for admission in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(result is not None for result in results) == 1
    assert len(q.held_slots(store, "team-a")) == 1


def _take_unordered(admission):
    """A slot claim made by every contender at once, past the ordering check (the store alone must decide)."""
    held = q.held_slots(admission.store, admission.queue)
    if len(held) >= (q.max_running(admission.store, admission.queue) or 1):
        return None
    slot, generation = q.next_free_slot(admission.store, admission.queue, held)
    value = json.dumps({"id": admission.job_id, "since": 0}).encode()
    return slot if admission.store.put(f"slot/team-a/{slot}/{generation}", value, only_if_absent=True) else None


def test_a_slot_whose_job_died_without_saying_so_is_free_again():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    holder = _admission(store, "holder", submitted=1)
    assert holder.look(now=1).slot == 0
    waiter = _admission(store, "waiter", submitted=2)
    assert waiter.look(now=2).slot is None
    store.set_job_status("holder", "FAILED")  # its node died with it: no done marker was written
    turn = waiter.look(now=3)
    assert (turn.slot, turn.generation) == (0, 1)


def test_a_waiting_job_that_was_stopped_no_longer_blocks_the_queue():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    gone = _admission(store, "gone", priority=9, submitted=1)
    behind = _admission(store, "behind", submitted=2)
    assert behind.look(now=1).position == 2
    store.set_job_status("gone", "STOPPED")
    assert behind.look(now=2).slot == 0
    assert store.get("waiting/team-a/gone") is None


def test_wait_for_turn_tells_each_change_once_and_leaves_the_list_when_stopped():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    _admission(store, "running", submitted=0).look(now=0)
    waiter = q.Admission(store, "team-a", "waiter", 0, {"CPU": 1.0}, 1.0)
    told: list[dict] = []
    polls = iter(range(5))
    admitted = q.wait_for_turn(waiter, stopped=lambda: next(polls, None) is None, tell=told.append,
                               clock=lambda: 5.0, pause=lambda seconds: None)
    assert admitted is False
    assert told == [{"state": "waiting", "queue": "team-a", "position": 1,
                     "reason": "1 of 1 running in queue team-a"}]
    assert store.get("waiting/team-a/waiter") is None


def test_describe_lists_running_and_waiting_in_the_order_they_go():
    store = DictStore()
    q.set_limits(store, "team-a", 1)
    _admission(store, "first", submitted=0).look(now=0)
    _admission(store, "low", priority=0, submitted=1)
    _admission(store, "high", priority=3, submitted=2)
    (listed,) = q.describe(store)
    assert listed["max_running"] == 1
    assert [job["id"] for job in listed["running"]] == ["first"]
    assert [(job["id"], job["position"]) for job in listed["waiting"]] == [("high", 1), ("low", 2)]


@pytest.mark.parametrize("needs, free, expected", [
    ({"CPU": 2.0}, {"CPU": 2.0}, ""),
    ({"CPU": 4.0}, {"CPU": 2.0}, "needs 4 CPUs, 2 free"),
    ({"GPU": 1.0}, {"CPU": 8.0}, "needs 1 GPU, 0 free"),
])
def test_shortfall_names_the_resource_and_the_numbers(needs, free, expected):
    assert q.shortfall(needs, free, {}) == expected


def test_a_queue_that_cannot_be_read_lets_the_job_run_and_says_so_once(monkeypatch):
    # Broken on purpose: no cluster answers at this address, as when the GCS is gone or the wrapper runs elsewhere.
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    from workloads.rayjobs_observe import ray_internals

    monkeypatch.setattr(ray_internals, "gcs_client", lambda address: (_ for _ in ()).throw(ConnectionError("GCS unreachable")))
    said: list[str] = []
    admission, starts = q.wait_in_queue({"queue": {"name": "team-a", "priority": 0, "needs": {}}}, "raysubmit_x",
                                        stopped=lambda: False, emit=lambda *a, **k: None, say=said.append)
    assert (admission, starts) == (None, True)
    assert said == ["queue unavailable: GCS unreachable; the job starts without waiting"]
    q.release(admission, said.append)  # nothing to give back: no second line
    assert len(said) == 1
