"""The agent's decisions about a running job, from its whole output: why an attempt failed, whether it waits for
resources, whether it has stalled.

The wrapper (``supervisor.py``) runs the entrypoint; the :class:`Judge` reads the driver log as it grows (a handle of its
own, apart from the record's copy, so that storage that hangs never delays a decision) and says each decision once,
as an event in the log and a line of its own beside it. Standard library only, but for Ray's GCS client, imported
when the cluster is asked what it has pending.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from .causes import UNKNOWN, Diagnosis, FailureReader, killed_by
from .events import emit
from .masking import environment_mask
from .pinning import ADDRESS_VARIABLE
from .ray_lines import ANSI_ESCAPE
from .record_parts import READ_BYTES, LineBuffer
from .record_store import reason
from .recorder import say
from .vocabulary import EventKind
from .watch import JobWatch, StallDecision, WaitDecision
from .wire import WATCH_ENV_VAR

# How often the watch reads the log: a wait or a stall is said within about this much of becoming one.
_WATCH_EVERY_S = 1.0


class Judge:
    """The agent's decisions about the job, from its whole output (the driver log, read here as it grows).

    Why an attempt failed is decided once, with the one table of causes (``causes.py``), and said once:
    a ``cause`` event in the log and the record, which the client, ``status``, notifications and the retry
    rule read; nothing else reads a cause into the log. While the entrypoint runs, a thread of its own reads
    the log every second for the watch (``watch.py``): a wait for resources or a stall is said as a ``wait``
    or ``stall`` event, once each. The log is read by a handle of its own, apart from the record's copy, so
    that storage that hangs never delays a decision. What is said is masked.
    """

    def __init__(self, environ: Mapping[str, str], notifier: Any = None) -> None:
        self.reader = FailureReader()
        self.said: Diagnosis | None = None
        self.lines = OwnLog.open()
        self.notifier = notifier
        self.watch = JobWatch(stall_after(environ), time.monotonic(),
                              nodes=self._node_totals if ADDRESS_VARIABLE in environ else None)
        self.address = environ.get(ADDRESS_VARIABLE)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._between_attempts = threading.Event()
        # Why the watch stopped taking lines (None: it takes them); the cause table reads on without it.
        self._watch_broken: str | None = None
        self._thread = threading.Thread(target=self._run, name="rayjobs-watch", daemon=True)
        try:
            self.mask: Any = environment_mask(environ)
        except Exception:  # noqa: BLE001 - then nothing of the log is said, only the cause's name
            self.mask = None

    def start(self) -> None:
        """Begin watching the running job (nothing to watch when the log is no file)."""
        if self.lines is not None:
            self._thread.start()

    def stop(self) -> None:
        """The entrypoint has ended: no more waits or stalls."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(_WATCH_EVERY_S * 2)

    def decide(self, attempt: int, code: int) -> dict[str, Any]:
        """Why attempt ``attempt`` failed (its entrypoint exited ``code``), said as a ``cause`` event; its fields."""
        self.read()
        if self.lines is not None and self.lines.partial:
            # The entrypoint's last line has no end: the agent's own lines start on a line of their own.
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.lines.read()
        with self._lock:
            diagnosis = self.reader.diagnose()
            last_raised = self.reader.last_raised
        killed = killed_by(code)
        if killed:
            say(f"the entrypoint {killed}")
        if diagnosis is None:
            diagnosis = Diagnosis(UNKNOWN, f"the entrypoint exited with code {code}" + (f" (it {killed})" if killed
                                                                                       else ""),
                                  "", last_raised or "", True)
        fields = diagnosis.as_dict()
        fields.update({key: self._masked(fields[key]) for key in ("text", "evidence")})
        self.said = Diagnosis(**fields)
        emit(EventKind.CAUSE, attempt=attempt, exit_code=code, **fields)
        return fields

    def between_attempts(self) -> None:
        """The retry's wait has begun: the job is silent by design, so no wait or stall is said until the next
        attempt starts."""
        self._between_attempts.set()

    def next_attempt(self) -> None:
        """The entrypoint runs again: what the last attempt printed says nothing of the next one."""
        with self._lock:
            self.reader.forget_attempt()
            self.watch.event({"event": EventKind.ATTEMPT}, time.monotonic())
        self.said = None
        self._between_attempts.clear()

    def read(self) -> None:
        """Take in what the log has grown by: every line to the cause table and the watch."""
        if self.lines is None:
            return
        with self._lock:
            now = time.monotonic()
            for line in self.lines.read():
                # Ray colours the prefix of every line it forwards, even into a log file. The line is masked
                # whole before anything keeps a piece of it: a secret cut in two no longer matches its mask.
                plain = ANSI_ESCAPE.sub("", line)
                if self.mask is not None:
                    plain = self.mask.mask_text(plain)
                self.reader.line(plain)
                if self._watch_broken is None:
                    try:
                        self.watch.line(plain, now)
                    except Exception as exc:  # noqa: BLE001 - a line the watch chokes on must not cost the cause
                        self._watch_broken = reason(exc)

    def _run(self) -> None:
        while not self._stopped.wait(_WATCH_EVERY_S):
            try:
                self.read()
                if self._watch_broken is None and not self._between_attempts.is_set():
                    self._ask_the_cluster_when_quiet()
                    with self._lock:
                        decision = self.watch.decide(time.monotonic())
                    if decision is not None:
                        self._say(decision)
            except Exception as exc:  # noqa: BLE001 - the watch is a courtesy: it stops, the job runs on
                self._watch_broken = reason(exc)
            if self._watch_broken is not None:
                say(f"the watch over the job stopped ({self._watch_broken}); waits and stalls are no longer named")
                return

    def _ask_the_cluster_when_quiet(self) -> None:
        """Quiet for a while before its workers started: Ray Train waits for its worker group without a word,
        so the cluster is asked what it has pending (its first demand is the wait)."""
        watch = self.watch
        with self._lock:
            if ADDRESS_VARIABLE not in os.environ or not watch.time_to_ask_the_cluster(time.monotonic()):
                return
        from .ray_internals import gcs_client, pending_demand

        demand = pending_demand(gcs_client(os.environ[ADDRESS_VARIABLE]))
        if demand is not None:
            asked, for_what, total = demand
            with self._lock:
                watch.demand_pending(asked, for_what, total)

    def _node_totals(self) -> list[dict[str, float]]:
        from .ray_internals import gcs_client, node_totals

        return node_totals(gcs_client(self.address or ""))

    def _say(self, decision: WaitDecision | StallDecision) -> None:
        if isinstance(decision, WaitDecision):
            fields = {**decision.fields(), "evidence": self._masked(decision.evidence)}
            emit(EventKind.WAIT, **fields)
            say(f"{fields['text']}. {fields['advice']}")
            return
        emit(EventKind.STALL, **decision.fields())
        say(f"the job has printed nothing of its own and reported no progress for {decision.silent_s:.0f}s "
            f"(stall limit {decision.limit_s:g}s); it is left running")
        if self.notifier is not None:
            self.notifier.stalled(decision.silent_s)

    def _masked(self, text: str) -> str:
        return self.mask.mask_text(text) if self.mask is not None else ""


