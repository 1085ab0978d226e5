"""Training stage: ResNet-18 (or a ViT) on the Parquet dataset with Ray Train's TorchTrainer.

Layout of a run, ``<storage_path>/<run_name>/`` (a local folder or an S3 prefix):

- ``checkpoint_epoch_NNNN/`` (kept by Ray Train, best ``num_to_keep`` by val accuracy,
  plus the latest): ``state.pt`` with model, optimizer, scheduler, epoch (0-based
  index of the last finished epoch), config and classes; ``meta.json`` with the
  epoch's metrics.
- ``metrics.csv``: one row per finished epoch, written by rank 0 after every epoch.
- ``loss_curve.png``: drawn by the driver from ``metrics.csv``.

Running again with the same run name continues after the latest checkpoint: Ray
Train V2 (the default in Ray 2.60) finds the run's checkpoint snapshot under the
same ``RunConfig(name, storage_path)`` and hands its latest checkpoint to
``ray.train.get_checkpoint()``.

The model and checkpoints are in :mod:`workloads.vision.training.model`, the optimizer and
schedule in :mod:`workloads.vision.training.recipe`, the workers' loop in
:mod:`workloads.vision.training.loop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from jobs.infra import ray_internals
from workloads import storage
from workloads.placement import nodes_phrase
from workloads.storage import StoragePath
from workloads.ray_train.metrics import LOSS_CURVE, METRICS_CSV, final_metrics_line, plot_loss_curve, read_metrics_csv
from workloads.ray_train.trainer import TrainingError, fit, resolved_layout
from workloads.vision.config import TrainConfig, VisionParams
from workloads.vision.training.loop import METRIC_FIELDS, train_loop_per_worker
from workloads.vision.training.model import best_checkpoint, list_checkpoints, load_pretrained_state
from workloads.vision.training.recipe import divergence_message

if TYPE_CHECKING:
    from jobs.sweep import SweepSpec
    from workloads.ray_train.tracking import MlflowRun
    from workloads.ray_train.sweep import SweepOutcome
    from workloads.vision.reading.manifest import DatasetInfo

@dataclass
class TrainingOutcome:
    """What a training stage left behind."""

    run_dir: StoragePath
    best_checkpoint: StoragePath | None
    best_metrics: dict[str, float]
    final_metrics: dict[str, float]
    metrics_csv: StoragePath
    loss_curve: StoragePath | None
    epochs_trained: list[int] = field(default_factory=list)  # epoch numbers (1-based) this call trained
    skipped: bool = False
    worker_nodes: list[str] = field(default_factory=list)  # Ray node id of each rank (last attempt); empty if skipped


def outcome_from_disk(run_dir: StoragePath, trained: list[int], skipped: bool) -> TrainingOutcome:
    """Describe a run from what is in its storage: its metrics, curve and best checkpoint."""
    metrics_csv = run_dir / METRICS_CSV
    rows = read_metrics_csv(metrics_csv) if storage.exists(metrics_csv) else []
    loss_curve = plot_loss_curve(metrics_csv, run_dir / LOSS_CURVE) if rows else None
    best = best_checkpoint(run_dir)
    return TrainingOutcome(
        run_dir=run_dir,
        best_checkpoint=best[0] if best else None,
        best_metrics=best[1] if best else {},
        final_metrics=rows[-1] if rows else {},
        metrics_csv=metrics_csv,
        loss_curve=loss_curve,
        epochs_trained=trained,
        skipped=skipped,
    )


def run_training(params: VisionParams, info: DatasetInfo, callbacks: list[Any] | None = None,
                 tracking_parent: MlflowRun | None = None, score: tuple[str, str] = ("val_accuracy", "max")
                 ) -> TrainingOutcome:
    """Train (or continue training) ``params.run_name`` on the preprocessed dataset ``info`` describes.

    Needs a connected Ray cluster. ``callbacks`` go to the trainer's ``RunConfig``. With ``tracking.mlflow``
    in the spec the run is recorded in MLflow; a sweep's trial is recorded as a child of ``tracking_parent``.
    The checkpoints kept are the best by ``score`` (metric, mode): a sweep's trials keep the sweep's.
    Raises :class:`TrainingError` with a readable message for problems the user can fix.
    """
    import ray

    from workloads.vision.reading.torch_dataset import split_files

    cfg = resolved_layout(params.train, data_reserve_cpus(params.train)).with_resolved_batch()
    params = params.model_copy(update={"train": cfg})
    dataset_root = storage.resolved(info.root)
    classes, layout = info.classes, info.layout
    split_files(dataset_root, "train")
    split_files(dataset_root, "val")
    if cfg.model == "vit" and layout.height % cfg.vit.patch_size:
        raise TrainingError(f"train.vit.patch_size {cfg.vit.patch_size} does not divide the dataset's "
                            f"{layout.height}-pixel images")
    # Read once here, checked, and handed to every worker through the object store: the
    # workers' nodes need neither the file nor internet access.
    pretrained = load_pretrained_state(cfg)
    if pretrained is not None:
        print(f"Fine-tuning from {'ImageNet weights' if cfg.uses_imagenet_weights else cfg.weights}: peak lr "
              f"{cfg.peak_lr():.3g}" + (f", backbone frozen for {cfg.freeze_epochs} epoch(s)" if cfg.freeze_epochs else ""),
              flush=True)
    run_dir = params.run_dir

    checkpoints = list_checkpoints(run_dir)
    latest = checkpoints[-1] if checkpoints else None
    if latest is not None:
        done = int(latest[1]["epoch"])
        if done >= cfg.epochs:
            print(f"Run {params.run_name!r} already finished {done} of {cfg.epochs} epochs "
                  f"(latest checkpoint {latest[0]}); nothing to train. Raise train.epochs to train further, "
                  "or pick a new run_name to start over.", flush=True)
            return outcome_from_disk(run_dir, [], skipped=True)
        print(f"Run {params.run_name!r} has a checkpoint after epoch {done}: continuing with epoch {done + 1} "
              f"of {cfg.epochs}.", flush=True)

    loop_config = {
        "train": cfg.model_dump(mode="json"),
        "classes": list(classes),
        "layout": layout.to_dict(),
        "train_rows": int(info.counts.get("train", 0)),
        # Locations as text: the torchrun baseline of benchmarks/plain_torch.py stores this config as JSON.
        "dataset_root": str(dataset_root),
        "run_dir": str(run_dir),
        "pretrained": ray.put(pretrained) if pretrained is not None else None,
        # Ray Train V1 does not restore a run by name; there the latest checkpoint is handed over explicitly.
        "resume_from": str(latest[0]) if latest is not None and not ray_internals.train_v2_enabled() else None,
    }
    data_options: dict[str, Any] = {}
    if cfg.ingest == "ray_data":
        from workloads.vision.reading.ray_datasets import (ExactValidationDataConfig, data_cpu_shortfall,
                                                           training_datasets)

        shortfall = data_cpu_shortfall(cfg)
        if shortfall is not None:
            raise TrainingError(shortfall)
        data_options = {"datasets": training_datasets(dataset_root, layout, cfg),
                        "dataset_config": ExactValidationDataConfig()}
    from workloads.ray_train.tracking import tracked_training

    with tracked_training(run_dir, params.run_name, params.model_dump(mode="json"), tracking_parent) as tracked:
        result = fit(train_loop_per_worker, loop_config, params.storage_root, params.run_name, cfg, score[0],
                     [*(callbacks or []), *([tracked.reporter()] if tracked else [])], score[1], **data_options)
        returned = getattr(result, "return_value", None) or {}
        if "diverged" in returned:
            raise TrainingError(divergence_message(params.run_name, returned["diverged"]))
        outcome = outcome_from_disk(run_dir, list(returned.get("epochs_trained", [])), skipped=False)
        outcome.worker_nodes = list(returned.get("worker_nodes", []))
        if tracked:
            tracked.finish([outcome.metrics_csv, outcome.loss_curve])
    return outcome


def data_reserve_cpus(cfg: TrainConfig) -> float:
    """CPUs an auto layout leaves free on each node for Ray Data's decode tasks (none with the torch loader)."""
    return float(cfg.data_cpus) if cfg.ingest == "ray_data" else 0.0


