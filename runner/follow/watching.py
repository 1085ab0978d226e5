"""What a followed job's log feeds, wired together: its progress display, the failure reader, and the wait for
resources.

A job that runs beside the agent (every job rayjobs submits) has its waits and stalls decided there and said in
its log (``wait`` and ``stall`` events, with the agent's own line): the follower shows them and decides nothing.
A job submitted by other means has no agent; for it, the follower applies the agent's rules itself
(``rayjobs_agent.waits``, and ``runner.run.stall`` for the stall limit)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from runner.reporter import Reporter, own_line
from rayjobs_agent.vocabulary import EventKind, kind_of
from rayjobs_agent.causes import FailureReader
from runner.follow.display import LiveProgress, PlainProgress, wants_live_view
from runner.follow.log_view import LogView
from runner.follow.progress import RunProgress
from rayjobs_agent.waits import ResourceWait, pending_demand
from rayjobs_agent.wire import RECORD_COMMAND

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

# Events that show the job got what it waited for.
_WAIT_OVER = frozenset({EventKind.ATTEMPT, EventKind.REPORT, EventKind.STEP})


class Watch:
    """The log view a follower writes to, and what it feeds.

    Args:
        client: the cluster client (for the resources a waiting job could have).
        job_id: the job followed.
        logs_out, notes: where the job's lines and rayjobs' own lines go.
        raw: the log as written (no hiding, no events taken out).
        live: a live status block (None: when both streams are terminals); only with ``stream_logs``.
    """

    def __init__(self, client: JobsApi, job_id: str, logs_out: TextIO, notes: TextIO, *, raw: bool,
                 live: bool | None, stream_logs: bool) -> None:
        self.client = client
        self.job_id = job_id
        self.progress = RunProgress()
        self.failure = FailureReader()
        live = (live if live is not None else wants_live_view(logs_out, notes)) and stream_logs
        self.display: LiveProgress | PlainProgress
        if live:
            self.display = LiveProgress(self.progress, job_id, stream=logs_out)
            logs_out, notes = self.display.out, self.display.notes
        else:
            self.display = PlainProgress(self.progress, notes)
        self.logs_out, self.notes = logs_out, notes
        terminal = bool(getattr(logs_out, "isatty", lambda: False)())
        # The live block prints its own line for a stage, not for each report: there the job's epoch lines stay.
        self.view = LogView(logs_out, self._event, raw=raw, strip_ansi=not live and not terminal,
                            on_line=self.failure.line, on_wait=self._waiting, on_agent_line=self._say,
                            pipe=not live and not terminal,
                            echoed=(EventKind.STAGE,) if live else (EventKind.STAGE, EventKind.REPORT))
        # What the job waits for, in words, while it does (the agent's ``wait`` event, or Ray's own lines).
        self.waiting: str | None = None
        self._waits_said: set[tuple[Any, ...]] = set()
        # Whether the job runs beside the agent (known from its first status), and the stalls it said.
        self.beside_agent: bool | None = None
        self._stalls: list[float] = []

    def job_info(self, info: dict[str, Any]) -> None:
        """The job's status, as the follower reads it: whether the agent decides its waits and stalls."""
        if self.beside_agent is None and info.get("entrypoint"):
            self.beside_agent = str(info["entrypoint"]).startswith(RECORD_COMMAND)

    def new_stall(self) -> float | None:
        """The silence (seconds) of a stall the agent said since the last call, or None."""
        return self._stalls.pop() if self._stalls else None

    def last_activity(self) -> float | None:
        """When the job last showed a sign of its own life (time.monotonic()): an event or a line of its own."""
        return self.view.last_activity_at

    def waiting_text(self) -> str | None:
        """``waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster``, while it waits."""
        return self.waiting

    def _event(self, event: dict[str, Any]) -> None:
        kind = kind_of(event)
        if kind in _WAIT_OVER:
            self.waiting = None
            self._waits_said.clear()  # a later wait (after a restart) is a new one
        elif kind == EventKind.WAIT:
            self.waiting = str(event.get("text") or "") or None
        elif kind == EventKind.STALL:
            self._stalls = [float(event.get("silent_s") or 0.0)]
        self.display.event(event)

    def _waiting(self, wait: ResourceWait) -> None:
        """Ray said again that a job without the agent waits for resources: named once, with the numbers."""
        if self.beside_agent:
            return  # the agent names it, in its own line of the log
        said = (tuple(sorted(wait.asked.items())), wait.for_what)
        if said in self._waits_said:
            return
        self._waits_said.add(said)
        if wait.cluster is None:
            wait = wait.with_nodes(self._node_resources())
        self.waiting = wait.text()
        self._say(own_line(f"{wait.text()}; Ray keeps it waiting until they are free or the cluster grows "
                           "(ask for less, or add nodes)"))

    def on_quiet(self, silent_s: float) -> None:
        """The job has been quiet a while: if it has not got its workers yet and the cluster has demand pending
        (Ray Train V2 waits for its worker group without a word), that is the wait, named as Ray's lines are."""
        progress = self.progress
        if self.beside_agent or self.waiting is not None or progress.attempts > len(progress.restarts):
            return  # already named, or its workers run: a quiet job then is no resource wait
        from runner.errors import RayJobsError

        try:
            # format=1: the report `ray status` prints, with its "Pending Demands:" (without it, a debug string)
            status = self.client.get_json("/api/cluster_status?format=1")
            report = ((status or {}).get("data") or {}).get("clusterStatus") or ""
        except (RayJobsError, OSError, AttributeError, TypeError):
            return
        wait = pending_demand(report)
        if wait is not None:
            self._waiting(wait)

    def _node_resources(self) -> list[dict[str, float]]:
        from runner.errors import RayJobsError

        try:
            return self.client.node_resources()
        except (RayJobsError, OSError, AttributeError, TypeError):
            return []  # the wait is named without the cluster's numbers

    def close(self) -> None:
        """The log is over: show what the view held back, and take the live block down."""
        self.view.close()
        self.display.close()

    def _say(self, line: str) -> None:
        Reporter(self.notes).write(line)
