"""ASHA against no scheduler: the same sweep's trials on real photos, with and without early stopping.

On the 64 px Food-101 development set (kept outside the project), one after the other on a private
local Ray instance (2 CPUs, one trial at a time), ``specs/food101.yaml`` with a random sweep of
``--trials`` trials over a wide learning-rate range (so that some trials are poor) and the weight
decay, ``--epochs`` epochs each. Both sides draw the same trials (the same sweep seed); one runs them
all to the end, the other under ASHA (``grace_period`` 2, ``reduction_factor`` 3), which stops a trial
that is behind the others at a rung. Reported: wall time of the sweep, epochs trained, the best trial's
accuracy on the held-out share that chose it and on the test split (the infer stage). Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/sweep_asha.py \\
        --data ../shared/data/food101-64px-dev
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, start_private_ray  # noqa: E402
from benchmarks.learning_quality import add_data_option, food101_subset, spec_overrides  # noqa: E402
from benchmarks.sweep_real_photos import run_side  # noqa: E402

LR_RANGE = [1.0e-4, 3.0e-2]  # wide on purpose: the ends of it learn little, which is what ASHA is for
SCHEDULERS = {"no scheduler": "none", "ASHA": {"asha": {"grace_period": 2, "reduction_factor": 3}}}


def sweep_block(trials: int, seed: int, scheduler: object) -> dict:
    """The sweep both sides run; only the scheduler differs."""
    return {"metric": "val_accuracy", "mode": "max", "search": "random", "samples": trials, "seed": seed,
            "scheduler": scheduler, "max_concurrent": 1,
            "refit": False,  # the trials are what ASHA changes; a refit would add the same run to both sides
            "parameters": {"workload.train.lr": {"loguniform": LR_RANGE},
                           "workload.train.weight_decay": {"choice": [0.0, 0.05]}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_option(parser)
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "specs/food101.yaml")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the sweep's draws")
    add_json_option(parser)
    args = parser.parse_args()
    stamp = Stamp.begin()

    data_root = food101_subset(args.data)
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-sweep-asha-"))
    import ray

    outcomes = {}
    try:
        start_private_ray(2, log_to_driver=True, dashboard=True)
        base = [*spec_overrides(data_root, args.epochs, args.image_size, 2, scratch),
                "workload.stages=[preprocess, train, infer]", "workload.infer.num_actors=1"]
        # The dataset first, so that neither side's wall time includes writing it.
        run_side(args.spec, [*base, "workload.run_name=dataset", "workload.stages=[preprocess]"], None)
        for index, (label, scheduler) in enumerate(SCHEDULERS.items()):
            print(f"{label}: {args.trials} trials", flush=True)
            outcomes[label] = run_side(args.spec, [*base, f"workload.run_name=side-{index}"],
                                       sweep_block(args.trials, args.seed, scheduler))
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)

    result = Result("sweep_asha", "ASHA against no scheduler, the same trials",
                    ["scheduler", "wall time", "epochs trained", "trials stopped early", "best trial",
                     "its held-out accuracy", "its test accuracy"], [], stamp)
    walls = {}
    for label, (produced, seconds) in outcomes.items():
        sweep = produced["sweep"]
        walls[label] = seconds
        epochs = sum(trial.epochs for trial in sweep.trials)
        stopped = sum(trial.status == "STOPPED_EARLY" for trial in sweep.trials)
        result.rows.append([label, f"{seconds:.0f} s", f"{epochs} of {args.trials * args.epochs}", str(stopped),
                            f"{sweep.best.name} (lr {sweep.best.values['workload.train.lr']:.2g})",
                            f"{sweep.best.best:.3f}", f"{produced['infer']['accuracy']:.3f}"])
        result.figure(f"{'asha' if label == 'ASHA' else 'none'}_test_accuracy",
                      Spread.of([produced["infer"]["accuracy"]]), "accuracy")
        print(f"{label}: {seconds:.0f} s, {epochs} epochs, {stopped} stopped early, best {sweep.best.name} "
              f"held-out {sweep.best.best:.3f}, test {produced['infer']['accuracy']:.3f}")
    ratio = walls["ASHA"] / walls["no scheduler"]
    result.figure("wall_ratio", Spread.of([ratio]), "x")
    result.notes.append(f"ASHA's wall time: {ratio:.2f}× the sweep without a scheduler. {args.spec.name} at "
                        f"{args.image_size} px, {args.trials} trials of {args.epochs} epochs, one at a time, 2 workers × "
                        f"1 CPU; lr loguniform {LR_RANGE}, weight decay 0 or 0.05, sweep seed {args.seed}. Each side's "
                        "wall time includes the infer stage; the dataset was written before either side ran.")
    print(f"ASHA / no scheduler wall time: {ratio:.2f}x")
    result.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
