"""The confusion matrix of batch inference, as a chart and as a text table.

Training's ``metrics.csv`` and loss curve are drawn by :mod:`workloads.ray_train.metrics`.
"""

from __future__ import annotations

from typing import Sequence

from workloads.storage import StoragePath
from workloads.ray_train.metrics import pyplot, save_figure


def plot_confusion_matrix(matrix: Sequence[Sequence[int]], classes: Sequence[str],
                          out_path: StoragePath) -> StoragePath:
    """Draw a confusion matrix (rows: true class, columns: predicted class) into ``out_path``."""
    plt = pyplot()
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
    save_figure(fig, out_path)
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
