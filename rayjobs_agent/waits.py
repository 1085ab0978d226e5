"""A job that waits for resources, named in rayjobs' words from the lines Ray prints while it waits.

Ray says so in two ways, both repeated for as long as the wait lasts: Ray Tune and Ray Train V1
log ``Training has not started in the last 60 seconds … You asked for 3.0 CPUs and 0 GPUs, but the
cluster only has 2.0 CPUs and 0 GPUs available`` every minute; the autoscaler (on every cluster,
even one that cannot grow) forwards ``(autoscaler +3s) Error: No available node types can fulfill
resource request {'CPU': 3.0}`` every 30 seconds or so. Neither is progress, and neither is an error
of the job's own: the follower names the wait once, with the numbers, and counts none of them as
a sign of life. Ray Data says once that its tasks cannot get resources at all (``Cluster resources are
not enough to run any task from …``), typically because a Ray Train worker group holds every CPU.

Standard library only: the agent beside the job names waits (``watch.py``); the client words them alike.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

# Ray Tune / Ray Train V1 (ray/tune/execution/insufficient_resources_manager.py).
_TUNE_WAIT = re.compile(r"(Training has not started|No trial is running and no new trial has been started) "
                        r"(?:with)?in the last (\d+) seconds")
_TUNE_ASKED = re.compile(r"You asked for ([\d.]+) CPUs and ([\d.]+) GPUs( per trial)?, but the cluster only has "
                         r"([\d.]+) CPUs and ([\d.]+) GPUs available")
# The autoscaler, v1 (``Error: … resource request {…}``) and v2 (``… resource requests {…}*2``, and
# ``… placement group requests (detail=…): {…}*2, {…}*1``).
_AUTOSCALER = re.compile(r"No available node types can fulfill (resource requests?|placement group requests"
                         r"(?: \(detail=[^)]*\))?:?) (\{[^}]*\}(?:\*\d+)?(?:, \{[^}]*\}(?:\*\d+)?)*)")
_BUNDLE = re.compile(r"(\{[^}]*\})(?:\s*\*\s*(\d+))?")
# ``ray status`` (the dashboard's /api/cluster_status), under "Pending Demands:":
# `` {'CPU': 3.0}: 1+ pending tasks/actors`` and `` {'CPU': 1.0} * 3 (PACK): 1+ pending placement groups``.
_DEMAND = re.compile(r"^\s+(?P<shape>\{.*?\}(?: \* \d+)?(?:, \{.*?\} \* \d+)*)(?: \(\w+\))?: \d+\+ pending "
                     r"(?P<kind>tasks/actors|placement groups)")
# Ray Data's resource manager, once per execution, after RAY_DATA_STARVATION_WARNING_DELAY_S (60 s) without resources.
_DATA_STARVED = re.compile(r"Cluster resources are not enough to run any task from (?:\w+\[)?(?P<op>.+?)\]?\. "
                           r"The job may hang forever")
# Ray's own names of the resources a person counts; any other (custom, memory) keeps Ray's name.
_UNITS = {"CPU": ("CPU", "CPUs"), "GPU": ("GPU", "GPUs"), "TPU": ("TPU", "TPUs")}


@dataclass(frozen=True)
class ResourceWait:
    """What a waiting job asks for, for what, and what the cluster has (when Ray said so)."""

    asked: dict[str, float]
    for_what: str
    cluster: dict[str, float] | None = None
    # How the cluster was measured: "on the cluster" (its total) or "on its largest node".
    where: str = "on the cluster"
    source: str = field(default="", compare=False)  # Ray's own line, as evidence

    def text(self) -> str:
        """``waiting for resources: 3 CPUs for the trainer and workers, 2 on the cluster``."""
        wanted = amounts(self.asked)
        line = f"waiting for resources: {wanted or 'more than the cluster has'} for {self.for_what}"
        if self.cluster is not None:
            asked_names = [name for name, amount in self.asked.items() if amount] or list(self.cluster)
            if asked_names == ["CPU"]:
                line += f", {_number(self.cluster.get('CPU', 0.0))} {self.where}"
            else:
                have = amounts({name: self.cluster.get(name, 0.0) for name in asked_names}, keep_zero=True)
                line += f", {have} {self.where}"
        return line

    def with_nodes(self, nodes: list[dict[str, float]]) -> ResourceWait:
        """The same wait, with what the cluster has, from each alive node's total resources.

        A single task or actor must fit one node, so it is set against the largest node; a group
        of workers against the whole cluster.
        """
        if self.cluster is not None or not nodes:
            return self
        if self.for_what == "one task or actor":
            largest = max(nodes, key=lambda node: tuple(node.get(name, 0.0) for name in self.asked))
            return ResourceWait(self.asked, self.for_what, dict(largest), "on its largest node", self.source)
        total: dict[str, float] = {}
        for node in nodes:
            for name, amount in node.items():
                total[name] = total.get(name, 0.0) + float(amount)
        return ResourceWait(self.asked, self.for_what, total, "on the cluster", self.source)


def resource_wait_in(line: str) -> ResourceWait | None:
    """The wait a line of Ray's names, or None for any other line (colour already removed)."""
    if "No available node types can fulfill" in line:
        return _autoscaler_wait(line)
    if "in the last" not in line:
        return None
    waiting = _TUNE_WAIT.search(line)
    if waiting is None:
        return None
    trial = waiting[1].startswith("No trial")
    asked = _TUNE_ASKED.search(line)
    for_what = "each trial" if trial else "the trainer and workers"
    if asked is None:
        return ResourceWait({}, for_what, source=line.strip())
    return ResourceWait({"CPU": float(asked[1]), "GPU": float(asked[2])}, for_what,
                        {"CPU": float(asked[4]), "GPU": float(asked[5])}, source=line.strip())


