"""What an order job does when it runs: no keeper was alive to read it.

An order job runs only when no keeper was alive to read it (``queueing.py`` says why). It then writes what the
order asks into the store itself, and starts a keeper, which carries the rest out once the helper job has ended:
``python -m rayjobs_agent.queue`` with the order in its variables, so that no word of it reaches a shell.
"""

from __future__ import annotations

import json
import os
import threading
import time
import sys
from typing import Any, Mapping

from ..pinning import ADDRESS_VARIABLE
from ..queueing import NO_KEEPER_ANSWER_KEY, ORDER_FORMAT, answer, order_from, order_problem, submission_id_from
from ..wire import say
from .actor import ensure_keeper
from .pipelines import seal_order
from .store import GcsKeyValue, enqueue, ray_job_info, set_order

# The longest a helper job runs. It holds most of the head's resource, which a keeper needs to be placed: one that hung
# (on a GCS that does not answer, or in Ray's own start or shutdown) would keep every order waiting behind it. Past
# this it answers with what it did and leaves; the next order starts the keeper if this one could not.
HELPER_DEADLINE_S = 90.0

# How long the deadline's timer waits for a main thread that is giving the answer: one that still holds it then is
# stuck in its print, and the process ends without a word.
ANSWER_LOCK_WAIT_S = 5.0

def helper(environ: Mapping[str, str], reply: "Reply") -> int:
    """What an order job does when it runs (no keeper was alive to read it): what the order asks is written into
    the store, and a keeper is started, which carries it out once this job has ended. ``reply`` gives the answer.

    The order (``queueing.order_from``) is a JSON object with ``verb``: ``enqueue`` (``queue``, ``id``, ``name``,
    ``priority``, ``needs``, ``request``, ``packages``, ``agent_modules``; a pipeline's job also ``pipeline``,
    ``pipeline_job``, ``after``), ``stop`` (``id``), ``set`` (``queue``, ``max_running``, ``quota``), ``seal``
    (``run``, ``jobs``, ``after``), ``ensure`` or ``withdraw`` (``id``). Nothing of it reaches a shell: the entrypoint
    is a constant command.
    """
    order = order_from(environ)
    store = GcsKeyValue(environ[ADDRESS_VARIABLE])
    now = time.time()
    verb = order.get("verb")
    if order.get("format", ORDER_FORMAT) != ORDER_FORMAT:
        reply.give({"error": f"an order of format {order.get('format')!r}; this code reads {ORDER_FORMAT}"})
        return 2
    problem = order_problem(order, submission_id_from(environ))
    if problem is not None:
        reply.give({"unknown": str(order.get("id"))[:200]} if verb == "stop" else {"error": problem})
        return 2
    reply.begun = True
    if verb == "enqueue":
        # The order job's own submission time, by the head's job manager: the same clock as every other entry's.
        own = ray_job_info(store, submission_id_from(environ)) or {}
        result = enqueue(store, order, (own.get("start_time") or now * 1000) / 1000)
    elif verb == "stop":
        store.put(f"stop/{order['id']}", json.dumps({"at": now}).encode())
        result = {"stopping": str(order["id"])}
    elif verb == "set":
        result = set_order(store, order, now)
    elif verb == "ensure":
        result = {"keeper": "starting"}
    elif verb == "seal":
        result = seal_order(store, order, now)
    elif verb == "withdraw":
        result = {"withdrawn": str(order["id"])}  # its id alone does the work (``Keeper.carry_out``)
    else:
        reply.give({"error": f"unknown order {verb!r}"})
        return 2
    reply.result = result
    ensure_keeper(store, now)
    reply.give(result)
    return 0


class Reply:
    """A helper job's one answer, given once: by the helper, or past ``deadline_s`` (None: no deadline) by a timer
    that then ends the process whatever it waits on (answered already, it only ends it: the wait is then in Ray's
    shutdown)."""

    def __init__(self, deadline_s: float | None) -> None:
        self.begun = False  # the order's work started: past the deadline it may be done in part
        self.result: Any = None  # what the order did, once done
        self.deadline_s = deadline_s
        self._answered: Any = None
        self._given = False
        self._lock = threading.Lock()
        if deadline_s is not None:
            timer = threading.Timer(deadline_s, self._leave)
            timer.daemon = True
            timer.start()

    def give(self, document: Any) -> None:
        """Print ``document`` as the answer, unless one was given."""
        with self._lock:
            if self._given:
                return
            answer(document)
            self._given, self._answered = True, document

    def _leave(self) -> None:
        # A stdout that blocks (the main thread stuck in a print of its own) would block this thread's print too: a
        # second timer ends the process all the same. A main thread stuck in giving the answer holds the lock: the
        # process then ends at once, before writing anything.
        backstop = threading.Timer(2 * ANSWER_LOCK_WAIT_S, os._exit, (1,))
        backstop.daemon = True
        backstop.start()
        if not self._lock.acquire(timeout=ANSWER_LOCK_WAIT_S):
            os._exit(1)
        try:
            if not self._given:
                if self.result is not None:
                    self._answered = self.result
                else:
                    in_part = ("; what it asked may be done in part: `rayjobs queue` shows what the queue holds"
                               if self.begun else "")
                    self._answered = {"error": f"the order's helper job did not finish within {self.deadline_s:g}s"
                                               f"{in_part}"}
                answer(self._answered)
                self._given = True
            say(f"this helper job ran past {self.deadline_s:g}s and leaves, so that the head's resource is free for "
                "a keeper", sys.stdout)
        finally:
            refused = not isinstance(self._answered, (dict, list)) or (isinstance(self._answered, dict)
                                                                       and "error" in self._answered)
            os._exit(1 if refused else 0)


def main() -> int:
    """An order job's work on the cluster when no keeper read it (its order in its variables).

    Fail soft: one paragraph for the client, never a traceback of ours.
    """
    reply = Reply(HELPER_DEADLINE_S)
    try:
        return helper(os.environ, reply)
    except Exception as exc:  # noqa: BLE001 - one paragraph for the client, never a traceback of ours
        problem = f"{type(exc).__name__}: {exc}"
        if reply.result is None:
            reply.give({"error": problem})
            return 1
        # Carried out, and only the keeper's start failed: the order stands, and the next order starts a keeper.
        say(f"the order was carried out, but no keeper could be started ({problem}); the next order starts one",
            sys.stdout)
        carried_out = reply.result
        reply.give({**carried_out, NO_KEEPER_ANSWER_KEY: problem[:500]} if isinstance(carried_out, dict)
                   else carried_out)
        return 0
