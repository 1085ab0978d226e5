"""How a training run's workers fit a cluster's nodes: the one rule the pre-flight and the workload share.

Ray Train places each worker whole on one node (a bundle of its placement group) and gives every worker
the same reservation, so a layout fits when each node holds a whole number of workers and the nodes
together hold them all, not merely when the cluster's sums are large enough: three workers of 2 CPUs
never fit two nodes of 3 CPUs, though the cluster has 6.

An ``auto`` CPU count is resolved on the cluster when training starts (``workloads/ray_train/config.py``),
from the CPUs free then; before that, on the client, only the least it takes is known: one whole CPU a
worker. Like the rest of ``jobs``, this imports nothing of Ray.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence

# The least an auto layout gives a worker: one whole CPU (its torch threads, and Ray's reservation).
AUTO_LEAST_CPUS = 1


def workers_that_fit(per_worker: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> int:
    """How many workers, each reserving ``per_worker`` (Ray's resource names) whole on one node, ``nodes`` hold at
    once (each node's resources: its totals, or what it has free)."""
    asked = {name: amount for name, amount in per_worker.items() if amount > 0}
    if not asked:
        return sys.maxsize  # a worker that reserves nothing fits anywhere
    # The small tolerance keeps 3 × 0.1 CPU on a node of 0.3 from reading as two.
    return sum(min(math.floor(node.get(name, 0) / amount + 1e-9) for name, amount in asked.items())
               for node in nodes)


def auto_cpus_per_worker(workers: int, free_cpus: Sequence[float]) -> int:
    """The whole CPUs an ``auto`` layout gives each of ``workers`` workers on nodes with ``free_cpus`` free: the most
    that still places them all (:func:`workers_that_fit`), and never less than :data:`AUTO_LEAST_CPUS`, even where
    not that many fit (the run then waits for resources, as Ray makes it)."""
    nodes = [{"CPU": float(free)} for free in free_cpus]
    for cpus in range(int(max(free_cpus, default=0)), AUTO_LEAST_CPUS, -1):
        if workers_that_fit({"CPU": float(cpus)}, nodes) >= workers:
            return cpus
    return AUTO_LEAST_CPUS
