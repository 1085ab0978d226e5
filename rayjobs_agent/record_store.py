"""Where the run record goes, and how a write that fails is tried again.

:class:`Store` is a run's folder, local or ``s3://``. :class:`Uploader` stands between the record
keeper and its store: a write that fails is kept and tried again later, with a delay that doubles
after each failure up to :data:`RETRY_MAX_S`, so that a storage outage costs the job neither time
nor the record's content, only a later copy. It counts every failure, every write that went through
only on a later try and every one given up (``lost``): ``run.json`` says so in ``record_health``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .storage_location import StorageLocation

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# Writes waiting for storage that is down are kept in memory up to this much; older finished log and
# event parts are given up (counted as lost) past it, so that a long outage cannot exhaust the node.
MAX_PENDING_BYTES = 64 * 1024 * 1024
_LOST_NAMES_KEPT = 20
_REASON_CHARS = 300


class Store(StorageLocation):
    """A run's folder: local (files replaced whole, never half-written) or ``s3://`` (through pyarrow).

    The one storage type of rayjobs (:class:`StorageLocation`), made absolute on this node. Nothing is
    opened until the first read or write: pyarrow's S3 filesystem is imported then, after the entrypoint
    has started, so that keeping a record never delays the job.
    """

    __slots__ = ()

    @classmethod
    def at(cls, location: str) -> Store:
        """The store of ``location``: a path (``~`` expanded on this node) or ``s3://bucket/prefix``."""
        return cls.parse(location).absolute()

    @property
    def location(self) -> str:
        """Where the run's folder is, as messages name it."""
        return self.uri


class Uploader:
    """Writes to a :class:`Store` in the order asked, keeping what failed to try again after a backoff.

    A name asked for again replaces what was waiting under it (the growing part of a log, ``run.json``)
    and moves to the end, so that ``run.json``, asked for last at every upload, never gets ahead of
    the parts it counts.
    """

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.pending: dict[str, bytes] = {}
        self.failed_names: set[str] = set()
        self.failed_uploads = 0
        self.retried = 0
        self.written_ok = 0
        self.lost: list[str] = []
        self.lost_count = 0
        self.lost_bytes = 0
        self.last_error: str | None = None
        self.next_try_at = 0.0
        self._failures_in_a_row = 0

    def put(self, name: str, data: bytes) -> None:
        """Ask for ``data`` at ``name``; written at the next :meth:`flush` that storage accepts."""
        self.pending.pop(name, None)
        self.pending[name] = data
        self._keep_within_memory()

    def flush(self) -> bool:
        """Write what waits, in order, unless the backoff after a failure still runs; True when nothing waits.

        The first failure stops the round: storage that refuses one write would refuse the next, and
        the order is what keeps ``run.json`` behind its parts.
        """
        if self.pending and self.clock() < self.next_try_at:
            return False
        while self.pending:
            name, data = next(iter(self.pending.items()))
            try:
                self.store.write(name, data)
            except Exception as exc:  # storage down or refusing: kept, tried again after the backoff
                self.failed_uploads += 1
                self.failed_names.add(name)
                self.last_error = reason(exc)
                delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** self._failures_in_a_row)
                self._failures_in_a_row += 1
                self.next_try_at = self.clock() + delay
                return False
            del self.pending[name]
            self.written_ok += 1
            if name in self.failed_names:
                self.failed_names.discard(name)
                self.retried += 1
            self._failures_in_a_row = 0
        return True

    def give_up(self) -> None:
        """Count whatever still waits as lost (the job is over and storage did not come back in time)."""
        for name, data in list(self.pending.items()):
            self._lose(name, data)
        self.pending.clear()

    def health(self) -> dict[str, Any]:
        """``record_health`` of ``run.json``: failed writes, writes that went through on a later try, what was lost."""
        return {"failed_uploads": self.failed_uploads, "retried": self.retried, "waiting": len(self.pending),
                "lost": {"writes": self.lost_count, "bytes": self.lost_bytes, "names": list(self.lost)},
                "last_error": self.last_error}

    def troubled(self) -> bool:
        """Whether any write has failed so far."""
        return self.failed_uploads > 0

    def _keep_within_memory(self) -> None:
        waiting = sum(len(data) for data in self.pending.values())
        for name in list(self.pending):
            if waiting <= MAX_PENDING_BYTES:
                return
            if name.endswith((".log", ".jsonl")):
                data = self.pending.pop(name)
                waiting -= len(data)
                self._lose(name, data)

    def _lose(self, name: str, data: bytes) -> None:
        self.lost_count += 1
        self.lost_bytes += len(data)
        if len(self.lost) < _LOST_NAMES_KEPT:
            self.lost.append(name)


def reason(exc: BaseException) -> str:
    """An exception in one short line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:_REASON_CHARS]
