"""What the session cluster's queue looked like when a test on it failed: the keeper's last lines, its snapshot's
age, the jobs Ray has not ended and the actors that hold the head's resource. Added to the failure's report, so
that a failure seen only in CI can be read from its output."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rayjobs_agent.queueing import SNAPSHOT_FILE

_KEEPER_MARK = ":actor_name:KeeperActor"
_TAIL_LINES = 30


def describe_queue_state(cluster: Any) -> str:
    """A few dozen lines on the state of ``cluster``'s queue; each part says so when it could not be read."""
    parts = []
    logs = Path(cluster.temp_dir) / "session_latest" / "logs"
    parts.append(_snapshot_age(logs))
    parts.append(_keeper_lines(logs))
    parts.append(_unended_jobs(cluster, logs))
    parts.append(_live_actors(cluster))
    return "\n".join(parts)


def _snapshot_age(logs: Path) -> str:
    try:
        snapshot = json.loads((logs / SNAPSHOT_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"keeper's snapshot: unreadable ({type(exc).__name__})"
    return f"keeper's snapshot: written {time.time() - float(snapshot.get('at') or 0):.0f}s ago, " \
           f"queues {json.dumps(snapshot.get('queues'))[:600]}"


def _keeper_lines(logs: Path) -> str:
    found = []
    for path in logs.glob("worker-*.out"):
        try:
            with path.open("rb") as handle:
                head = handle.read(200).decode(errors="replace")  # Ray names the actor in the file's first lines
                if _KEEPER_MARK not in head:
                    continue
                handle.seek(max(0, path.stat().st_size - 8192))
                tail = handle.read().decode(errors="replace")
            found.append((path.stat().st_mtime, f"-- {path.name}\n" + "\n".join(tail.splitlines()[-_TAIL_LINES:])))
        except OSError:
            continue  # a file that went meanwhile
    found.sort()
    return "keepers' output:\n" + ("\n".join(text for _, text in found[-3:]) if found else "(no keeper's output file)")


def _unended_jobs(cluster: Any, logs: Path) -> str:
    from tests.support.cli import direct_api

    try:
        jobs = direct_api(cluster).list_jobs()
    except Exception as exc:  # noqa: BLE001 - a report of what could be read
        return f"Ray's jobs: unreadable ({type(exc).__name__}: {exc})"
    now = time.time()
    lines = []
    for job in jobs:
        if job.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
            continue
        job_id = str(job.get("submission_id"))
        age = now - float(job.get("start_time") or now * 1000) / 1000
        lines.append(f"  {job_id} {job.get('status')} for {age:.0f}s resources={job.get('entrypoint_resources')}")
        try:
            driver_lines = (logs / f"job-driver-{job_id}.log").read_text(errors="replace").splitlines()[-8:]
        except OSError:
            driver_lines = []
        lines.extend("    | " + line for line in driver_lines)
    return "Ray's jobs not ended:\n" + ("\n".join(lines) if lines else "  (none)")


def _live_actors(cluster: Any) -> str:
    from tests.support.cli import direct_api

    try:
        body = direct_api(cluster).get_json("/api/v0/actors?limit=2000&detail=1")
    except Exception as exc:  # noqa: BLE001 - a report of what could be read
        return f"actors: unreadable ({type(exc).__name__}: {exc})"
    actors = ((body.get("data") or {}).get("result") or {}).get("result") or []
    lines = [f"  {actor.get('name') or actor.get('class_name')} {actor.get('state')} "
             f"resources={actor.get('required_resources')}"
             for actor in actors if actor.get("state") != "DEAD"]
    return "actors not dead:\n" + ("\n".join(lines) if lines else "  (none)")
