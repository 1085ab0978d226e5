"""Compare the runs a pipeline's job ran after, by one metric of their records, and name the best.

The last job of a pipeline that trains several settings: ``python -m workloads.compare_runs --metric val_accuracy
--mode max``. It reads where each job it ran after kept its run (``RAYJOBS_AFTER``, set by the pipeline), each run's
``run.json`` (local or ``s3://``), prints the runs ranked and the best one's folder, and exits 2 when none of them has
the metric.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rayjobs_agent.record_layout import RUN_FILE
from rayjobs_agent.storage_location import StorageLocation
from rayjobs_agent.wire import AFTER_ENV_VAR


def ranked(folders: dict[str, str], metric: str, mode: str) -> list[tuple[str, float, str]]:
    """``(name, value, folder)`` of each run that recorded ``metric``, best first."""
    found = []
    for name, folder in folders.items():
        raw = StorageLocation(folder).read(RUN_FILE)
        value = (json.loads(raw).get("metrics") or {}).get(metric) if raw else None
        if isinstance(value, (int, float)):
            found.append((name, float(value), folder))
    return sorted(found, key=lambda run: run[1], reverse=mode == "max")


def main(argv: list[str] | None = None) -> int:
    """Rank the runs this job ran after; the exit status (2: no run recorded the metric)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metric", default="val_accuracy", help="The metric of run.json's `metrics` to rank by.")
    parser.add_argument("--mode", choices=("max", "min"), default="max", help="Whether more is better.")
    args = parser.parse_args(argv)
    folders = json.loads(os.environ.get(AFTER_ENV_VAR) or "{}")
    runs = ranked(folders, args.metric, args.mode)
    if not runs:
        print(f"none of the runs this job ran after ({', '.join(folders) or 'none'}) recorded {args.metric}",
              file=sys.stderr)
        return 2
    width = max(len(name) for name, _, _ in runs)
    for name, value, folder in runs:
        print(f"{name:<{width}}  {args.metric} {value:.4f}  {folder}")
    best = runs[0]
    print(f"best: {best[0]} ({args.metric} {best[1]:.4f}) at {best[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
