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
from typing import Any, Mapping

from ..pinning import ADDRESS_VARIABLE
from ..queueing import ORDER_FORMAT, answer, order_from, order_problem, submission_id_from
from ..wire import OWN_LINE_PREFIX
from .actor import ensure_keeper
from .pipelines import seal_order
from .store import GcsKeyValue, enqueue, ray_job_info, set_order

# The longest a helper job runs. It holds most of the head's resource, which a keeper needs to be placed: one that hung
# (on a GCS that does not answer, or in Ray's own start or shutdown) would keep every order waiting behind it. Past
# this it answers with what it did and leaves; the next order starts the keeper if this one could not.
HELPER_DEADLINE_S = 90.0

def helper(environ: Mapping[str, str]) -> int:
    """What an order job does when it runs (no keeper was alive to read it): what the order asks is written into
    the store, and a keeper is started, which carries it out once this job has ended.

    The order (``queueing.order_from``) is a JSON object with ``verb``: ``enqueue`` (``queue``, ``id``, ``name``,
    ``priority``, ``needs``, ``request``, ``packages``, ``agent_modules``; a pipeline's job also ``pipeline``,
    ``pipeline_job``, ``after``), ``stop`` (``id``), ``set`` (``queue``, ``max_running``, ``quota``), ``seal`` (``run``, ``jobs``,
    ``after``), ``ensure`` or ``withdraw`` (``id``). Nothing of it reaches a shell: the entrypoint
    is a constant command.
    """
    outcome: dict[str, Any] = {}
    _leave_after_deadline(outcome)
    order = order_from(environ)
    store = GcsKeyValue(environ[ADDRESS_VARIABLE])
    now = time.time()
    verb = order.get("verb")
    if order.get("format", ORDER_FORMAT) != ORDER_FORMAT:
        answer({"error": f"an order of format {order.get('format')!r}; this code reads {ORDER_FORMAT}"})
        return 2
    problem = order_problem(order, submission_id_from(environ))
    if problem is not None:
        answer({"unknown": str(order.get("id"))[:200]} if verb == "stop" else {"error": problem})
        return 2
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
        answer({"error": f"unknown order {verb!r}"})
        return 2
    outcome["result"] = result
    ensure_keeper(store, now)
    answer(result)
    return 0


def _leave_after_deadline(outcome: dict[str, Any]) -> None:
    """Past :data:`HELPER_DEADLINE_S`, answer with ``outcome["result"]`` (what the order did, once done) or an error,
    and end the process whatever it waits on."""

    def leave() -> None:
        done = "result" in outcome
        answer(outcome["result"] if done else {
            "error": f"the order's helper job did not finish within {HELPER_DEADLINE_S:g}s; send it again"})
        print(f"{OWN_LINE_PREFIX}this helper job ran past {HELPER_DEADLINE_S:g}s and leaves, so that the head's "
              "resource is free for a keeper", flush=True)
        os._exit(0 if done else 1)

    timer = threading.Timer(HELPER_DEADLINE_S, leave)
    timer.daemon = True
    timer.start()

def main() -> int:
    """An order job's work on the cluster when no keeper read it (its order in its variables).

    Fail soft: one paragraph for the client, never a traceback of ours.
    """
    try:
        return helper(os.environ)
    except Exception as exc:  # noqa: BLE001 - one paragraph for the client, never a traceback of ours
        answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1
