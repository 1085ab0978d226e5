"""Classify single images with a trained run.

``python -m workloads.vision.inference.predict [--params FILE | --run-dir DIR] [--gpu] IMAGE...``:
IMAGE is an image file (JPEG, PNG, ...) or ``FILE.parquet:ROW`` for a row of a
Parquet file in the preprocessed layout. Each image is classified by a Ray task
that loads the run's best checkpoint.

Exit status: 0 when every image was classified, 1 when the run has no checkpoint or an image
could not be classified, 2 for bad input (parameters, or an image that cannot be read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.errors import BadInput
from workloads import storage
from workloads.entry import on_cluster, workload_main
from workloads.params import add_params_argument, read_params
from workloads.vision.config import VisionParams
from workloads.vision.errors import InferenceError


def read_image_argument(argument: str) -> tuple[bytes, int | None]:
    """Image bytes named by ``argument``, and the true label when it is a row of the
    preprocessed dataset (then the bytes are as stored there, not an image file)."""
    path_text, _, row_text = argument.rpartition(":")
    if path_text.endswith(".parquet") and row_text.isdigit():
        import pyarrow.parquet as pq

        path, row = Path(path_text).expanduser(), int(row_text)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        parquet_file = pq.ParquetFile(path)
        if row >= parquet_file.metadata.num_rows:
            raise ValueError(f"{path} has {parquet_file.metadata.num_rows} rows; row {row} does not exist")
        first = 0
        for group in range(parquet_file.num_row_groups):
            rows = parquet_file.metadata.row_group(group).num_rows
            if row < first + rows:
                table = parquet_file.read_row_group(group, columns=["image", "label"])
                return table.column("image")[row - first].as_py(), int(table.column("label")[row - first].as_py())
            first += rows
    path = Path(argument).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (give an image file or FILE.parquet:ROW)")
    return path.read_bytes(), None


def main(argv: list[str] | None = None) -> int:
    """Classify the images on the command line and print class and confidence for each; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m workloads.vision.inference.predict",
                                     description=__doc__.splitlines()[0])
    add_params_argument(parser)
    parser.add_argument("--run-dir", default=None,
                        help="run directory (<storage_path>/<run_name>, a local folder or s3://...); default: from "
                        "the parameters")
    parser.add_argument("--gpu", action="store_true", help="run each task on a GPU")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image file or FILE.parquet:ROW")
    args = parser.parse_args(argv)

    def predict() -> None:
        try:
            if args.run_dir is not None:
                run_dir = storage.resolved(args.run_dir)
            else:
                run_dir = read_params(VisionParams, args.params, "vision").run_dir
            images = [(argument, *read_image_argument(argument)) for argument in args.images]
        except BadInput:
            raise
        except (OSError, ValueError) as exc:
            raise BadInput(str(exc)) from None

        from workloads.vision.inference.classify import resolve_checkpoint

        checkpoint_dir, checkpoint_metrics = resolve_checkpoint(run_dir)
        on_cluster(lambda: _classify(images, checkpoint_dir, checkpoint_metrics, args.gpu))

    return workload_main(predict, failures=(InferenceError,))


def _classify(images: list[tuple[str, bytes, int | None]], checkpoint_dir, checkpoint_metrics: dict,
              gpu: bool) -> None:
    """Classify each image in a Ray task and print one line per image; raise InferenceError when one failed."""
    import ray

    from workloads.vision.inference.classify import classify_image_task

    print(f"Checkpoint: {checkpoint_dir} (epoch {int(checkpoint_metrics['epoch'])}, "
          f"val_accuracy {checkpoint_metrics['val_accuracy']:.4f})")
    task = classify_image_task.options(num_gpus=1) if gpu else classify_image_task
    pending = [task.remote(str(checkpoint_dir), data, use_gpu=gpu, stored=label is not None)
               for _, data, label in images]
    failed = 0
    for (argument, _, label), ref in zip(images, pending):
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            failed += 1
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            print(f"{argument}: error: {cause}")
            continue
        others = ", ".join(f"{name} {p:.1%}" for name, p in result["top"][1:])
        truth = f" (true label {label})" if label is not None else ""
        print(f"{argument}: {result['predicted_class']} ({result['confidence']:.1%}){truth}"
              + (f"; then {others}" if others else ""))
    if failed:
        raise InferenceError(f"{failed} of {len(images)} image(s) could not be classified")


if __name__ == "__main__":
    sys.exit(main())
