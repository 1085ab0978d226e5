"""What a followed job's log feeds, wired together: its progress display, the failure reader, and the judge of its
waits and stalls.

Waits and stalls are judged by one rule, the agent's (``rayjobs_agent.watch.JobWatch``), with two drivers. A job
that runs beside the agent (every job rayjobs submits) has them judged there and said in its log (``wait`` and
``stall`` events, with the agent's own line): the follower shows them and decides nothing. A job submitted by other
means has no agent: the follower runs the same judge on the log it streams, and asks the cluster's dashboard what
the agent would ask Ray's GCS.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from rayjobs_agent.causes import FailureReader
from rayjobs_agent.vocabulary import EventKind, kind_of
from rayjobs_agent.waits import demand_in_cluster_status
from rayjobs_agent.watch import WAIT_OVER, JobWatch, StallDecision, WaitDecision
from rayjobs_agent.wire import OWN_LINE_PREFIX, wrapper_command
from runner.follow.display import LiveProgress, PlainProgress, wants_live_view
from runner.follow.log_view import LogView
from runner.follow.progress import RunProgress
from runner.reporter import Reporter, own_line

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi


class FollowedJob:
    """One followed job as the follower sees it: the log view it writes to, and what that feeds (progress, the
    failure reader, the judge of its waits and stalls).

    Args:
        client: the cluster client (for the resources a waiting job could have).
        job_id: the job followed.
        logs_out, notes: where the job's lines and rayjobs' own lines go.
        raw: the log as written (no hiding, no events taken out).
        live: a live status block (None: when both streams are terminals); only with ``stream_logs``.
        stall_after_s: the spec's ``stall_after_s`` (None: from the job's pace), for a job without the agent.
    """

    def __init__(self, client: JobsApi, job_id: str, logs_out: TextIO, notes: TextIO, *, raw: bool,
                 live: bool | None, stream_logs: bool, stall_after_s: float | None = None) -> None:
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
                            on_line=self._line, after_write=self._after_write, on_agent_line=self._say, pipe=not live and not terminal,
                            echoed=(EventKind.STAGE,) if live else (EventKind.STAGE, EventKind.REPORT))
        # The agent's judge, driven here for a job without the agent (the log's lines come from the stream's
        # coroutine, the follower's questions from a thread of its own).
        self.judge = JobWatch(stall_after_s, time.monotonic(), nodes=self._node_resources)
        self._judge_lock = threading.Lock()
        # Why the judge stopped (None: it judges): a line it chokes on ends the judging, never the following.
        self._judge_broken: str | None = None
        self._event_skipped = False  # an event the follower could not read was said once
        # What a job beside the agent waits for, in words, while it does (the agent's ``wait`` event).
        self._agent_wait: str | None = None
        # Whether the job runs beside the agent (known from its first status), and the stalls not yet answered.
        self.beside_agent: bool | None = None
        self._seen_running = False
        self._stalls: list[float] = []
        self._stall_limit_s: float | None = None  # the limit of the last stall judged

    def job_info(self, info: dict[str, Any]) -> None:
        """The job's status, as the follower reads it: whether the agent decides its waits and stalls."""
        if self.beside_agent is None and info.get("entrypoint"):
            self.beside_agent = wrapper_command(str(info["entrypoint"])) is not None
        if info.get("status") == "RUNNING" and not self._seen_running:
            if self.beside_agent is None:
                self.beside_agent = False  # a cluster that names no entrypoint: no agent is known to judge it
            self._seen_running = True
            with self._judge_lock:
                self.judge.started(time.monotonic())
            self._stalls.clear()  # a silence judged before it ran (its turn waited for) is no stall

    def new_stall(self) -> float | None:
        """The silence (seconds) of a stall judged since the last call, or None: said by the agent beside the job,
        or, for a job without it, judged here now (the cluster asked first when the job has been quiet)."""
        if self.beside_agent is False and self._seen_running and self._judge_broken is None:
            # Waits Ray named in the log are said by the stream's own thread, after the lines before them; a quiet
            # job's wait, asked of the cluster, is said here.
            try:
                asked = self._time_to_ask_the_cluster() and self._ask_the_cluster()
            except Exception as exc:  # noqa: BLE001 - the judge is a courtesy: it stops, the following goes on
                self._stop_judging(exc)
                asked = False
            self._judge_now(waits=asked)
        return self._stalls.pop() if self._stalls else None

    def stall_limit_s(self) -> float:
        """Seconds of silence that made the last stall of this job (the spec's, or from its pace)."""
        if self._stall_limit_s is not None:
            return self._stall_limit_s
        with self._judge_lock:
            return self.judge.limit_s()

    def waiting_text(self) -> str | None:
        """``waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster``, while it waits."""
        if self.beside_agent:
            return self._agent_wait
        with self._judge_lock:
            return self.judge.waiting.text if self.judge.waiting is not None else None

    def _line(self, plain: str) -> bool:
        """Take in one line of the log; whether a wait is to be said after it (and the lines before it)."""
        self.failure.line(plain)
        if self.beside_agent or self._judge_broken is not None:
            return False  # the agent judges it, or the judge has stopped
        try:
            with self._judge_lock:
                self.judge.line(plain, time.monotonic())
                return self.beside_agent is False and self._seen_running and self.judge.has_waits_to_say()
        except Exception as exc:  # noqa: BLE001 - a line the judge chokes on must not end the following
            self._stop_judging(exc)
            return False

    def _after_write(self) -> None:
        if self.beside_agent is False and self._seen_running:
            self._judge_now()  # a wait Ray just printed is named at once, after the lines before it

    def _event(self, event: dict[str, Any]) -> None:
        try:
            self._take_event(event)
        except Exception as exc:  # noqa: BLE001 - a job may print any event: one the follower cannot read is skipped
            if not self._event_skipped:
                self._event_skipped = True
                self._say(own_line(f"an event of the job's log could not be read and is skipped "
                                   f"({type(exc).__name__}: {exc}"[:300] + "); later ones like it are skipped too"))

    def _take_event(self, event: dict[str, Any]) -> None:
        kind = kind_of(event)
        if kind in WAIT_OVER:
            self._agent_wait = None
        elif kind == EventKind.WAIT:
            self._agent_wait = str(event.get("text") or "") or None
        elif kind == EventKind.STALL:
            self._stall_said(float(event.get("silent_s") or 0.0), event.get("limit_s"))
        self.display.event(event)

    def _stop_judging(self, exc: Exception) -> None:
        self._judge_broken = f"{type(exc).__name__}: {exc}"[:300]
        self._say(own_line(f"the watch over the job stopped ({self._judge_broken}); waits and stalls are no longer "
                           "named"))

    def _judge_now(self, waits: bool = True) -> None:
        if self._judge_broken is not None:
            return
        try:
            self._say_decisions(waits)
        except Exception as exc:  # noqa: BLE001 - the judge is a courtesy: it stops, the following goes on
            self._stop_judging(exc)

    def _say_decisions(self, waits: bool) -> None:
        while True:
            with self._judge_lock:
                decision = self.judge.decide(time.monotonic(), waits=waits)
            if isinstance(decision, WaitDecision):
                self._say(own_line(f"{decision.text}. {decision.advice}"))
            elif isinstance(decision, StallDecision):
                self._stall_said(decision.silent_s, decision.limit_s)
            else:
                return

    def _stall_said(self, silent_s: float, limit_s: Any) -> None:
        self._stalls = [silent_s]
        if isinstance(limit_s, (int, float)):
            self._stall_limit_s = float(limit_s)

    def _time_to_ask_the_cluster(self) -> bool:
        with self._judge_lock:
            return self.progress.attempts <= len(self.progress.restarts) and \
                self.judge.time_to_ask_the_cluster(time.monotonic())

    def _ask_the_cluster(self) -> bool:
        """Ray Train V2 waits for its worker group without a word: the cluster's pending demand is the wait, read from
        the report `ray status` prints (the agent reads the same from Ray's GCS). Whether it named one."""
        from runner.errors import RayJobsError

        try:
            status = self.client.get_json("/api/cluster_status?format=1")
            report = ((status or {}).get("data") or {}).get("clusterStatus") or ""
        except (RayJobsError, OSError, AttributeError, TypeError):
            return False
        wait = demand_in_cluster_status(report)
        if wait is None:
            return False
        total: dict[str, float] = {}
        for node in self._node_resources():
            for name, amount in node.items():
                total[name] = total.get(name, 0.0) + float(amount)
        with self._judge_lock:
            self.judge.demand_pending(wait.asked, wait.for_what, total)
        return True

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
        Reporter(self.notes).write(line if line.startswith(OWN_LINE_PREFIX) else own_line(line))