def data_starved_in(line: str) -> str | None:
    """The Ray Data operator whose tasks a line says can get no resources (``ReadRange->MapBatches(f)``), or None."""
    if "not enough to run any task" not in line:
        return None
    match = _DATA_STARVED.search(line)
    return match["op"] if match else None


def demand_in_cluster_status(cluster_status: str) -> ResourceWait | None:
    """The first of the cluster's pending demands in its autoscaler's status report, or None when it has none.

    This is how a job that waits says so where Ray prints nothing while it waits (Ray Train V2's worker group).
    """
    _, found, report = cluster_status.partition("Pending Demands:")
    for line in report.splitlines()[1:] if found else []:
        if not line.startswith(" "):
            break
        demand = _DEMAND.match(line)
        if demand is not None:
            asked = _summed(demand["shape"])
            group = demand["kind"] == "placement groups"
            if asked:
                return ResourceWait(asked, "a placement group" if group else "one task or actor", source=line.strip())
    return None


def _summed(shape: str) -> dict[str, float] | None:
    asked: dict[str, float] = {}
    for bundle, count in _BUNDLE.findall(shape):
        try:
            resources = ast.literal_eval(bundle)
        except (ValueError, SyntaxError):
            return None
        if not isinstance(resources, dict):
            return None
        for name, amount in resources.items():
            if isinstance(amount, (int, float)):
                asked[str(name)] = asked.get(str(name), 0.0) + float(amount) * int(count or 1)
    return asked


def _autoscaler_wait(line: str) -> ResourceWait | None:
    match = _AUTOSCALER.search(line)
    if match is None:
        return None
    asked = _summed(match[2])
    if asked is None:
        return None
    group = match[1].startswith("placement group")
    single = not group and match[2].count("{") == 1 and match[2].endswith(("}", "*1"))
    for_what = "a placement group" if group else "one task or actor" if single else "its tasks and actors"
    return ResourceWait(asked, for_what, source=line.strip())


def amounts(resources: dict[str, Any], keep_zero: bool = False) -> str:
    """``3 CPUs``, ``2 CPUs and 1 GPU``, ``4 CPUs, 1 GPU and memory 2e+09``: CPUs and GPUs first."""
    order = sorted(resources, key=lambda name: (name not in _UNITS, list(_UNITS).index(name) if name in _UNITS else 0))
    parts = []
    for name in order:
        amount = float(resources[name])
        if not amount and not keep_zero:
            continue
        if name in _UNITS:
            one, many = _UNITS[name]
            parts.append(f"{_number(amount)} {one if amount == 1 else many}")
        else:
            parts.append(f"{name} {_number(amount)}")
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    return parts[0] if parts else ""


def _number(amount: float) -> str:
    return f"{amount:g}"
