"""The preprocess stage alone: ``python -m workloads.vision.preprocess [--params FILE]``.

Exit status: 0 when the dataset is written (or reused), 2 for bad input (see :mod:`workloads.vision.errors`).
"""

from __future__ import annotations

import sys

from workloads.entry import workload_main
from workloads.params import parse_command_line
from workloads.storage import check_storage, storage_path
from workloads.vision.config import VisionParams
from workloads.vision.errors import DataSourceError


def main(argv: list[str] | None = None) -> int:
    """Preprocess the images of the parameters' ``data`` section; return the exit status."""
    def preprocess() -> None:
        params = parse_command_line(VisionParams, "vision", "python -m workloads.vision.preprocess",
                                    "Preprocess images into the Parquet dataset of a vision spec.", argv)
        check_storage(storage_path(params.data.output_dir), "data.output_dir")
        # The stage loads Ray and pyarrow: only once the parameters and the storage are known to be usable.
        from workloads.vision.preprocess.stage import run_preprocess

        # run_preprocess starts Ray only when there is work: bad input fails fast and a
        # reused dataset needs no cluster. Under rayjobs, ray.init() joins the job's cluster.
        run_preprocess(params.data)

    return workload_main(preprocess, bad_input=(DataSourceError,))


if __name__ == "__main__":
    sys.exit(main())
