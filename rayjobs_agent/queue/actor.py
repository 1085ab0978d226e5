"""The keeper as Ray runs it: the detached actor around :class:`~.keeper.Keeper` (its loop, its snapshot in the
head's log folder), its start or replacement by a helper job, and the head's resource kept free for it.

A keeper is placed only where its share of the head's ``node:__internal_head__`` is free (``queueing``): orders
wait behind it because their share and its exceed the whole. Whatever else holds that much (a helper job, for a moment;
the supervisor of an order that ended, for ever) keeps a restarted keeper waiting, so a helper that finds the keeper
waiting to be placed takes down such supervisors (``keeper.end_stray_order_supervisors``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import sys
from typing import Any

from ..queueing import KEEPER_RESOURCES, SNAPSHOT_FILE, agent_version
from ..wire import say
from .keeper import Keeper, StepAside, end_stray_order_supervisors
from .ray_jobs import DashboardJobs, last_line
from .store import GcsKeyValue, KeyValue

KEEPER_NAME = "rayjobs-queue-keeper"

KEEPER_NAMESPACE = "rayjobs"

# How often the keeper lists the store's keys and the order jobs (two requests; a step only when they changed, or
# when ``keeper.STEP_EVERY_S`` has passed). While nothing waits it looks every IDLE_TICK_S: an idle keeper costs the
# head next to nothing, and an order waits a quarter of a second at most.
TICK_S = 0.1

IDLE_TICK_S = 0.25

# A keeper that wrote no heartbeat for this long is hung or gone, and is replaced.
BEAT_FRESH_S = 10.0

# Written at least this often even when nothing changed, so that a reader can tell a live keeper.
SNAPSHOT_EVERY_S = 5.0


class KeeperActor:
    """The detached actor around :class:`Keeper`: its loop runs in a thread, its snapshot goes to the head's log folder."""

    def __init__(self) -> None:
        import ray

        from ..ray_internals import logs_dir

        self.store = GcsKeyValue(ray.get_runtime_context().gcs_address)
        self.keeper = Keeper(self.store, DashboardJobs(self.store), say=_say)
        self.snapshot_path = os.path.join(logs_dir(), SNAPSHOT_FILE)
        self._thread = threading.Thread(target=self._loop, name="rayjobs-queue-keeper", daemon=True)
        self._thread.start()

    def version(self) -> str:
        """The code this keeper runs (``queueing.agent_version``)."""
        return self.keeper.version

    def _loop(self) -> None:
        last_problem = ""
        written, written_at = "", 0.0
        stepped_at = 0.0
        waits = True
        while True:
            try:
                if self.keeper.step_due(self.keeper.watched_keys(), time.monotonic() - stepped_at):
                    stepped_at = time.monotonic()
                    snapshot = self.keeper.step()
                    body = json.dumps({key: value for key, value in snapshot.items() if key != "at"}, sort_keys=True)
                    if body != written or time.time() - written_at >= SNAPSHOT_EVERY_S:
                        _write_atomically(self.snapshot_path, json.dumps(snapshot, sort_keys=True))
                        written, written_at = body, time.time()
                        # What the snapshot holds was read after this moment: a helper waits for it (enqueue).
                        self.store.put("published", json.dumps({"read_from": snapshot["at"]}).encode())
                    self.keeper.note_keys_after_step()
                last_problem = ""
                waits = self.keeper.waits()
            except StepAside as aside:
                _say(f"queue keeper: an order of other code ({aside}) came; this keeper steps aside for a keeper of "
                     "that code")
                self._leave()
                return
            except Exception as exc:  # noqa: BLE001 - a store error now and then must not end the queue
                problem = f"{type(exc).__name__}: {last_line(str(exc))}"
                if problem != last_problem:
                    _say(f"queue keeper: {problem}; trying again")
                last_problem = problem
            time.sleep(TICK_S if waits else IDLE_TICK_S)

    def _leave(self) -> None:
        import ray

        self.store.delete("keeper")
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

def _say(text: str) -> None:
    say(text, sys.stdout)

def _write_atomically(path: str, text: str) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        handle.write(text + "\n")
    os.replace(partial, path)

def keeper_is_current(store: KeyValue, now: float) -> bool:
    """Whether a keeper of this code wrote its heartbeat lately."""
    raw = store.get("keeper")
    beat = json.loads(raw) if raw else {}
    return beat.get("version") == agent_version() and now - float(beat.get("at") or 0) < BEAT_FRESH_S

def ensure_keeper(store: KeyValue, now: float) -> None:
    """Make sure the cluster has a keeper of this code: a live one whose heartbeat is fresh is left alone; one of
    other code, or one that answers but beats no more (its loop hangs), is replaced; none, or a beat with no keeper
    behind it, and one is started.

    It is called from a helper job, which holds the head's resource the keeper needs: the new keeper is placed once
    the helper ends, so it is not waited for. A recovery order (``queueing.RECOVERY_RESOURCES``) holds none of it:
    it runs beside a hung keeper, which still holds its share, and replaces it (a process stopped whole answers
    nothing, and is killed all the same).
    """
    current = keeper_is_current(store, max(now, time.time()))  # ``now``: when the helper began, perhaps long ago
    import ray

    ray.init(address="auto", namespace=KEEPER_NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    try:
        try:
            existing = ray.get_actor(KEEPER_NAME)
        except ValueError:
            existing = None
        # A fresh beat counts only with a keeper behind it: one killed for good a moment ago leaves a fresh beat, and
        # an order's helper (not a recovery order's) runs only while no keeper holds its share of the head's resource.
        if existing is not None and current:
            return
        if existing is not None and not _started(existing):
            # Being created or restarted (after its node died, or waiting for this helper's share of the head): the
            # beat read is its predecessor's. Killing it would leave another keeper in the same wait, and orders
            # placed meanwhile would kill that one too; it starts once the head's resource is free, which a
            # supervisor of an ended order would hold for ever.
            end_stray_order_supervisors(store, DashboardJobs(store), _say)
            return
        if existing is not None:
            ray.kill(existing, no_restart=True)
            _wait_until_gone(ray)
        modules = (ray.get_runtime_context().runtime_env or {}).get("py_modules") or []
        ray.remote(KeeperActor).options(
            name=KEEPER_NAME, lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=-1,
            resources=dict(KEEPER_RESOURCES), runtime_env={"py_modules": list(modules)}).remote()
    finally:
        ray.shutdown()

def _started(actor: Any) -> bool:
    """Whether Ray's actor table says ``actor`` runs (ALIVE); True when it cannot say (it is then replaced as before)."""
    try:
        from ray._private.state import actors

        return actors(actor._actor_id.hex()).get("State") == "ALIVE"
    except Exception:  # noqa: BLE001 - an internal API of Ray's: without it, a stale beat is enough
        return True

def _wait_until_gone(ray: Any) -> None:
    for _ in range(100):
        try:
            ray.get_actor(KEEPER_NAME)
        except ValueError:
            return
        time.sleep(0.1)
