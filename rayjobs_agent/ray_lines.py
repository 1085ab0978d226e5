"""Which lines of a job's log are Ray's own, not the job's: one rule for the agent and the client.

A job's driver log collects the job's own output and a good deal of Ray's: its C++ and Python loggers,
warnings raised inside Ray's code, Ray Data's progress lines, the lines of Ray's own actors (the
autoscaler, the split coordinator) and its complaints that the job waits for resources. None of them is
a sign of the job's own life: the agent's stall rule ignores them (a deadlocked job whose Ray prints
every second is still stalled), and the follower hides the chatter among them. Each line is recognised
by how it begins after the forwarding prefix, so a job's output that quotes one is only taken for Ray's
when it has the same shape.

Standard library only: it runs in the job's wrapper.
"""

from __future__ import annotations

import re

from .waits import resource_wait_in

# A colour or cursor sequence; Ray colours the prefix of lines it forwards from other processes,
# even into a log file.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Lines of Ray's own machinery that a job's driver log collects and a user did not write. Each is
# recognised by how it begins after the forwarding prefix, so a job's output that quotes one is
# only hidden when it has the same shape.
_RAY_WARNING = r"^\S*/site-packages/ray/\S+\.py:\d+: \w*Warning: "
_RAY_CHATTER = [re.compile(pattern) for pattern in (
    r"^Reporting training result \d+: TrainingReport\(",
    # Ray's C++ core logs: [2026-11-24 12:00:00,123 I 1234 5678] core_worker.cc:123: ... (errors are shown)
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIW] \d+ \d+\] \w+\.(cc|h):\d+:",
    # Ray's Python loggers in the driver: 2026-11-24 12:00:00,123\tINFO worker.py:1234 -- ...
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\t(DEBUG|INFO|WARNING) [\w.]+\.py:\d+ -- ",
    # Ray Data's progress lines when no terminal is attached (logging_progress) and its execution notes.
    r"^(Running Dataset|Running: |- \S.*?: (Tasks|Active|Queued)|Dataset \w+ (execution|dataset_\w+)"
    r"|✔️  Dataset \w+ execution finished|Starting execution of Dataset |\[dataset\]: )",
    r"^\s*(Operator|Dataset throughput|\* (Ray Data throughput|Estimated single task throughput|"
    r"Extra metrics|Remote wall time|Remote cpu time|UDF time|Peak heap memory|Output num rows|"
    r"Output size bytes|Tasks executed|Operator throughput))",
    r"^Wrapping provided model in DistributedDataParallel\.?$",
    r"^Requesting resources: \{",
    r"^- \(ip=[\d.]+, pid=\d+\) world_rank=\d+",
    r"^Checkpoint successfully created at: Checkpoint\(",
    # A warning raised inside Ray's own code (site-packages/ray); the source line under it: see LogView._keep.
    _RAY_WARNING,
    r"^\s+warnings\.warn\($",
    r"^Started training worker group of size \d+:",
    r"^- \(node_id=\w+, ip=[\d.]+, pid=\d+\) world_rank=\d+",
    r"^Setting up process group for: ",
    r"^Moving model to device: ",
    r"^Attempting to start training worker group of size \d+",
    r"^\[State Transition\] ",
    r"^Training finished iteration \d+",
)]
# ``(TrainController pid=4711)``, ``(RayTrainWorker pid=12, ip=10.0.0.2)``, ``(raylet)``, ``(autoscaler +3s)``:
# Ray's prefix on a line it forwarded from another process.
# A worker that runs no named actor yet is ``(pid=4711)``.
FORWARD_PREFIX = re.compile(r"^\((?:[\w.]+(?: pid=\d+)?(?:, ip=[\d.]+)?|pid=\d+(?:, ip=[\d.]+)?|"
                            r"raylet(?:, ip=[\d.]+)?|autoscaler \+[\w.]+)\) ")
# Lines of Ray's that are shown (errors are never chatter) but are no sign of the job's own life.
_RAY_SHOWN = re.compile(r"^(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [EF] \d+ \d+\] \w+\.(cc|h):\d+:|"
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\t(ERROR|CRITICAL) [\w.]+\.py:\d+ -- )")
# Ray's own processes, which run none of the job's code: whatever they print (a traceback included) is Ray's.
_RAY_PROCESSES = re.compile(r"^\((autoscaler \+|raylet[,)]|PlacementGroupCleaner |JobSupervisor |_StatsActor |"
                            r"SplitCoordinator |AutoscalingRequester |DatasetStatsActor )")
RAY_WARNING_LINE = re.compile(_RAY_WARNING)


def is_ray_chatter(line: str) -> bool:
    """Whether a log line (colour already removed) is Ray's machinery talking rather than the job."""
    body = FORWARD_PREFIX.sub("", final_state(line), count=1)
    return any(pattern.search(body) for pattern in _RAY_CHATTER)


def is_rays_own(line: str) -> bool:
    """Whether a log line (colour already removed) comes from Ray rather than the job: chatter, Ray's error
    logs, the autoscaler's messages, resource waits. None of them is a sign of the job's own life."""
    line = final_state(line)
    if _RAY_PROCESSES.match(line) or is_ray_chatter(line):
        return True
    body = FORWARD_PREFIX.sub("", line, count=1)
    return bool(_RAY_SHOWN.search(body)) or resource_wait_in(body) is not None




def final_state(line: str) -> str:
    """What a line redrawn in place (carriage returns, a bar's cursor moves) finally shows, from its start; the
    line itself when it was written once."""
    if "\r" not in line:
        return line
    states = [state.strip() for state in line.split("\r") if state.strip()]
    return states[-1] if states else ""
