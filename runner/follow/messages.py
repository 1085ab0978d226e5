"""The lines a followed job leaves in the terminal: its one-line summary, and how to reach it again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from jobs.secrets import job_mask
from jobs.infra.status import JobStatus
from rayjobs_agent.wording import format_duration
from runner.errors import ExitCode
from rayjobs_agent.causes import killed_by

if TYPE_CHECKING:
    from runner.client.connection import Connection


def job_id_of(info: dict[str, Any]) -> str:
    """A job's submission id, else its Ray job id."""
    return info.get("submission_id") or info.get("job_id") or "?"


def duration_s(info: dict[str, Any]) -> float | None:
    """Seconds from start to end (to now while it runs); None before it started."""
    start = info.get("start_time")
    if not start:
        return None
    end = info.get("end_time") or time.time() * 1000
    return max(0.0, (end - start) / 1000)


def summary_line(job_id: str, outcome_code: ExitCode, info: dict[str, Any] | None, reason: str = "",
                 waiting: str | None = None) -> str:
    """The one line printed when following a job ends.

    ``waiting``: what the job was waiting for when it ended (``waiting for resources: …``), said again when a
    timeout stopped it, since that is most likely why it never got going.
    """
    status = (info or {}).get("status") or "UNKNOWN"
    took = format_duration(duration_s(info)) if info else "-"
    if outcome_code == ExitCode.TIMEOUT:
        return f"job {job_id} {status} after {took}: {reason}" + (f"; it was still {waiting}" if waiting else "")
    if outcome_code == ExitCode.CLUSTER_UNREACHABLE:
        return f"job {job_id} state unknown (last seen {status}): {reason}"
    line = f"job {job_id} {status} in {took}"
    if status in (JobStatus.FAILED, JobStatus.STOPPED) and info:
        # Ray's message may carry the whole log tail after its first line; the log is shown separately.
        message = (info.get("message") or "").strip().splitlines()
        first = job_mask(info).mask_text(message[0].split(", last available logs")[0]) if message else ""
        detail = " ".join(part for part in (info.get("error_type"), first) if part)
        code = info.get("driver_exit_code")
        if code is not None and "exit code" not in detail:
            detail += f" (exit code {code})"
        if status == JobStatus.FAILED and (killed := killed_by(code)):
            detail += f": the entrypoint {killed}"
        if detail:
            line += f": {detail.strip()}"
    return line


def address_hint(connection: Connection) -> str:
    """The flag that reaches the same cluster again in a printed command ("" for the default local cluster)."""
    if connection.source == "local cluster":
        return ""
    if connection.source in ("--cluster", "RAYJOBS_CLUSTER"):
        return f" --cluster {connection.local_cluster}"
    return f" --address {connection.address}"


def where_from(connection: Connection) -> str:
    """Where the address came from, naming the local cluster it reaches when that is not obvious."""
    if connection.local_cluster is None or connection.source == "local cluster":
        return connection.source
    return f"local cluster '{connection.local_cluster}' via {connection.source}"


def follow_up_lines(job_id: str, connection: Connection) -> list[str]:
    """The commands to follow, check or stop a job that keeps running."""
    hint = address_hint(connection)
    return [f"follow it:  rayjobs logs --follow {job_id}{hint}",
            f"its status: rayjobs status {job_id}{hint}",
            f"stop it:    rayjobs stop {job_id}{hint}"]