def stall_after(environ: Mapping[str, str]) -> float | None:
    """The spec's ``stall_after_s`` (None: from the job's pace, and when it cannot be read)."""
    try:
        value = json.loads(environ.get(WATCH_ENV_VAR) or "{}").get("stall_after_s")
        return float(value) if value is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


class OwnLog:
    """This process's stdout (the job's driver log, a file Ray points it at), read by lines as it grows.

    The line still being written is kept bounded (``record_parts.LineBuffer``): a progress bar redrawn with carriage
    returns for hours is kept as its last drawing, which is what a cause or a wait is read from.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._lines = LineBuffer()

    @classmethod
    def open(cls) -> OwnLog | None:
        """The log, or None when stdout is no file (then no cause is read from it)."""
        try:
            if stat.S_ISREG(os.fstat(1).st_mode):
                return cls(open(f"/proc/{os.getpid()}/fd/1", "rb"))
        except OSError:
            pass
        return None

    @property
    def partial(self) -> bool:
        """Whether the log ends inside a line (the last read found no line end after its last bytes)."""
        return bool(self._lines.unfinished)

    def read(self) -> list[str]:
        """The complete lines written since the last read (a redrawn line as it was last drawn, after a ``\\r``)."""
        lines: list[bytes] = []
        while chunk := self.handle.read(READ_BYTES):
            lines += self._lines.feed(chunk)
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]
