"""What a training run leaves beside its checkpoints: ``metrics.csv``, ``loss_curve.png``, TensorBoard's event
file, and its final metrics line."""

from __future__ import annotations

import csv
import io
import time
from typing import Mapping, Sequence

from workloads import storage
from workloads.storage import StoragePath

METRICS_CSV = "metrics.csv"
LOSS_CURVE = "loss_curve.png"
TENSORBOARD_DIR = "tensorboard"
# TensorBoard reads every file whose name holds "tfevents". One fixed name lets each epoch replace the
# file whole (object storage cannot append), and a resumed run rewrites it rather than adding a second.
TENSORBOARD_EVENTS = "events.out.tfevents.rayjobs"


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (jobs run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: StoragePath) -> None:
    """Write ``fig`` to ``path`` atomically, so a reader never sees half a PNG."""
    storage.write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight"))


def write_metrics_csv(path: StoragePath, rows: Sequence[Mapping[str, float]], fields: Sequence[str]) -> None:
    """Write ``rows`` (one per epoch) as a ``metrics.csv`` with columns ``fields``, atomically."""
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(fields))
            writer.writeheader()
            for row in rows:
                writer.writerow({key: int(row[key]) if key == "epoch" else row[key] for key in fields})

    storage.write_with(path, write)


def write_tensorboard_events(run_dir: StoragePath, rows: Sequence[Mapping[str, float]]) -> StoragePath:
    """Every row's metrics as TensorBoard scalars, the epoch as their step, in ``run_dir/tensorboard/``.

    The file is written whole and atomically each time, so ``tensorboard --logdir`` on a run folder (or on a
    sweep's ``trials/``) shows the curves as they grow.
    """
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.record_writer import RecordWriter

    now = time.time()
    events = [Event(wall_time=now, step=0, file_version="brain.Event:2")]
    for row in rows:
        # Text (the run's precision) is no scalar to draw.
        values = [Summary.Value(tag=key, simple_value=float(value)) for key, value in row.items()
                  if key != "epoch" and not isinstance(value, str)]
        events.append(Event(wall_time=now, step=int(row["epoch"]), summary=Summary(value=values)))

    def write(tmp: str) -> None:
        writer = RecordWriter(tmp)
        try:
            for event in events:
                writer.write(event.SerializeToString())
        finally:
            writer.close()

    path = run_dir / TENSORBOARD_DIR / TENSORBOARD_EVENTS
    storage.make_folder(path.parent)
    storage.write_with(path, write)
    return path


def read_metrics_csv(path: StoragePath) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` with every field as a number, in file order."""
    handle = io.StringIO(storage.read_text(path), newline="")
    return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def plot_loss_curve(metrics_csv: StoragePath, out_path: StoragePath) -> StoragePath:
    """Draw train/val loss and val accuracy by epoch from ``metrics_csv`` into ``out_path``."""
    rows = read_metrics_csv(metrics_csv)
    plt = pyplot()
    epochs = [int(r["epoch"]) for r in rows]
    fig, loss_axis = plt.subplots(figsize=(7, 4))
    loss_axis.plot(epochs, [r["train_loss"] for r in rows], marker="o", label="train loss")
    loss_axis.plot(epochs, [r["val_loss"] for r in rows], marker="o", label="val loss")
    loss_axis.set_xlabel("epoch")
    # One early spike (batch-norm statistics before they settle) would flatten a linear axis.
    losses = [r[key] for r in rows for key in ("train_loss", "val_loss") if r[key] > 0]
    if losses and max(losses) / min(losses) > 20:
        loss_axis.set_yscale("log")
    loss_axis.set_ylabel("cross-entropy loss")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(epochs, [r["val_accuracy"] for r in rows], marker="s", color="tab:green", label="val accuracy")
    accuracy_axis.set_ylabel("val accuracy")
    accuracy_axis.set_ylim(0, 1)
    handles = loss_axis.get_legend_handles_labels()[0] + accuracy_axis.get_legend_handles_labels()[0]
    labels = loss_axis.get_legend_handles_labels()[1] + accuracy_axis.get_legend_handles_labels()[1]
    loss_axis.legend(handles, labels, loc="center right")
    if epochs:
        loss_axis.set_xticks(epochs if len(epochs) <= 20 else epochs[:: max(1, len(epochs) // 10)])
    loss_axis.set_title("Training progress")
    save_figure(fig, out_path)
    plt.close(fig)
    return out_path


def write_run_metrics(run_dir: StoragePath, rows: Sequence[Mapping[str, float]]) -> None:
    """``metrics.csv`` (the columns of the first row), ``loss_curve.png`` and TensorBoard's event file in
    ``run_dir``; nothing without rows."""
    if rows:
        write_metrics_csv(run_dir / METRICS_CSV, rows, list(rows[0]))
        plot_loss_curve(run_dir / METRICS_CSV, run_dir / LOSS_CURVE)
        write_tensorboard_events(run_dir, rows)


def final_metrics_line(final: Mapping[str, float], fields: Sequence[str] | None = None) -> str:
    """``Final metrics: epoch=N, name=value, ...`` over ``fields`` (default: all of ``final``), 4 significant digits."""
    keys = [key for key in fields if key in final] if fields is not None else list(final)
    return "Final metrics: " + ", ".join(
        f"epoch={int(final[key])}" if key == "epoch" else f"{key}={final[key]:.4g}" for key in keys)
