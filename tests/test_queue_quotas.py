"""A queue's quota, kept by its keeper over a store that behaves as the cluster's does: the jobs it lets in hold no more
together than the quota, counting what each is really given (an `auto` layout's grant), and a quota is checked by
one rule wherever it is set."""

from __future__ import annotations

import pytest

from rayjobs_agent import queueing as q
from rayjobs_agent.queue import store as qs
from tests.support.queue_store import DictStore, enter
from tests.support.queue_store import keeper_and_jobs as _keeper


def test_a_quota_of_cpus_lets_in_jobs_while_they_fit_it_and_says_why_the_next_waits():
    store = DictStore(free={"CPU": 100.0})
    qs.set_limits(store, "team-a", None, {"CPU": 4})
    for index in range(3):
        enter(store, f"job-{index}", submitted=float(index), needs={"CPU": 2.0})
    keeper, jobs, _ = _keeper(store)
    (shown,) = keeper.step()["queues"]
    assert jobs.ids() == ["job-0", "job-1"]
    assert shown["quota"] == {"CPU": 4.0} and shown["used"] == {"CPU": 4.0}
    assert shown["waiting"][0]["reason"] == "queue team-a holds 4 of its 4 CPU, and this job needs 2 more"
    jobs.settle("job-0", "SUCCEEDED", "done")
    keeper.step()
    assert jobs.ids() == ["job-0", "job-1", "job-2"]


def test_a_job_that_takes_what_is_free_is_given_no_more_than_its_queues_quota_leaves():
    store = DictStore(free={"CPU": 16.0})
    qs.set_limits(store, "team-a", None, {"CPU": 6})
    enter(store, "holder", submitted=0.0, needs={"CPU": 2.0})
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    store.put("waiting/team-a/grower", b'{"name": "grower", "priority": 0, "submitted": 1.0, "needs": {"CPU": 1.0}, '
                                       b'"grows": ["CPU"]}')
    store.put("request/grower", b'{"submission_id": "grower", "entrypoint": "x", "metadata": {}}')
    keeper.step()
    admission = q.Admission.from_environment(jobs.submitted[-1]["runtime_env"]["env_vars"])
    assert admission.granted == {"CPU": 4.0}, "16 free, but the quota leaves 4"


def test_limits_given_apart_are_kept_together_and_no_limit_removes_them_all():
    store = DictStore()
    qs.set_limits(store, "team-a", 2)
    qs.set_limits(store, "team-a", None, {"GPU": 4})
    qs.set_limits(store, "team-a", None, {"CPU": 16})
    assert qs.limits(store, "team-a") == {"max_running": 2, "quota": {"GPU": 4.0, "CPU": 16.0}}
    qs.set_limits(store, "team-a", None)
    assert qs.limits(store, "team-a") == {}


@pytest.mark.parametrize("quota, said", [({"CPU": 0}, "lets no job in"), ({"GPU": -1}, "lets no job in"),
                                         ({"CPU": float("inf")}, "lets no job in"),
                                         ({"x; touch /tmp/p": 1}, "cannot name a resource"),
                                         ({"$(reboot)": 1}, "cannot name a resource"), ({"CPU": "lots"}, "not a number")])
def test_a_quota_of_nothing_or_a_resource_name_a_shell_would_read_is_refused_by_the_keeper(quota, said):
    store = DictStore()
    store.order("rayjobs-order-set-1", {"verb": "set", "queue": "team-a", "max_running": None, "quota": quota},
                start_time_ms=1)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert said in jobs.answer_to("rayjobs-order-set-1")["error"]
    assert qs.limits(store, "team-a") == {}


def test_across_queues_the_job_submitted_first_is_let_in_first_whatever_its_queues_name():
    store = DictStore(free={"CPU": 2.0})
    enter(store, "late-in-a", queue="a-queue", submitted=5.0, needs={"CPU": 2.0})
    enter(store, "early-in-z", queue="z-queue", submitted=1.0, needs={"CPU": 2.0})
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert jobs.ids() == ["early-in-z"]


def test_a_quota_lowered_below_a_waiting_jobs_needs_passes_it_over_and_lets_the_jobs_behind_it_in():
    store = DictStore(free={"CPU": 100.0, "GPU": 8.0})
    qs.set_limits(store, "team-a", None, {"GPU": 8})
    enter(store, "big", submitted=0.0, needs={"GPU": 4.0})
    enter(store, "cpu-only", submitted=1.0, needs={"CPU": 1.0})
    qs.set_limits(store, "team-a", None, {"GPU": 2})
    keeper, jobs, _ = _keeper(store)
    (shown,) = keeper.step()["queues"]
    assert jobs.ids() == ["cpu-only"]
    assert shown["waiting"][0]["reason"] == "it needs 4 GPU, more than queue team-a's whole quota; it waits for the quota to be raised"
    qs.set_limits(store, "team-a", None, {"GPU": 4})
    keeper.step()
    assert jobs.ids() == ["cpu-only", "big"]


@pytest.mark.parametrize("order, said", [
    ({"verb": "set", "queue": "team-a", "max_running": -3}, "a whole number, 0 or more"),
    ({"verb": "set", "queue": "team-a", "max_running": None, "quota": {"GPU": 1e-300, "CPU": -1}}, "lets no job in"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"GPU": -8},
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "0 or more and finite"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"CPU": float("nan")},
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "0 or more and finite"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"CPU": 1},
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}, "entrypoint_num_gpus": -2}},
     "'-2' entrypoint GPU: an amount is a number, 0 or more"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"CPU": 1},
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {},
                  "entrypoint_resources": {"TPU": "lots"}}}, "'lots' entrypoint TPU: an amount is a number"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"CPU": "1"},
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "'1' CPU: an amount is a number"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": [["CPU", 1]],
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "are mappings"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": "xy",
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "are mappings"),
    ({"verb": "enqueue", "queue": "team-a", "id": "sneaky", "needs": {"CPU": 1}, "grows": "CPU",
      "request": {"submission_id": "sneaky", "entrypoint": "x", "metadata": {}}}, "list of names"),
])
def test_an_order_sent_straight_to_rays_job_api_with_amounts_no_client_sends_is_refused(order, said):
    store = DictStore()
    order_id = q.enqueue_order_id("sneaky") if order["verb"] == "enqueue" else "rayjobs-order-set-2"
    store.order(order_id, order, start_time_ms=1)
    keeper, jobs, _ = _keeper(store)
    keeper.step()
    assert said in jobs.answer_to(order_id)["error"]
    assert store.keys("waiting/") == [] and qs.limits(store, "team-a") == {}
