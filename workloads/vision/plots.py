"""Charts and tables the vision workload leaves next to its results."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from jobs import atomic


def _pyplot():
    import matplotlib

    # The job runs without a display; Agg renders straight to files.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


METRICS_CSV = "metrics.csv"
LOSS_CURVE = "loss_curve.png"


def _save_atomically(fig, path: Path) -> None:
    atomic.replace_file(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight"))


def write_metrics_csv(path: Path, rows: Sequence[dict[str, float]], fields: Sequence[str]) -> None:
    """Write ``rows`` (one per epoch) as a ``metrics.csv`` with columns ``fields``, atomically."""
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(fields))
            writer.writeheader()
            for row in rows:
                writer.writerow({key: int(row[key]) if key == "epoch" else row[key] for key in fields})

    atomic.replace_file(path, write)


def read_metrics_csv(path: Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` with every field as a number, in file order."""
    with open(path, newline="", encoding="utf-8") as handle:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def plot_loss_curve(metrics_csv: Path, out_path: Path) -> Path:
    """Draw train/val loss and val accuracy by epoch from ``metrics_csv`` into ``out_path``."""
    rows = read_metrics_csv(metrics_csv)
    plt = _pyplot()
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
    _save_atomically(fig, out_path)
    plt.close(fig)
    return out_path


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], classes: Sequence[str], out_path: Path) -> Path:
    """Draw a confusion matrix (rows: true class, columns: predicted class) into ``out_path``."""
    plt = _pyplot()
    n = len(classes)
    size = max(4.0, 0.6 * n + 2)
    fig, axis = plt.subplots(figsize=(size, size))
    image = axis.imshow(matrix, cmap="Blues")
    axis.set_xticks(range(n), labels=classes, rotation=45, ha="right")
    axis.set_yticks(range(n), labels=classes)
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    peak = max((max(row) for row in matrix), default=0)
    for i in range(n):
        for j in range(n):
            value = matrix[i][j]
            axis.text(j, i, str(value), ha="center", va="center", fontsize=8,
                      color="white" if peak and value > peak / 2 else "black")
    fig.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    axis.set_title("Confusion matrix")
    _save_atomically(fig, out_path)
    plt.close(fig)
    return out_path


def confusion_table(matrix: Sequence[Sequence[int]], classes: Sequence[str]) -> str:
    """Render a confusion matrix as a fixed-width text table with per-class recall."""
    names = [str(c) for c in classes]
    corner = "true \\ pred"
    label_width = max(len(corner), *(len(n) for n in names))
    cell = max(5, *(len(str(v)) for row in matrix for v in row)) if matrix else 5
    short = [n if len(n) <= cell else n[: cell - 1] + "." for n in names]
    header = f"{corner:<{label_width}} " + " ".join(f"{s:>{cell}}" for s in short) + "  recall"
    lines = [header, "-" * len(header)]
    for index, (name, row) in enumerate(zip(names, matrix)):
        total = sum(row)
        correct = row[index]
        recall = f"{correct / total:6.1%}" if total else "     -"
        lines.append(f"{name:<{label_width}} " + " ".join(f"{v:>{cell}}" for v in row) + f"  {recall}")
    return "\n".join(lines)
