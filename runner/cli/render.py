"""How jobs and outcomes read in a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_NAME, METADATA_PARENT, user_entrypoint
from jobs.secrets import job_mask
from rayjobs_agent.wording import format_duration, local_time, plain_table
from runner.follow.messages import duration_s, job_id_of

if TYPE_CHECKING:
    from rayjobs_agent.causes import Diagnosis
    from runner.follow.follower import Outcome
    from runner.follow.progress import RunProgress


def job_name_of(info: dict[str, Any]) -> str:
    """The name rayjobs gave the job ("" for jobs submitted otherwise)."""
    return (info.get("metadata") or {}).get(METADATA_NAME, "")


def format_time(ms: int | float | None) -> str:
    """Local time of a Ray timestamp (milliseconds); ``-`` for none."""
    return local_time(ms / 1000 if isinstance(ms, (int, float)) else ms)


def status_report(info: dict[str, Any]) -> str:
    """A few aligned lines describing one job (its secrets masked in its entrypoint and message)."""
    mask = job_mask(info)
    rows = [
        ("job", job_id_of(info)),
        ("status", info.get("status", "?")),
        ("name", job_name_of(info)),
        ("entrypoint", mask.mask_text(user_entrypoint(info.get("entrypoint") or ""))),
        ("started", format_time(info.get("start_time"))),
        ("ended", format_time(info.get("end_time"))),
        ("duration", format_duration(duration_s(info))),
        ("message", mask.mask_text((info.get("message") or "").strip())),
        ("error type", info.get("error_type") or ""),
        ("driver exit code", "" if info.get("driver_exit_code") is None else str(info["driver_exit_code"])),
    ]
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows if value not in ("", "-")
                     or label in ("job", "status"))


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    """A plain table of jobs, newest first (a job still waiting in its queue, ``queue`` set, as QUEUED (position))."""
    header = ("ID", "STATUS", "NAME", "STARTED", "DURATION", "ENTRYPOINT")
    rows = [header]
    for info in sorted(jobs, key=lambda job: job.get("start_time") or 0, reverse=True):
        entrypoint = job_mask(info).mask_text(user_entrypoint(info.get("entrypoint") or "")).replace("\n", " ")
        rows.append((
            job_id_of(info),
            f"QUEUED ({info['queue']['position']})" if info.get("queue") else info.get("status") or "?",
            job_name_of(info) or "-",
            format_time(info.get("start_time")),
            format_duration(duration_s(info)),
            entrypoint if len(entrypoint) <= 60 else entrypoint[:57] + "...",
        ))
    return plain_table(rows)


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


def run_summary(job_id: str, exit_code: int, followed: Outcome, summary: str, address: str,
                attempts: list[str], progress: dict[str, Any] | None = None,
                diagnosis: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON document ``rayjobs submit --output json`` prints when it has followed a job to its end."""
    info = followed.info or {}
    # Ray's message of a failed job holds the end of its log.
    message = job_mask(info).mask_text(info["message"]) if info.get("message") else info.get("message")
    return {
        "submission_id": job_id, "status": followed.status, "exit_code": int(exit_code), "summary": summary,
        "error_type": info.get("error_type"), "message": message, "start_time": info.get("start_time"),
        "end_time": info.get("end_time"), "address": address, "attempts": attempts, "progress": progress,
        "diagnosis": diagnosis,
    }


def dry_run_text(submission: dict[str, Any], address: str | None, sweep_plan: dict[str, Any] | None = None) -> str:
    """What ``submit --dry-run`` prints: where it would go, a sweep's trial plan, then the submission as YAML."""
    import yaml

    from jobs.sweep import plan_text

    header = f"# would submit to {address or 'the resolved cluster (see --address)'}\n"
    if sweep_plan is not None:
        header += plan_text(sweep_plan)
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


def progress_report(progress: RunProgress, diagnosis: Diagnosis | None) -> str:
    """The lines ``rayjobs status`` adds for a job that reported progress, the agent's decisions (attempts in
    place, a wait, a stall) and a failure with a known cause."""
    from rayjobs_agent.causes import short_reason
    from rayjobs_agent.wording import format_value
    from runner.follow.progress import pace_parts, position_text, shown_metrics

    rows = []
    if progress.events:
        parts = [f"stage {progress.stage}" + (f" ({progress.stage_index}/{progress.stage_count})"
                                              if progress.stage_index else "")] if progress.stage else []
        if progress.epoch is not None:
            parts.append(position_text(progress))
        parts += [f"{name} {format_value(value)}" for name, value in shown_metrics(progress.metrics)]
        parts += pace_parts(progress, with_eta=progress.training_state in (None, "RUNNING"))
        rows.append(("progress", " · ".join(parts) or "started, nothing reported yet"))
        if progress.attempts:
            restarts = len(progress.restarts)
            text = f"{progress.attempts}, {restarts} restart{'s' if restarts != 1 else ''}"
            if progress.restarts:
                text += f" (last: {short_reason(progress.restarts[-1].reason)})"
            rows.append(("training attempts", text))
            if progress.workers:
                nodes = progress.nodes
                rows.append(("workers", f"{len(progress.workers)} on {nodes} node{'s' if nodes != 1 else ''}"))
    if progress.retries:
        failed = "; ".join(f"attempt {int(retry.get('attempt') or 2) - 1} failed with {retry.get('cause')}"
                           for retry in progress.retries)
        rows.append(("attempts", f"{len(progress.retries) + 1} in this job ({failed}, and it ran again)"))
    if progress.waiting:
        rows.append(("waiting", progress.waiting))
    elif progress.stalled_s is not None:
        rows.append(("stalled", f"nothing of its own for {progress.stalled_s:.0f}s (it is left running)"))
    if diagnosis is not None:
        rows.append(("why", diagnosis.paragraph()))
    width = max((len(label) for label, _ in rows), default=0) + 1
    return "\n".join(f"{label + ':':<{width}} {value}" for label, value in rows)
