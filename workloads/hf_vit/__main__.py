"""Entry point of the hf_vit workload: ``python -m workloads.hf_vit [--params FILE]``.

Exit status: 0 when the run finished, 1 when it failed (data or weights that cannot be used,
training that failed), 2 for bad input: invalid parameters, the ``hf`` extra missing on the
cluster, or object storage at ``storage_path`` that cannot be used.
"""

from __future__ import annotations

import importlib.util
import sys

from jobs.errors import BadInput
from workloads.entry import on_cluster, workload_main
from workloads.hf_vit.config import HFViTParams
from workloads.hf_vit.train import HFWorkloadError, run
from workloads.params import parse_command_line
from workloads.storage import check_storage, storage_path
from workloads.ray_train.trainer import TrainingError

HF_EXTRA = ("transformers", "datasets", "accelerate")


def require_hf_extra() -> None:
    """Raise :class:`BadInput` naming what to install when a package of the ``hf`` extra is missing."""
    missing = [name for name in HF_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise BadInput(f"the hf_vit workload needs the 'hf' extra on the cluster (No module named {missing[0]!r}); "
                       "install it with pip install 'rayjobs[hf]' or add transformers, datasets and accelerate to "
                       "runtime_env.pip")


def main(argv: list[str] | None = None) -> int:
    """Parse the parameters, connect to Ray and fine-tune; return the exit status."""
    def fine_tune() -> None:
        params = parse_command_line(HFViTParams, "hf_vit", "python -m workloads.hf_vit", __doc__.splitlines()[0],
                                    argv)
        require_hf_extra()
        check_storage(storage_path(params.storage_path), "storage_path")
        on_cluster(lambda: run(params))

    return workload_main(fine_tune, failures=(HFWorkloadError, TrainingError))


if __name__ == "__main__":
    sys.exit(main())
