"""Entry point of the hf_vit workload: ``python -m workloads.hf_vit [--params FILE]``."""

from __future__ import annotations

import sys

from workloads.params import parse_command_line, run_on_cluster


def main(argv: list[str] | None = None) -> int:
    """Parse the parameters, connect to Ray and fine-tune; return the exit status."""
    from workloads.hf_vit.config import HFViTParams

    params = parse_command_line(HFViTParams, "hf_vit", "python -m workloads.hf_vit", __doc__.splitlines()[0], argv)
    try:
        from workloads.hf_vit.train import HFWorkloadError, run
        from workloads.training.trainer import TrainingError
    except ImportError as exc:
        print(f"error: the hf_vit workload needs the 'hf' extra on the cluster ({exc}); install it with "
              "pip install 'rayjobs[hf]' or add transformers and datasets to runtime_env.pip", file=sys.stderr)
        return 2

    from jobs.object_store import ObjectStoreError
    from workloads.storage import check_storage, storage_path

    try:
        check_storage(storage_path(params.storage_path), "storage_path")
    except ObjectStoreError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return run_on_cluster(lambda: run(params), (HFWorkloadError, TrainingError, ObjectStoreError))


if __name__ == "__main__":
    sys.exit(main())
