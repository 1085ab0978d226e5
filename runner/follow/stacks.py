"""The Python stacks of a running job's driver and training workers, as py-spy sees them.

Ray's dashboard runs py-spy on the node of a process it is asked about (``/worker/traceback``);
py-spy comes with ``ray[default]``. The driver is found in Ray's job record; the training workers
in the job's last ``attempt`` event (rank, node, pid), so any Ray Train script that ships the
progress channel has its workers found without asking Ray Train.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.address import is_loopback_host
from runner.errors import ProfilingDisabled, RayJobsError

_PY_SPY_TIMEOUT_S = 30

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi
    from runner.follow.progress import RunProgress


@dataclass
class ProcessStack:
    """One process's stack, or why it could not be read."""

    label: str
    text: str
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"process": self.label, "stack": self.text, "error": self.error}

    def render(self) -> str:
        body = self.text.rstrip() if self.error is None else f"(could not read it: {self.error})"
        return f"--- {self.label} ---\n{body}"


def job_stacks(api: JobsApi, info: dict[str, Any], progress: RunProgress) -> list[ProcessStack]:
    """The stacks of the job's driver and of every training worker of its last attempt."""
    targets: list[tuple[str, dict[str, str]]] = []
    driver = info.get("driver_info") or {}
    if driver.get("pid") and (driver.get("node_ip_address") or info.get("driver_node_id")):
        where = ({"node_id": info["driver_node_id"]} if info.get("driver_node_id")
                 else {"ip": driver["node_ip_address"]})
        targets.append((f"driver (pid {driver['pid']})", {"pid": str(driver["pid"]), **where}))
    for worker in progress.workers:
        if worker.get("pid") and worker.get("node_id"):
            targets.append((f"rank {worker.get('rank')} (pid {worker['pid']} on node {str(worker['node_id'])[:8]})",
                            {"pid": str(worker["pid"]), "node_id": str(worker["node_id"])}))
    stacks = []
    for label, where in targets:
        try:
            stacks.append(ProcessStack(label, api.process_traceback(**where)))
        except ProfilingDisabled as exc:
            # A cluster on this machine: its processes are this machine's, and py-spy (from ray[default])
            # can read them without the dashboard.
            local = _local_py_spy(where["pid"]) if _on_this_machine(api) else None
            stacks.append(ProcessStack(label, local) if local is not None else ProcessStack(label, "", str(exc)))
        except RayJobsError as exc:
            stacks.append(ProcessStack(label, "", str(exc)))
    return stacks


def _on_this_machine(api: JobsApi) -> bool:
    from urllib.parse import urlsplit

    return is_loopback_host(urlsplit(api.connection.address).hostname or "")


def _local_py_spy(pid: str) -> str | None:
    found = Path(sys.executable).with_name("py-spy")
    py_spy = str(found) if found.exists() else shutil.which("py-spy")
    if py_spy is None:
        return None
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=_PY_SPY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
