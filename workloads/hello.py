"""A small real Ray job: fans tasks out over the cluster and checks their results.

Run by ``specs/hello.yaml``. Its parameters come from the spec's ``workload`` section.
Exit status: 0 when every result is right, 1 when one is wrong or ``fail`` is set, 2 for
invalid parameters (see :mod:`workloads.entry`).
"""

from __future__ import annotations

import sys
import time

from pydantic import BaseModel, ConfigDict, Field

from jobs.workload_contract import WorkloadNeeds


class HelloParams(BaseModel):
    """Parameters of the hello workload."""

    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(8, ge=1, le=10_000, description="How many Ray tasks to run.")
    work_ms: int = Field(50, ge=0, le=600_000, description="Milliseconds each task works.")
    fail: bool = Field(False, description="Raise at the end (to try failure handling).")

    def needs(self) -> WorkloadNeeds:
        """The program the job runs; no shared storage, and no phase that asks for a number of workers (its
        tasks queue for whatever CPUs the cluster has)."""
        return WorkloadNeeds(entrypoint_module="workloads.hello")


class HelloFailed(RuntimeError):
    """The tasks returned a wrong result, or the parameters asked for a failure."""


def main(argv: list[str] | None = None) -> int:
    """Run the tasks, check their results, and return the exit status."""
    from workloads.entry import on_cluster, workload_main
    from workloads.params import parse_command_line

    def hello() -> None:
        params = parse_command_line(HelloParams, "hello", "python -m workloads.hello", __doc__.splitlines()[0], argv)
        on_cluster(lambda: run(params))

    return workload_main(hello, failures=(HelloFailed,))


def run(params: HelloParams) -> None:
    """Fan the tasks out over the connected cluster and check their sum; raise :class:`HelloFailed` when it is
    wrong or when the parameters ask for a failure."""
    import ray

    @ray.remote(num_cpus=0.5)
    def square(x: int) -> tuple[int, str]:
        time.sleep(params.work_ms / 1000)
        # The Ray node, not the host name: the nodes of a local multi-node cluster share one host.
        return x * x, ray.get_runtime_context().get_node_id()

    print(f"hello: running {params.tasks} tasks on {ray.cluster_resources().get('CPU', 0):g} CPUs", flush=True)
    started = time.perf_counter()
    results = ray.get([square.remote(i) for i in range(params.tasks)])
    total = sum(value for value, _ in results)
    expected = sum(i * i for i in range(params.tasks))
    print(f"hello: sum of squares = {total} (expected {expected}) in {time.perf_counter() - started:.2f}s "
          f"on {len({host for _, host in results})} node(s)", flush=True)
    if params.fail:
        raise HelloFailed("hello: failing on purpose (workload.fail is true)")
    if total != expected:
        raise HelloFailed(f"hello: the sum of squares is {total}, not {expected}")


if __name__ == "__main__":
    sys.exit(main())
