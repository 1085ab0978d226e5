"""Ray Train's own account of a job's training runs: runs, attempts and workers with CPU, memory and GPUs.

Ray's dashboard serves it (``/api/train/v2/runs/v1``) when the job's processes have
``RAY_TRAIN_ENABLE_STATE_TRACKING=1``, which rayjobs sets with the progress channel. The events in
the log say what training reported; this says what its processes are doing now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi

TRAIN_RUNS_PATH = "/api/train/v2/runs/v1"


def job_train_runs(client: JobsApi, ray_job_id: str) -> list[dict[str, Any]]:
    """The Ray Train runs of one job (by Ray's job id, not the submission id), each with its last attempt's workers.

    Raises ``RayJobsError`` (from the client) when the dashboard has no such API or no state to give.
    """
    answer = client.get_json(TRAIN_RUNS_PATH)
    runs = []
    for run in answer.get("train_runs") or []:
        if run.get("job_id") != ray_job_id:
            continue
        attempts = run.get("attempts") or []
        last = attempts[-1] if attempts else {}
        runs.append({
            "name": run.get("name"), "status": run.get("status"), "status_detail": run.get("status_detail"),
            "attempts": len(attempts), "attempt_status": last.get("status"),
            "workers": sorted((worker_summary(worker) for worker in last.get("workers") or []),
                              key=lambda worker: (worker["rank"] is None, worker["rank"])),
        })
    return runs


def worker_summary(worker: dict[str, Any]) -> dict[str, Any]:
    """One training worker under rayjobs' stable keys: where it runs, its state, and what it uses."""
    stats = worker.get("processStats") or {}
    gpus = []
    for gpu in worker.get("gpus") or []:
        process = gpu.get("processInfo") or {}
        gpus.append({"index": gpu.get("index"), "name": gpu.get("name"), "utilization_percent": gpu.get("utilizationGpu"),
                     "memory_used_bytes": process.get("gpuMemoryUsage", gpu.get("memoryUsed")),
                     "memory_total_bytes": gpu.get("memoryTotal")})
    return {"rank": worker.get("world_rank"), "node_id": worker.get("node_id"), "node_ip": worker.get("node_ip"),
            "pid": worker.get("pid"), "state": worker.get("status"), "cpu_percent": stats.get("cpuPercent"),
            "memory_rss_bytes": (stats.get("memoryInfo") or {}).get("rss"), "gpus": gpus}


def train_runs_text(runs: list[dict[str, Any]]) -> str:
    """The ``training runs:`` lines of ``rayjobs status``."""
    lines = ["training runs:"]
    for run in runs:
        detail = f" ({run['status_detail']})" if run.get("status_detail") else ""
        lines.append(f"  {run['name']}: {run['status']}{detail}, attempt {run['attempts']} "
                     f"{str(run.get('attempt_status') or '-').lower()}")
        for worker in run["workers"]:
            parts = [f"rank {worker['rank']}", f"node {worker['node_ip']} ({str(worker['node_id'])[:8]})",
                     f"pid {worker['pid']}", str(worker["state"] or "-")]
            if worker["cpu_percent"] is not None:
                parts.append(f"CPU {worker['cpu_percent']:.0f}%")
            if worker["memory_rss_bytes"] is not None:
                parts.append(f"memory {worker['memory_rss_bytes'] / 2**20:.0f} MiB")
            for gpu in worker["gpus"]:
                used = gpu["memory_used_bytes"]
                parts.append(f"GPU {gpu['index']} {gpu['utilization_percent'] or 0:.0f}%" +
                             (f" {used / 2**20:.0f} MiB" if used is not None else ""))
            lines.append("    " + " · ".join(parts))
    return "\n".join(lines)
