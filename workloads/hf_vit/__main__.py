"""Entry point of the hf_vit workload: ``python -m workloads.hf_vit [--params FILE]``."""

from __future__ import annotations

import argparse
import sys

from workloads.params import add_params_argument, connect_to_cluster, read_params


def main(argv: list[str] | None = None) -> int:
    """Parse the parameters, connect to Ray and fine-tune; return the exit status."""
    from workloads.hf_vit.config import HFViTParams

    parser = argparse.ArgumentParser(prog="python -m workloads.hf_vit", description=__doc__.splitlines()[0])
    add_params_argument(parser)
    args = parser.parse_args(argv)
    try:
        params = read_params(HFViTParams, args.params, "hf_vit")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        from workloads.hf_vit.train import HFWorkloadError, run
    except ImportError as exc:
        print(f"error: the hf_vit workload needs the 'hf' extra on the cluster ({exc}); install it with "
              "pip install 'rayjobs[hf]' or add transformers and datasets to runtime_env.pip", file=sys.stderr)
        return 2

    import ray

    connect_to_cluster()
    try:
        run(params)
    except HFWorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
