"""How jobs and outcomes read in a terminal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from jobs.keys import METADATA_ATTEMPT, METADATA_NAME, METADATA_PARENT
from jobs.status import JobStatus
from runner.exit_codes import ExitCode

if TYPE_CHECKING:
    from runner.connection import Connection
    from runner.follow import Outcome


def job_id_of(info: dict[str, Any]) -> str:
    """A job's submission id, else its Ray job id."""
    return info.get("submission_id") or info.get("job_id") or "?"


def job_name_of(info: dict[str, Any]) -> str:
    """The name rayjobs gave the job ("" for jobs submitted otherwise)."""
    return (info.get("metadata") or {}).get(METADATA_NAME, "")


def duration_s(info: dict[str, Any]) -> float | None:
    """Seconds from start to end (to now while it runs); None before it started."""
    start = info.get("start_time")
    if not start:
        return None
    end = info.get("end_time") or time.time() * 1000
    return max(0.0, (end - start) / 1000)


def format_duration(seconds: float | None) -> str:
    """``12.3s``, ``4m05s`` or ``1h02m03s``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_time(ms: int | float | None) -> str:
    """Local time of a Ray timestamp (milliseconds); ``-`` for none."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def summary_line(job_id: str, outcome_code: ExitCode, info: dict[str, Any] | None, reason: str = "") -> str:
    """The one line printed when following a job ends."""
    status = (info or {}).get("status") or "UNKNOWN"
    took = format_duration(duration_s(info)) if info else "-"
    if outcome_code == ExitCode.TIMEOUT:
        return f"job {job_id} {status} after {took}: {reason}"
    if outcome_code == ExitCode.CLUSTER_UNREACHABLE:
        return f"job {job_id} state unknown (last seen {status}): {reason}"
    line = f"job {job_id} {status} in {took}"
    if status in (JobStatus.FAILED, JobStatus.STOPPED) and info:
        # Ray's message may carry the whole log tail after its first line; the log is shown separately.
        message = (info.get("message") or "").strip().splitlines()
        first = message[0].split(", last available logs")[0] if message else ""
        detail = " ".join(part for part in (info.get("error_type"), first) if part)
        if info.get("driver_exit_code") is not None and "exit code" not in detail:
            detail += f" (exit code {info['driver_exit_code']})"
        if detail:
            line += f": {detail.strip()}"
    return line


def status_report(info: dict[str, Any]) -> str:
    """A few aligned lines describing one job."""
    rows = [
        ("job", job_id_of(info)),
        ("status", info.get("status", "?")),
        ("name", job_name_of(info)),
        ("entrypoint", info.get("entrypoint") or ""),
        ("started", format_time(info.get("start_time"))),
        ("ended", format_time(info.get("end_time"))),
        ("duration", format_duration(duration_s(info))),
        ("message", (info.get("message") or "").strip()),
        ("error type", info.get("error_type") or ""),
        ("driver exit code", "" if info.get("driver_exit_code") is None else str(info["driver_exit_code"])),
    ]
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows if value not in ("", "-")
                     or label in ("job", "status"))


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    """A plain table of jobs, newest first."""
    header = ("ID", "STATUS", "NAME", "STARTED", "DURATION", "ENTRYPOINT")
    rows = [header]
    for info in sorted(jobs, key=lambda job: job.get("start_time") or 0, reverse=True):
        entrypoint = (info.get("entrypoint") or "").replace("\n", " ")
        rows.append((
            job_id_of(info),
            info.get("status") or "?",
            job_name_of(info) or "-",
            format_time(info.get("start_time")),
            format_duration(duration_s(info)),
            entrypoint if len(entrypoint) <= 60 else entrypoint[:57] + "...",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1] for row in rows
    )


def attempts_report(info: dict[str, Any], jobs: list[dict[str, Any]]) -> str:
    """All attempts of a retried job (linked through metadata rayjobs.parent), oldest first."""
    metadata = info.get("metadata") or {}
    root = metadata.get(METADATA_PARENT) or job_id_of(info)
    attempts = [job for job in jobs if job_id_of(job) == root
                or (job.get("metadata") or {}).get(METADATA_PARENT) == root]
    attempts.sort(key=lambda job: int((job.get("metadata") or {}).get(METADATA_ATTEMPT, "1")))
    lines = ["attempts:"]
    for job in attempts:
        number = (job.get("metadata") or {}).get(METADATA_ATTEMPT, "1")
        error = f" {job['error_type']}" if job.get("error_type") else ""
        lines.append(f"  {number}. {job_id_of(job)}  {job.get('status')}{error}")
    return "\n".join(lines)


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


def run_summary(job_id: str, exit_code: int, followed: Outcome, summary: str, address: str,
                attempts: list[str]) -> dict[str, Any]:
    """The one JSON document ``rayjobs submit --output json`` prints when it has followed a job to its end."""
    info = followed.info or {}
    return {
        "submission_id": job_id, "status": followed.status, "exit_code": int(exit_code), "summary": summary,
        "error_type": info.get("error_type"), "message": info.get("message"), "start_time": info.get("start_time"),
        "end_time": info.get("end_time"), "address": address, "attempts": attempts,
    }


def dry_run_text(submission: dict[str, Any], address: str | None) -> str:
    """What ``submit --dry-run`` prints: where it would go, then the submission as YAML."""
    import yaml

    header = f"# would submit to {address or 'the resolved cluster (see --address)'}\n"
    return header + yaml.safe_dump(submission, sort_keys=False, default_flow_style=False, width=100)


def nodes_text(nodes: list[Any] | None, error: str | None) -> str:
    """The ``nodes:`` section of ``cluster status``: one row per node the cluster's GCS knows."""
    if nodes is None:
        return f"nodes:     unknown ({error})"
    alive = sum(node.alive for node in nodes)
    rows = [("ROLE", "NODE ID", "CPUS", "ALIVE")]
    rows += [(node.role, node.node_id, "-" if node.cpus is None else f"{node.cpus:g}", "yes" if node.alive else
              f"no ({node.state})") for node in nodes]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [f"nodes:     {len(nodes)} ({alive} alive)"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]
    return "\n".join(lines)
