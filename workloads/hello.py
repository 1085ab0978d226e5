"""A small real Ray job: fans tasks out over the cluster and checks their results.

Run by ``specs/hello.yaml``. Its parameters come from the spec's ``workload`` section.
"""

from __future__ import annotations

import argparse
import sys
import time

from pydantic import BaseModel, ConfigDict, Field


class HelloParams(BaseModel):
    """Parameters of the hello workload."""

    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(8, ge=1, le=10_000, description="How many Ray tasks to run.")
    work_ms: int = Field(50, ge=0, le=600_000, description="Milliseconds each task works.")
    fail: bool = Field(False, description="Raise at the end (to try failure handling).")


def main(argv: list[str] | None = None) -> int:
    """Run the tasks, check their results, and return the exit status (0 when all are right)."""
    import ray

    from workloads.params import add_params_argument, load_params

    parser = argparse.ArgumentParser(description=__doc__)
    add_params_argument(parser)
    params = load_params(HelloParams, parser.parse_args(argv).params)

    @ray.remote(num_cpus=0.5)
    def square(x: int) -> tuple[int, str]:
        time.sleep(params.work_ms / 1000)
        # The Ray node, not the host name: the nodes of a local multi-node cluster share one host.
        return x * x, ray.get_runtime_context().get_node_id()

    ray.init()
    print(f"hello: running {params.tasks} tasks on {ray.cluster_resources().get('CPU', 0):g} CPUs", flush=True)
    started = time.perf_counter()
    results = ray.get([square.remote(i) for i in range(params.tasks)])
    total = sum(value for value, _ in results)
    expected = sum(i * i for i in range(params.tasks))
    print(f"hello: sum of squares = {total} (expected {expected}) in {time.perf_counter() - started:.2f}s "
          f"on {len({host for _, host in results})} node(s)", flush=True)
    if params.fail:
        raise RuntimeError("hello: failing on purpose (workload.fail is true)")
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
