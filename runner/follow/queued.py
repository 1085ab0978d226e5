"""A job that waits in its cluster's queue: how it reads, and following it until Ray has it.

A waiting job is no Ray job yet (``runner.client.queue``): Ray's job API does not know its id until the
queue's keeper submits it. Until then it reads as ``QUEUED`` with its place, from what the keeper
published; from then on it is followed as any job.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from rayjobs_agent.wire import METADATA_NAME
from runner.client.queue import ClusterQueue
from runner.errors import ClusterUnreachable, JobNotFound

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

QUEUED = "QUEUED"
POLL_S = 1.0
# The keeper submits a job before it takes the job's entry out, so a job missing from both is gone only after
# it has been missing for a few looks in a row (one look can fall between the submit and the next snapshot).
_MISSES_BEFORE_GONE = 3
# A job just entered into its queue may be missing from what the keeper published for this many looks: a new
# keeper publishes after its first step.
_LOOKS_BEFORE_FIRST_SEEN = 15
# A keeper that has not published for this long (its own timestamps) is named once: nothing moves while it is down.
_KEEPER_SILENT_S = 30.0


def queued_info(place: dict[str, Any]) -> dict[str, Any]:
    """A waiting job as the commands show jobs (Ray's fields where they apply), ``status`` QUEUED and ``queue`` set."""
    return {"submission_id": place.get("id"), "status": QUEUED, "metadata": {METADATA_NAME: place.get("name") or ""},
            "start_time": int(float(place.get("submitted") or 0) * 1000) or None, "entrypoint": "",
            "queue": place}


def queued_text(place: dict[str, Any]) -> str:
    """``QUEUED: position 2 in queue team-a (2 of 2 running in queue team-a)``."""
    reason = place.get("reason") or ""
    return f"QUEUED: position {place.get('position')} in queue {place.get('queue')}" + (f" ({reason})" if reason else "")


def job_or_place(api: JobsApi, job_id: str) -> dict[str, Any]:
    """Ray's record of the job, or, for a job that waits in a queue, :func:`queued_info`.

    Raises:
        JobNotFound: neither Ray nor any queue knows the job.
    """
    try:
        return api.get_job(job_id)
    except JobNotFound:
        place = ClusterQueue(api).place_of(job_id)
        if place is None:
            raise
        return queued_info(place)


def wait_for_turn(api: JobsApi, job_id: str, say: Callable[[str], None], *, just_queued: bool = False,
                  poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep,
                  give_up_after_s: float | None = None) -> None:
    """Return once Ray has job ``job_id``; while it waits in its queue, say its place each time it changes.

    ``just_queued``: the job was entered into its queue a moment ago, so it may not show in what the keeper
    published yet. ``give_up_after_s``: how long the cluster may not answer (a head restarting) before this gives
    up, as a follower does; the job keeps its place either way.

    Raises:
        JobNotFound: neither Ray nor any queue knows the job (it was never submitted, or its entry vanished).
        ClusterUnreachable: the cluster did not answer for ``give_up_after_s``.
        KeyboardInterrupt: Ctrl-C; the job keeps its place.
    """
    queue = ClusterQueue(api)
    said: tuple[Any, ...] | None = None
    misses = 0
    seen = False
    last_at, still_since = None, time.monotonic()
    answered_at, lost_contact = time.monotonic(), False
    while True:
        try:
            try:
                api.get_job(job_id)
                return
            except JobNotFound:
                pass
            snapshot = queue.snapshot()
            place = queue.place_of(job_id, snapshot)
        except ClusterUnreachable:
            if give_up_after_s is None or time.monotonic() - answered_at > give_up_after_s:
                raise
            if not lost_contact:
                say(f"lost contact with the cluster at {api.address}; job {job_id} keeps its place in its queue, "
                    f"and this waits up to {give_up_after_s:g}s for the cluster to answer again")
                lost_contact = True
            sleep(poll_s)
            continue
        if lost_contact:
            say("the cluster answers again")
            lost_contact = False
        answered_at = time.monotonic()
        if place is None:
            misses += 1
            if misses >= (_MISSES_BEFORE_GONE if seen else _LOOKS_BEFORE_FIRST_SEEN if just_queued else 1):
                raise JobNotFound(f"no job {job_id!r} on the cluster at {api.address}, waiting or running "
                                  "(`rayjobs list` shows the jobs there)")
        else:
            misses, seen = 0, True
            shown = (place.get("position"), place.get("reason"))
            if shown != said:
                said = shown
                say(f"job {job_id} is {queued_text(place)}")
            at = (snapshot or {}).get("at")
            if at != last_at:
                last_at, still_since = at, time.monotonic()
            elif time.monotonic() - still_since > _KEEPER_SILENT_S:
                say(f"the queue's keeper has published nothing for {time.monotonic() - still_since:.0f}s; "
                    "the job keeps its place, and a keeper is started in its stead")
                queue.replace_keeper()
                still_since = float("inf")  # said, and asked for, once
        sleep(poll_s)


__all__ = ["QUEUED", "job_or_place", "queued_info", "queued_text", "wait_for_turn"]
