"""Entry point of the vision workload: ``python -m workloads.vision [--params FILE]``.

Runs the spec's stages in order (preprocess → train → infer) on the Ray cluster the
job belongs to. A stage can run alone: ``train`` reads the dataset preprocessed
earlier, ``infer`` uses the best checkpoint of the run named ``run_name``.

Exit status: 0 when every stage did its work, 1 when a stage failed, 2 for bad input
(invalid parameters, data that cannot be read as asked, or object storage that cannot be
used: the message names it); see :mod:`workloads.vision.errors`.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from jobs.errors import BadInput
from workloads.entry import on_cluster, workload_main
from workloads.params import load_sweep, parse_command_line
from rayjobs_agent import EventKind, emit
from workloads.storage import check_storage, storage_path
from workloads.ray_train.trainer import TrainingError
from workloads.vision.config import VisionParams
from workloads.vision.errors import DatasetMissingError, DataSourceError, InferenceError

if TYPE_CHECKING:
    from jobs.sweep import SweepSpec

STAGE_TITLES = {
    "preprocess": "Preprocess: images -> Parquet",
    "train": "Train: distributed training with Ray Train",
    "infer": "Infer: batch predictions on the validation split",
}


def _header(index: int, total: int, stage: str) -> None:
    title = f"Stage {index}/{total}: {STAGE_TITLES[stage]}"
    print(f"\n{'=' * len(title)}\n{title}\n{'=' * len(title)}", flush=True)


def _dataset_info(params: VisionParams):
    from workloads.vision.reading.manifest import load_dataset_info

    try:
        return load_dataset_info(storage_path(params.data.output_dir))
    except DataSourceError as exc:
        raise DatasetMissingError(str(exc)) from None


def run_stages(params: VisionParams, sweep: SweepSpec | None = None) -> dict:
    """Run ``params.stages`` in order on the connected Ray cluster; return what each produced.

    With a ``sweep``, the train stage runs it, and the infer stage uses its best trial.
    """
    from workloads.vision.training.stage import print_training_summary

    produced: dict = {}
    info = None
    training = None
    for index, stage in enumerate(params.stages, start=1):
        _header(index, len(params.stages), stage)
        emit(EventKind.STAGE, name=stage, state="start", index=index, count=len(params.stages))
        started = time.perf_counter()
        if stage == "preprocess":
            from workloads.vision.preprocess.stage import run_preprocess

            info = run_preprocess(params.data)
            produced["preprocess"] = info
            emit(EventKind.COUNT, name="images in the dataset", done=sum(info.counts.values()), final=True,
                 reused=info.reused)
        elif stage == "train":
            from workloads.vision.training.stage import run_training

            info = info or _dataset_info(params)
            if sweep is not None:
                from workloads.vision.training.stage import outcome_from_disk, run_training_sweep

                params, produced["sweep"] = run_training_sweep(params, info, sweep)
                training = outcome_from_disk(params.run_dir, [], skipped=False)
            else:
                training = run_training(params, info)
            produced["train"] = training
        elif stage == "infer":
            from workloads.vision.inference.stage import run_batch_inference

            dataset_root = info.root if info else storage_path(params.data.output_dir)
            chosen = produced["sweep"].checkpoint if "sweep" in produced else None  # by the sweep's metric
            produced["infer"] = run_batch_inference(params, dataset_root=dataset_root, checkpoint_dir=chosen)
            emit(EventKind.COUNT, name="predicted", done=produced["infer"]["rows"], final=True)
        seconds = time.perf_counter() - started
        print(f"Stage {stage} finished in {seconds:.1f}s", flush=True)
        emit(EventKind.STAGE, name=stage, state="end", index=index, count=len(params.stages), seconds=round(seconds, 2))

    print("\n== Summary ==", flush=True)
    if training is None and "infer" in produced:
        from workloads.vision.training.stage import outcome_from_disk

        training = outcome_from_disk(params.run_dir, [], True)
    if training is not None:
        print_training_summary(training)
    if "infer" in produced:
        metrics = produced["infer"]
        print(f"Inference accuracy: {metrics['accuracy']:.4f} on {metrics['rows']} validation images "
              f"(predictions in {metrics['predictions']})")
        if sweep is not None:
            measured = ("refit run (the best values trained on the whole training split)"
                        if "sweep" in produced and produced["sweep"].refit is not None else "best trial")
            print(f"Test accuracy of the {measured}: {metrics['accuracy']:.4f}, on validation images that took no "
                  "part in choosing it")
    elif sweep is not None and "sweep" in produced:
        print("The best trial was not measured on the validation split: add infer to workload.stages to measure it")
    sys.stdout.flush()
    return produced


def check_params_storage(params: VisionParams) -> None:
    """Raise :class:`ObjectStoreError` when the bucket of ``data.output_dir`` or ``storage_path`` cannot be used:
    before any stage starts, and within seconds."""
    check_storage(storage_path(params.data.output_dir), "data.output_dir")
    if params.stages != ["preprocess"]:
        check_storage(storage_path(params.storage_path), "storage_path")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, connect to Ray and run the stages; return the exit status."""
    def run() -> None:
        params = parse_command_line(VisionParams, "vision", "python -m workloads.vision", __doc__.splitlines()[0],
                                    argv)
        sweep = load_sweep()
        if sweep is not None and "train" not in params.stages:
            raise BadInput("the spec has a sweep, and its stages have no train stage to sweep")
        check_params_storage(params)
        if "preprocess" not in params.stages:
            # Fail before connecting to the cluster when the dataset a later stage needs is missing.
            _dataset_info(params)
        on_cluster(lambda: run_stages(params, sweep))

    return workload_main(run, failures=(DatasetMissingError, InferenceError, TrainingError),
                         bad_input=(DataSourceError,))


if __name__ == "__main__":
    sys.exit(main())