def print_training_summary(outcome: TrainingOutcome) -> None:
    """Print where the best checkpoint is and the final metrics, for the job's last log lines."""
    print(f"Run directory: {outcome.run_dir}")
    print(f"Metrics: {outcome.metrics_csv}")
    if outcome.loss_curve:
        print(f"Loss curve: {outcome.loss_curve}")
    if outcome.best_checkpoint:
        best = outcome.best_metrics
        print(f"Best checkpoint: {outcome.best_checkpoint} (epoch {int(best['epoch'])}, "
              f"val_accuracy {best['val_accuracy']:.4f}, val_loss {best['val_loss']:.4f})")
    if outcome.worker_nodes:
        print(worker_nodes_line(outcome.worker_nodes))
    if outcome.final_metrics:
        print(final_metrics_line(outcome.final_metrics, METRIC_FIELDS))


def worker_nodes_line(nodes: list[str]) -> str:
    """``Training workers: rank 0 on node 1a2b3c4d, rank 1 on node 5e6f7a8b (2 nodes)``: where each rank ran."""
    ranks = ", ".join(f"rank {rank} on node {node[:8]}" for rank, node in enumerate(nodes))
    return f"Training workers: {ranks} ({nodes_phrase(nodes)})"


def run_training_sweep(params: VisionParams, info: DatasetInfo, sweep: SweepSpec) -> tuple[VisionParams, SweepOutcome]:
    """Run ``sweep`` over the training of ``params`` on the dataset ``info`` describes; return the best trial's
    parameters (its run folder, for inference) and how the sweep went.

    Raises :class:`TrainingError` when every trial failed.
    """
    from workloads.ray_train.sweep import TRIALS_DIR, check_definition, refit_line, run_sweep, trial_table
    from workloads.ray_train.tracking import MlflowRun
    from workloads.vision.training.selection import carve_selection_split

    # Resolved once, before the trials: each trial then asks Tune for the same workers, and as many trials as the
    # sweep runs at once each get their share of what is free.
    at_once = sweep.max_concurrent if isinstance(sweep.max_concurrent, int) else 1
    params = params.model_copy(update={"train": resolved_layout(params.train, data_reserve_cpus(params.train),
                                                                trials_at_once=at_once).with_resolved_batch()})
    document = params.model_dump(mode="json")
    check_definition(sweep, params.run_dir)  # before the carve, which a changed holdout would redo
    selection = carve_selection_split(info, params.run_dir, sweep.holdout, params.data.seed)
    print(f"Trials train on {selection.counts['train']} of the {info.counts.get('train', 0)} training images and are "
          f"compared on the other {selection.counts['val']} ({sweep.holdout:.0%} of each class"
          f"{', carved earlier' if selection.reused else ''}); the {info.counts.get('val', 0)} images of the "
          "validation split take no part in the choice.", flush=True)
    parent = MlflowRun.open(params.run_dir, params.run_name, {**document, "sweep": sweep.model_dump(mode="json")})
    score = (sweep.metric, sweep.mode)
    try:
        outcome = run_sweep(sweep, partial(_run_trial, document, selection, parent, score),
                            params.run_dir, params.train.demand("training", "train"), params.train.epochs,
                            partial(_run_refit, document, info, parent, score))
    except TrainingError:  # the refit's: the trials are done, and the sweep's MLflow run says it failed
        if parent:
            parent.close("FAILED")
        raise
    if parent:
        parent.log_artifacts([outcome.trials_csv, outcome.trials_plot])
        if outcome.best is not None and outcome.best.best is not None:
            parent.log_metrics({f"best_{sweep.metric}": outcome.best.best}, step=0)
        if outcome.refit is not None and outcome.refit.score is not None:
            parent.log_metrics({f"refit_validation_{sweep.metric}": outcome.refit.score}, step=0)
        parent.close("FINISHED" if outcome.best is not None else "FAILED",
                     {"rayjobs.best_trial": outcome.best.name} if outcome.best else None)
    print(f"\nTrials (best first by {sweep.metric}):\n{trial_table(outcome, sweep)}", flush=True)
    print(f"Trials: {outcome.trials_csv}" + (f"; curves: {outcome.trials_plot}" if outcome.trials_plot else ""),
          flush=True)
    if outcome.best is None:
        failed = "; ".join(f"{trial.name}: {trial.error}" for trial in outcome.trials)
        raise TrainingError(f"every trial of the sweep failed: {failed}")
    best = trial_params(document, outcome.best.values, outcome.best.name,
                        params.run_dir / TRIALS_DIR)
    print(f"Best trial: {outcome.best.name} ({sweep.metric} {outcome.best.best:.4f}), run folder {best.run_dir}",
          flush=True)
    if outcome.refit is not None:
        print(refit_line(outcome, sweep), flush=True)
        # Its last checkpoint: choosing an epoch by the validation split would spoil the test it is for.
        checkpoints = list_checkpoints(outcome.refit.run_dir)
        outcome.checkpoint = checkpoints[-1][0] if checkpoints else None
        return trial_params(document, outcome.refit.values, outcome.refit.run_dir.name, params.run_dir), outcome
    chosen = best_checkpoint(best.run_dir, sweep.metric, sweep.mode)
    outcome.checkpoint = chosen[0] if chosen else None
    return best, outcome


def trial_params(document: dict[str, Any], values: dict[str, Any], name: str,
                 trials_root: StoragePath) -> VisionParams:
    """The parameters of trial ``name``: ``values`` applied to the sweep's ``document``, its own run folder."""
    from jobs.sweep import apply_values

    applied = apply_values(document, values)
    applied.update(run_name=name, storage_path=str(trials_root))
    return VisionParams.model_validate(applied)


def _run_trial(document: dict[str, Any], info: DatasetInfo, tracking_parent: MlflowRun | None,
               score: tuple[str, str], values: dict[str, Any], name: str, trials_root: StoragePath,
               callbacks: list[Any]) -> None:
    run_training(trial_params(document, values, name, trials_root), info, callbacks, tracking_parent, score)


def _run_refit(document: dict[str, Any], info: DatasetInfo, tracking_parent: MlflowRun | None,
               score: tuple[str, str], values: dict[str, Any], name: str, storage_root: StoragePath) -> None:
    # ``info`` is the whole dataset: every training image, measured on the validation split.
    run_training(trial_params(document, values, name, storage_root), info, None, tracking_parent, score)
