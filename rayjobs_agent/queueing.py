"""A queue on a plain Ray cluster, as its clients and its keeper both see it: the queue's names, its orders and
their answers, and the admission a job is started with.

Ray starts every submitted job at once; jobs that do not fit wait PENDING or half-placed, in no
order, and give up after Ray's start timeout. A job of a queue (``queue:`` in its spec) is therefore
not submitted to Ray when it is submitted to rayjobs: its whole job request is written into the
cluster's key-value store (the GCS), and one small detached actor per cluster, the queue's keeper
(``rayjobs_agent/queue``), submits it to Ray when its turn comes: its queue runs fewer jobs than its
limit, no job ahead of it waits, and the cluster has free what the job will use. Until then the job
costs the head one entry, a few KiB, where a waiting Ray job would cost its supervisor and wrapper
processes.

**Orders.** The store is reachable from inside the cluster only, so a client hands the keeper each
order (enter a job, stop one, set a limit) as a Ray job that never runs: one request to Ray's job
API, its order in its variables, asking for 0.61 of the head node's ``node:__internal_head__``
resource, of which the keeper itself holds 0.4. While a keeper lives the order cannot be placed: it
waits PENDING, costing no process, and the keeper reads it from Ray's job table, carries it out and
ends it STOPPED with its answer as the job's message. With no keeper alive (a cluster's first order,
a keeper being replaced) the order is placed and runs as a helper job: it writes what the order asks
into the store itself and starts the keeper. An order to enter job ID is submitted as
``rayjobs-order-enqueue-ID``, and Ray's job table takes one submission of an id only, so two clients
entering one fixed id at once cannot both succeed; that order stays in Ray's table until the keeper
has submitted job ID itself, so the id is never free in between.

When the head node restarts, the key-value store starts empty unless the cluster keeps the GCS in
Redis (GCS fault tolerance, ``RAY_REDIS_ADDRESS`` on the head): with it, waiting jobs, limits and
slots survive, and the keeper (restarted by Ray) finds the jobs that were running on the old head
lost and retries them as their ``retry_on`` says; without it, they are gone with the rest of Ray's
job table, as every job on that head is.

Standard library only: the client imports it, and every job's wrapper.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .wire import (JOB_ID_PATTERN, METADATA_AGENT_VERSION, METADATA_NAME, SUBMISSION_ID_KEY, job_metadata,
                   ray_env_json)

NAMESPACE = b"rayjobs-queue"

# A queue's name goes into the store's keys, job metadata and log lines, and on Kubernetes into Kueue's
# LocalQueue label: what a Kubernetes name may be, and nothing a key's "/" or a shell could read.
QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")

QUEUE_NAME_RULE = "1 to 63 lowercase letters, digits or '-', starting with a letter or digit"

# The order an order job carries, and the admission the keeper hands the job it submits.
REQUEST_ENV_VAR = "RAYJOBS_QUEUE_REQUEST"

ADMISSION_ENV_VAR = "RAYJOBS_QUEUE_ADMISSION"

# What the keeper's answer to an order begins with: the order job's message, or a line of its log when it ran as a
# helper job; and the name order jobs run under (``rayjobs list`` shows none of them).
ANSWER_MARKER = "rayjobs-queue "

HELPER_NAME = "rayjobs-queue"

# What the keeper publishes of the queue, in the head node's Ray log folder, which Ray's log API serves to clients.
SNAPSHOT_FILE = "rayjobs-queue.json"

# Every order job's id begins so; the order to enter job ID is ``rayjobs-order-enqueue-ID``.
ORDER_PREFIX = "rayjobs-order-"

ENQUEUE_ORDER_PREFIX = f"{ORDER_PREFIX}enqueue-"

# Ray's own resource of the head node, of which the head has exactly 1. The keeper holds 0.4 of it and an order asks
# for 0.61: a keeper and an order together, or two orders, need more than the whole. So while a keeper lives no order
# is placed (it waits, costing no process, for the keeper to read it); with none alive an order runs as a helper job
# that starts one, one such helper at a time (a recovery order asks for none and runs beside), and the keeper is
# placed once the helper has ended. Not the whole: other
# code holds slivers of it for as long as the cluster lives (Ray Train's state actor, 0.001, from a cluster's first
# training run on; the Serve controller; actors a user pins to the head), and an order that asked for the whole would
# never be placed there, so a cluster that trained before its first order never got a keeper. Up to 0.39 held by
# others leaves orders and the keeper placeable.
HEAD_RESOURCE = "node:__internal_head__"

KEEPER_RESOURCES = {HEAD_RESOURCE: 0.4}

ORDER_RESOURCES = {HEAD_RESOURCE: 0.61}


# An order of other code than the keeper's is stepped aside for: it then runs as a helper job of its own code. One
# still PENDING this long after a keeper first stepped aside for it was never placed (it asks for more of the head
# than is free there), and every keeper after would step aside for it in turn: it is refused instead.
OTHER_CODE_PLACED_WITHIN_S = 60.0

# Why such an order is refused.
UNPLACEABLE_ORDER = ("it comes from other rayjobs code, whose orders ask for more of the head's resource than is free "
                     "on this cluster (older code asked for the whole of it): upgrade rayjobs where it was sent from")

# Keepers step aside for at most this many orders of other code in any STEP_ASIDE_WINDOW_S: each costs the queue a
# keeper's restart, and anyone who can submit a job can send an order under a fresh id. Past it, such orders are
# refused at once.
MOST_STEP_ASIDES = 5

STEP_ASIDE_WINDOW_S = 600.0

TOO_MANY_STEP_ASIDES = (f"it comes from other rayjobs code, and this cluster's keepers have stepped aside for "
                        f"{MOST_STEP_ASIDES} such orders within {STEP_ASIDE_WINDOW_S / 60:g} minutes: every client of "
                        "a cluster should run one rayjobs; upgrade rayjobs where it was sent from")


def never_placed(order_info: Mapping[str, Any], aside_for_s: float) -> bool:
    """Whether an order job of other code (Ray's record of it) will never be placed: it asks for the whole of the
    head's resource, as the orders of code from before the keeper held a share of it did, or it still waits
    :data:`OTHER_CODE_PLACED_WITHIN_S` after a keeper first stepped aside for it (``aside_for_s`` ago). A job under an
    order's id that is no helper (another command, resources no order asks for: anyone may submit one) is never
    stepped aside for either."""
    resources = order_info.get("entrypoint_resources") or {}
    if (order_info.get("entrypoint") != HELPER_ENTRYPOINT or not isinstance(resources, Mapping)
            or set(resources) - {HEAD_RESOURCE}):
        return True
    asked = resources.get(HEAD_RESOURCE)
    return (isinstance(asked, (int, float)) and asked >= 1.0) or aside_for_s >= OTHER_CODE_PLACED_WITHIN_S

# An order that asks for none of the head's resource is placed even while a keeper that works no more (its process
# stopped, its loop hung) holds its share: it runs as a helper job, which replaces that keeper. A client sends one
# when an order of its own has waited unanswered while the keeper's snapshot, written every few seconds by a keeper
# that works, was older than KEEPER_HUNG_AFTER_S by the head's clock.
RECOVERY_RESOURCES: dict[str, float] = {}

KEEPER_HUNG_AFTER_S = 20.0

# What runs an order job when no keeper is alive to read it: a constant command, its order in its variables.
HELPER_ENTRYPOINT = "python -m rayjobs_agent.queue"

# The version of the orders' format, which a keeper checks before it carries one out.
ORDER_FORMAT = 1

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})

# Where a stop found its job, as the keeper answers it (``was``): the client's words for the stop follow from it.
STOP_FOUND_WAITING = "waiting"
STOP_FOUND_RUNNING = "running"
STOP_FOUND_ENDED = "ended"
# Lost whole, with its next attempt decided but not yet submitted: the stop withdraws that attempt.
STOP_FOUND_RETRY_DUE = "waiting to be submitted again"

# In a helper job's answer: the order was carried out, but the keeper that would act on it could not be started
# (why); the client says so, and the next order starts one.
NO_KEEPER_ANSWER_KEY = "keeper_not_started"

# A pipeline job's state as its client and its keeper both word it: a status of Ray's, ``waiting (why)``, or
# ``not run (why)`` for a job that ended without running because a job it ran after did not succeed.
NOT_RUN = "not run"


def pipeline_job_ended(state: str) -> bool:
    """Whether a pipeline job in ``state`` (its words, as :data:`NOT_RUN` says) will change no more."""
    return state in TERMINAL or state.startswith(NOT_RUN)


def pipeline_run_status(states: Iterable[str]) -> str:
    """A pipeline run's status from its jobs' states in the graph's order: SUCCEEDED while none failed, was stopped
    or not run; else the first one that did decides, STOPPED for a stopped job, FAILED for a failed one or one not
    run. The client's exit code and the keeper's notification both read it so."""
    for state in states:
        if state == "STOPPED":
            return "STOPPED"
        if state == "FAILED" or state.startswith(NOT_RUN):
            return "FAILED"
    return "SUCCEEDED"


class QueueNameError(ValueError):
    """A queue's name outside :data:`QUEUE_NAME`."""

def checked_queue_name(name: str) -> str:
    """``name``, if it may name a queue; else :class:`QueueNameError` saying what a name may hold."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise QueueNameError(f"{name!r} cannot name a queue: use {QUEUE_NAME_RULE}")
    return name

# A resource a queue's quota names: Ray's own (CPU, GPU, memory) or a custom one, never text a shell would read.
RESOURCE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")

def is_amount(value: Any) -> bool:
    """Whether ``value`` is an amount of a resource an order may carry: a JSON number (not a bool, not text that
    reads as one), finite, 0 or more. The keeper compares and adds them: anything else would stop its step."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            and value != float("inf"))

def quota_problem(quota: Mapping[str, Any]) -> str | None:
    """What is wrong with a queue's quota (resource name -> the most its running jobs hold together), or None."""
    for name, amount in quota.items():
        if not isinstance(name, str) or not RESOURCE_NAME.fullmatch(name):
            return (f"{str(name)[:80]!r} cannot name a resource: use a letter, then up to 63 letters, digits or "
                    "'_', '.', ':', '-'")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return f"the quota of {name} is {str(amount)[:80]!r}, not a number"
        if not is_amount(amount) or not amount > 0:
            return (f"a quota of {str(amount)[:80]!r} {name} lets no job in (or every one): give a positive number, "
                    "or remove the queue's limits with --no-limit")
    return None

def awaits_next_attempt(info: Mapping[str, Any], decided: Mapping[str, Any] | None) -> bool:
    """Whether a job that ended FAILED (``info``: Ray's record of it) may still run again as the keeper's next
    attempt: it was lost whole (not its entrypoint's failure) and the keeper has not decided yet (``decided``: its
    decision, None while there is none), or decided to retry it."""
    if info.get("status") != "FAILED":
        return False
    if decided is not None:
        return bool(decided.get("retry"))
    from .retries import ENTRYPOINT_FAILED

    error_type = info.get("error_type")
    if not error_type or error_type == ENTRYPOINT_FAILED:
        return False  # its entrypoint ran: the agent beside it decided, and retried it in place if it could
    admission = json.loads((((info.get("runtime_env") or {}).get("env_vars") or {}).get(ADMISSION_ENV_VAR)) or "{}")
    return not admission.get("outcome")  # a stand-in (a job that never runs) is never run again

def order_problem(order: Mapping[str, Any], order_id: str) -> str | None:
    """What makes an order one no keeper or helper carries out (``order_id``: its order job's id). None: none.

    A job or run id it names must be an id rayjobs takes (an id is a key of the store, ``waiting/QUEUE/ID``: one
    with a "/" would be read as another key). An order to enter job ID must come as ``rayjobs-order-enqueue-ID``:
    Ray's job table takes that id once, which is what keeps two orders entering one job from both writing it. The
    amounts a job to enter asks for are numbers, 0 or more and finite: a quota adds them up.
    """
    named = [order.get("id")] if order.get("verb") in ("enqueue", "stop", "withdraw") else []
    if order.get("verb") == "seal":
        named = [order.get("run"), *(order.get("jobs") or {}).values()]
    bad = [str(found)[:200] for found in named if re.match(JOB_ID_PATTERN, str(found)) is None]
    if bad:
        return f"{bad[0]!r} is no job id rayjobs takes"
    if order.get("verb") == "set":
        limit = order.get("max_running")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            return f"a queue's max_running of {limit!r}: give a whole number, 0 or more"
        if order.get("quota") is not None:
            return quota_problem(order["quota"]) if isinstance(order["quota"], Mapping) else "a quota is a mapping"
    if order.get("verb") == "enqueue":
        if entered_job(order_id) != str(order.get("id")):
            return f"order {order_id} does not enter job {str(order.get('id'))[:200]!r}"
        return _enqueue_amounts_problem(order)
    return None

def _enqueue_amounts_problem(order: Mapping[str, Any]) -> str | None:
    request = order.get("request")
    if not isinstance(request, Mapping):
        return "an order to enter a job carries its request, a mapping"
    needs, resources = order.get("needs") or {}, request.get("entrypoint_resources") or {}
    if not isinstance(needs, Mapping) or not isinstance(resources, Mapping):
        return "a job's needs and entrypoint resources are mappings of a resource's name to an amount"
    amounts = [*((str(name), amount) for name, amount in needs.items()),
               *((f"entrypoint {name}", request.get(f"entrypoint_num_{name.lower()}s"))
                 for name in ("CPU", "GPU") if request.get(f"entrypoint_num_{name.lower()}s") is not None),
               *((f"entrypoint {name}", amount) for name, amount in resources.items())]
    for name, amount in amounts:
        if not is_amount(amount):
            return f"the job asks for {str(amount)[:80]!r} {name[:80]}: an amount is a number, 0 or more and finite"
    grows = order.get("grows") or []
    if not isinstance(grows, list) or not all(isinstance(name, str) and name for name in grows):
        return f"a job grows into resources named by a list of names, not {str(grows)[:80]!r}"
    return None

# The end of the id the keeper gives a job's next attempt (``queue.lost_jobs.next_attempt_id``): ``ID-attemptN``, or
# ``ID-attemptN-K`` when an earlier run of the same fixed id took that one. A job named so would take another's retry.
ATTEMPT_ID_SUFFIX = re.compile(r"-attempt\d+(-\d+)?$")

def enqueue_order_id(job_id: str) -> str:
    """The id of the order job that enters job ``job_id`` into its queue (it holds the id until the job is in Ray)."""
    return ENQUEUE_ORDER_PREFIX + job_id

def entered_job(order_id: str) -> str | None:
    """The job an order job enters into its queue (None for an order of another kind)."""
    return order_id[len(ENQUEUE_ORDER_PREFIX):] if order_id.startswith(ENQUEUE_ORDER_PREFIX) else None

def is_order(job_id: str, info: Mapping[str, Any]) -> bool:
    """Whether a job of Ray's table is one of the queue's order jobs (or a helper job of an older rayjobs)."""
    return job_id.startswith(ORDER_PREFIX) or (info.get("metadata") or {}).get(METADATA_NAME) == HELPER_NAME

def agent_version() -> str:
    """A hash of this package's code: a keeper of other code steps aside for one of this code."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]

@functools.lru_cache(maxsize=1)
def _own_version() -> str:
    return agent_version()

def order_submission(order: dict[str, Any], order_id: str, agent_modules: list[str],
                     metadata: Mapping[str, str] | None = None,
                     resources: Mapping[str, float] = ORDER_RESOURCES) -> dict[str, Any]:
    """The request to Ray's job API that hands ``order`` (``verb`` and its fields) to the cluster's queue, under
    ``order_id`` (``agent_modules``: the agent's package, for when it runs as a helper job; ``resources``:
    :data:`RECOVERY_RESOURCES` for an order that must run even beside a hung keeper)."""
    document = {**order, "format": ORDER_FORMAT}
    # The code's version goes beside the order, not inside it: a keeper of any code can read it, and step aside.
    return {"submission_id": order_id, "entrypoint": HELPER_ENTRYPOINT,
            **({"entrypoint_resources": dict(resources)} if resources else {}),
            "runtime_env": {"py_modules": list(agent_modules), "env_vars": order_variables(document)},
            "metadata": {METADATA_NAME: HELPER_NAME, METADATA_AGENT_VERSION: _own_version(), **(metadata or {})}}

def submission_id_from(environ: Any) -> str:
    """The job's submission id, from the job config Ray hands its driver ("" when there is none)."""
    return str(job_metadata(environ).get(SUBMISSION_ID_KEY) or "")

@dataclass
class Admission:
    """What the keeper hands a job it submits (``RAYJOBS_QUEUE_ADMISSION``): its slot, and how long it waited.

    ``outcome`` is set on a job that never runs: it was stopped while it waited (``STOPPED``), or Ray
    refused its request (``FAILED``, with ``reason``). Its wrapper then ends it so, with its record.

    ``granted``: what a job that takes what is free (an ``auto`` layout) may take, by resource: what the queue let
    it in with and counts as its own while it runs.
    """

    queue: str
    slot: int = -1
    generation: int = -1
    waited_s: float = 0.0
    position: int = 0
    outcome: str = ""
    reason: str = ""
    # When the keeper let it in (the head's clock): the queue's order, whichever wrapper starts first.
    admitted_at: float = 0.0
    granted: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        """The variable's value (JSON, with ``$`` escaped: Ray expands ``$NAME`` in every variable it sets)."""
        document = {"queue": self.queue, "slot": self.slot, "generation": self.generation,
                    "waited_s": round(self.waited_s, 3), "position": self.position, "outcome": self.outcome,
                    "reason": self.reason, "admitted_at": round(self.admitted_at, 6), "granted": self.granted}
        return ray_env_json(document)

    @classmethod
    def from_environment(cls, environ: Any) -> Admission | None:
        """The admission a job was started with, or None (a job not started by a queue's keeper)."""
        text = environ.get(ADMISSION_ENV_VAR)
        if not text:
            return None
        document = json.loads(text)
        return cls(str(document["queue"]), int(document.get("slot", -1)), int(document.get("generation", -1)),
                   float(document.get("waited_s") or 0), int(document.get("position") or 0),
                   str(document.get("outcome") or ""), str(document.get("reason") or ""),
                   float(document.get("admitted_at") or 0.0),
                   {str(name): float(amount) for name, amount in (document.get("granted") or {}).items()})

# Ray caps one variable's value at what the kernel takes for one string of a process's environment (128 KiB):
# a large order is split over numbered variables.
_ORDER_CHUNK_CHARS = 96 * 1024

def order_variables(order: dict[str, Any]) -> dict[str, str]:
    """A helper job's order as its variables: compressed, base64 (nothing for Ray to expand), split when large."""
    text = base64.b64encode(zlib.compress(json.dumps(order).encode(), 9)).decode()
    chunks = [text[start:start + _ORDER_CHUNK_CHARS] for start in range(0, len(text), _ORDER_CHUNK_CHARS)] or [""]
    return {REQUEST_ENV_VAR if index == 0 else f"{REQUEST_ENV_VAR}_{index}": chunk
            for index, chunk in enumerate(chunks)}

def ran_as_helper(order_info: Mapping[str, Any], verb: str, job_id: str) -> bool:
    """Whether Ray's record of an order job shows what :func:`order_submission` sends for order ``verb`` about job
    ``job_id``, run as a helper job: the helper's command under its name, the agent's uploaded package and the
    order's variables alone. Anyone may submit a job under an order's id; only such a job's log holds an answer to
    read (one that copies all of it too can only say what an order of that client would have said)."""
    runtime_env = order_info.get("runtime_env") or {}
    env_vars = runtime_env.get("env_vars") or {}
    modules = runtime_env.get("py_modules") or []
    if (order_info.get("entrypoint") != HELPER_ENTRYPOINT
            or (order_info.get("metadata") or {}).get(METADATA_NAME) != HELPER_NAME
            or set(runtime_env) - {"py_modules", "env_vars"} or not isinstance(env_vars, dict)
            or not isinstance(modules, list) or not all(str(uri).startswith("gcs://") for uri in modules)
            or not all(str(name).startswith(REQUEST_ENV_VAR) for name in env_vars)):
        return False
    try:
        order = order_from(env_vars)
    except Exception:  # noqa: BLE001 - variables that hold no order: no helper of ours
        return False
    return isinstance(order, dict) and order.get("verb") == verb and order.get("id") == job_id


def order_from(environ: Mapping[str, str]) -> dict[str, Any]:
    """The order :func:`order_variables` wrote, read back from a helper job's environment."""
    chunks, index = [environ.get(REQUEST_ENV_VAR) or ""], 1
    while f"{REQUEST_ENV_VAR}_{index}" in environ:
        chunks.append(environ[f"{REQUEST_ENV_VAR}_{index}"])
        index += 1
    return json.loads(zlib.decompress(base64.b64decode("".join(chunks))))

def answer(document: Any) -> None:
    """Print a helper job's answer, the one line its caller reads back."""
    print(answer_text(document), flush=True)

def answer_text(document: Any) -> str:
    """An answer as one line: the keeper's message on an order job it read, or the line a helper job prints."""
    return ANSWER_MARKER + json.dumps(document, sort_keys=True, default=str)

def answer_in(text: str) -> Any | None:
    """The answer in an order job's message, or in its log when it ran as a helper job (None: there is none)."""
    for line in reversed((text or "").splitlines()):
        if line.startswith(ANSWER_MARKER):
            try:
                return json.loads(line[len(ANSWER_MARKER):])
            except ValueError:
                return None
    return None
