"""Fine-tune ``ViTForImageClassification`` with the transformers ``Trainer`` inside Ray Train.

Each Ray Train worker builds the same ``Trainer``; ``prepare_trainer`` and
``RayTrainReportCallback`` connect it to Ray Train, which owns the process group,
the checkpoints (one per epoch, the best ``num_to_keep`` by eval accuracy kept
under ``<storage_path>/<run_name>``) and recovery from worker failures. Running
the same run name again resumes from the latest checkpoint.

Data is read from local files in a Hugging Face ``datasets`` format. Weights come
from a ``save_pretrained`` folder or, by hub model id, from the Hugging Face cache;
the hub is contacted only to fill that cache, and only when ``HF_HUB_OFFLINE=0``
(:func:`hub_offline_by_default`).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path

from workloads import storage
from workloads.hf_vit.config import HFDataConfig, HFModelConfig, HFTrainConfig, HFViTParams
from workloads.ray_train.metrics import LOSS_CURVE, METRICS_CSV, final_metrics_line, write_run_metrics
from workloads.ray_train.trainer import first_line, fit, resolved_layout

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
RAY_CHECKPOINT_DIR = "checkpoint"  # RayTrainReportCallback's folder inside each Ray checkpoint


class HFWorkloadError(RuntimeError):
    """The job cannot run as configured; the message says why."""


def hub_offline_by_default() -> None:
    """Keep the Hugging Face libraries off the hub unless the job's environment turns it on (``HF_HUB_OFFLINE=0``).

    Every function here calls it before importing them: they read these variables once, when first imported.
    """
    for variable in OFFLINE_VARIABLES:
        os.environ.setdefault(variable, "1")


# --------------------------------------------------------------------------- data


def load_local_dataset(data: HFDataConfig):
    """The ``DatasetDict`` at ``data.path``, in whichever of the supported formats it is."""
    hub_offline_by_default()
    import datasets

    path = Path(data.path).expanduser()
    if not path.exists():
        raise HFWorkloadError(f"data.path {str(path)!r} does not exist; point it at a local copy of the dataset "
                              "(nothing is downloaded)")
    kind = data.format
    if kind == "auto":
        if (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file():
            kind = "disk"
        elif any(path.rglob("*.parquet")):
            kind = "parquet"
        else:
            kind = "imagefolder"
    try:
        if kind == "disk":
            loaded = datasets.load_from_disk(str(path))
        elif kind == "parquet":
            files: dict[str, list[str]] = {}
            for shard in sorted(path.rglob("*.parquet")):
                split = shard.name.split("-")[0].split(".")[0]
                files.setdefault(split, []).append(str(shard))
            loaded = datasets.load_dataset("parquet", data_files=files)
        else:
            loaded = datasets.load_dataset("imagefolder", data_dir=str(path))
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for unreadable folders
        raise HFWorkloadError(f"cannot read {str(path)!r} as a {kind} dataset ({type(exc).__name__}: "
                              f"{first_line(exc, 300)})") from None
    if isinstance(loaded, datasets.Dataset):
        raise HFWorkloadError(f"{str(path)!r} holds a single split; save a DatasetDict with train and validation splits")
    return loaded


def dataset_splits(data: HFDataConfig):
    """(train split, eval split, image column, label column, class names), with the caps applied."""
    hub_offline_by_default()
    import datasets

    loaded = load_local_dataset(data)
    eval_name = data.eval_split or next((s for s in ("validation", "valid", "val", "test") if s in loaded), None)
    for name in (data.train_split, eval_name):
        if name is None or name not in loaded:
            raise HFWorkloadError(f"split {name or 'validation/test'!r} not found in {str(data.path)!r}; it has "
                                  f"{sorted(loaded)}. Set data.train_split / data.eval_split.")
    train, evaluation = loaded[data.train_split], loaded[eval_name]
    columns = train.column_names
    image_column = data.image_column or next((c for c in ("image", "img") if c in columns), None)
    label_column = data.label_column or next((c for c in ("labels", "label") if c in columns), None)
    for role, column in (("image", image_column), ("label", label_column)):
        if column is None or column not in columns:
            raise HFWorkloadError(f"no {role} column {column or ''!r} in {str(data.path)!r} (columns: {columns}); "
                                  f"set data.{role}_column")
    feature = train.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        classes = list(feature.names)
    else:
        classes = [str(v) for v in sorted(set(train[label_column]))]
    if data.max_per_split:
        train = train.select(range(min(len(train), data.max_per_split)))
        evaluation = evaluation.select(range(min(len(evaluation), data.max_per_split)))
    return train, evaluation, image_column, label_column, classes


# --------------------------------------------------------------------------- model


def resolve_hub_weights(hub_id: str) -> Path:
    """The local snapshot folder of hub model ``hub_id``: from the Hugging Face cache, else downloaded into it once.

    Called on the driver only; concurrent jobs wait on a file lock beside the cache
    entry instead of downloading twice. Raises :class:`HFWorkloadError` with the
    cache path and how to pre-seed it when the model is not cached and cannot be fetched.
    """
    from filelock import FileLock

    hub_offline_by_default()
    from huggingface_hub import constants, snapshot_download

    cache = Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or a partial entry): try to fetch it below
        pass

    def missing(why: str) -> HFWorkloadError:
        entry = cache / f"models--{hub_id.replace('/', '--')}"
        return HFWorkloadError(
            f"model.weights {hub_id!r} is not in the Hugging Face cache {cache} (the folder follows HF_HOME or "
            f"HF_HUB_CACHE) and {why}. Pre-seed the cache: on a machine with internet run `huggingface-cli "
            f"download {hub_id}` and copy ~/.cache/huggingface/hub/{entry.name} to {entry} on the head node; or "
            "download it into a folder (`--local-dir DIR`) and set model.weights to that folder; or set "
            "HF_HUB_OFFLINE: 0 in runtime_env.env_vars on a cluster with internet; or use 'none' to train from scratch."
        )

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        raise missing("downloads are off (HF_HUB_OFFLINE=1)")
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / f".rayjobs-{hub_id.replace('/', '--')}.lock"), timeout=3600):
        try:
            return Path(snapshot_download(hub_id, local_files_only=False))
        except Exception as exc:  # noqa: BLE001 - offline, unknown id, gated model: one message
            raise missing(f"downloading it failed ({type(exc).__name__}: {first_line(exc)})") from None


def build_model(model_cfg: HFModelConfig, classes: list[str]):
    """(model, image processor): from the local weights folder, or a fresh ViT of the configured shape."""
    hub_offline_by_default()
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {"id2label": dict(enumerate(classes)), "label2id": {name: i for i, name in enumerate(classes)}}
    if model_cfg.weights.strip().lower() == "none":
        config = ViTConfig(image_size=model_cfg.image_size, patch_size=model_cfg.patch_size,
                           hidden_size=model_cfg.hidden_size, num_hidden_layers=model_cfg.num_hidden_layers,
                           num_attention_heads=model_cfg.num_attention_heads,
                           intermediate_size=model_cfg.intermediate_size, num_labels=len(classes), **labels)
        processor = ViTImageProcessor(size={"height": model_cfg.image_size, "width": model_cfg.image_size},
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return ViTForImageClassification(config), processor
    folder = Path(model_cfg.weights).expanduser()
    if not (folder / "config.json").is_file():
        raise HFWorkloadError(f"model.weights {str(folder)!r} is not a folder with config.json and weights (as written "
                              "by save_pretrained); nothing is downloaded")
    try:
        # The head is new whenever the classes differ from the checkpoint's: a size mismatch there is expected.
        model = ViTForImageClassification.from_pretrained(str(folder), num_labels=len(classes),
                                                          ignore_mismatched_sizes=True, local_files_only=True, **labels)
    except Exception as exc:  # noqa: BLE001
        raise HFWorkloadError(f"cannot load ViT weights from {str(folder)!r} ({type(exc).__name__}: "
                              f"{first_line(exc, 300)})") from None
    if (folder / "preprocessor_config.json").is_file():
        processor = ViTImageProcessor.from_pretrained(str(folder), local_files_only=True)
    else:
        size = model.config.image_size
        processor = ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return model, processor


# --------------------------------------------------------------------------- Ray Train worker


def train_loop_per_worker(config: dict) -> None:
    """Body of every Ray Train worker: one transformers Trainer, reporting to Ray Train each epoch."""
    hub_offline_by_default()
    import numpy as np
    import ray.train
    import torch
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import Trainer, TrainingArguments

    params = HFViTParams.model_validate(config["params"])
    cfg: HFTrainConfig = params.train
    torch.set_num_threads(cfg.cpu_threads())
    context = ray.train.get_context()
    world_size = context.get_world_size()

    train, evaluation, image_column, label_column, classes = dataset_splits(params.data)
    model, processor = build_model(params.model, classes)

    def transform(batch):
        pixels = processor([image.convert("RGB") for image in batch[image_column]], return_tensors="pt")
        return {"pixel_values": pixels["pixel_values"], "labels": torch.tensor(batch[label_column])}

    def collate(rows):
        return {"pixel_values": torch.stack([r["pixel_values"] for r in rows]),
                "labels": torch.stack([r["labels"] for r in rows])}

    def accuracy(prediction):
        return {"accuracy": float((np.argmax(prediction.predictions, axis=1) == prediction.label_ids).mean())}

    per_device = max(1, cfg.batch_size // world_size)
    # transformers 5 folds warmup_ratio into warmup_steps (a float below 1 is a ratio); 4.x has both.
    warmup = ({"warmup_ratio": cfg.warmup_ratio} if "warmup_ratio" in inspect.signature(TrainingArguments).parameters
              else {"warmup_steps": cfg.warmup_ratio})
    arguments = TrainingArguments(
        output_dir=str(Path(config["scratch"]) / f"rank{context.get_world_rank()}"),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=per_device,
        per_device_eval_batch_size=per_device,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        **warmup,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_strategy="epoch",
        save_total_limit=1,  # Ray Train keeps the run's checkpoints; these are the Trainer's scratch copies
        report_to="none",
        remove_unused_columns=False,  # the image column is turned into pixel_values on the fly
        use_cpu=not cfg.use_gpu,
        bf16=cfg.use_gpu and cfg.bf16,
        dataloader_num_workers=0,
        disable_tqdm=True,  # redrawn bars become noise in a job log; per-epoch logs remain
        seed=cfg.seed,
        ddp_find_unused_parameters=False,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=train.with_transform(transform),
                      eval_dataset=evaluation.with_transform(transform), data_collator=collate,
                      compute_metrics=accuracy)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)

    resume = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            local = Path(config["scratch"]) / "resume"
            shutil.copytree(Path(directory) / RAY_CHECKPOINT_DIR, local, dirs_exist_ok=True)
            resume = str(local)
    trainer.train(resume_from_checkpoint=resume)


# --------------------------------------------------------------------------- driver


def run(params: HFViTParams) -> dict:
    """Fine-tune on the connected Ray cluster; write metrics.csv and loss_curve.png; return the final metrics."""
    import tempfile

    # Fail on the driver, with one message, before any worker starts.
    train, evaluation, _, _, classes = dataset_splits(params.data)
    if params.model.hub_id:
        # The workers load the snapshot the driver resolved; none of them goes to the hub.
        snapshot = resolve_hub_weights(params.model.hub_id)
        print(f"Weights {params.model.hub_id}: {snapshot}", flush=True)
        params = params.model_copy(update={"model": params.model.model_copy(update={"weights": str(snapshot)})})
    build_model(params.model, classes)
    print(f"Dataset {params.data.path}: {len(train)} train and {len(evaluation)} eval images, classes {classes}",
          flush=True)

    params = params.model_copy(update={"train": resolved_layout(params.train)})
    run_dir = params.run_dir
    scratch = tempfile.mkdtemp(prefix="rayjobs-hf-")
    from workloads.ray_train.tracking import tracked_training

    with tracked_training(run_dir, params.run_name, params.model_dump(mode="json")) as tracked:
        try:
            result = fit(train_loop_per_worker, {"params": params.model_dump(mode="json"), "scratch": scratch},
                         params.storage_root, params.run_name, params.train, "eval_accuracy",
                         [tracked.reporter()] if tracked else [])
        finally:
            # The Trainer's own output; every checkpoint that matters is in the run's storage by now.
            shutil.rmtree(scratch, ignore_errors=True)
        rows = epoch_rows(run_dir, result)
        write_run_metrics(run_dir, rows)
        if tracked:
            tracked.finish([run_dir / METRICS_CSV, run_dir / LOSS_CURVE])
    best = None
    if getattr(result, "best_checkpoints", None):
        best_checkpoint, best_metrics = max(result.best_checkpoints, key=lambda item: item[1].get("eval_accuracy", 0))
        best = str(transformers_checkpoint(run_dir, best_checkpoint))
        print(f"Best checkpoint: {best} (epoch {best_metrics.get('epoch', 0):g}, "
              f"eval_accuracy {best_metrics.get('eval_accuracy', 0):.4f})", flush=True)
    final = rows[-1] if rows else {}
    print(f"Metrics: {run_dir / METRICS_CSV}; loss curve: {run_dir / LOSS_CURVE}", flush=True)
    print(final_metrics_line(final), flush=True)
    return {"final": final, "best_checkpoint": best, "run_dir": str(run_dir)}


def transformers_checkpoint(run_dir, checkpoint):
    """The transformers checkpoint folder inside a Ray checkpoint of the run, as a path under ``run_dir``."""
    # Ray's checkpoint path has no scheme in object storage; the run directory keeps it (s3://…).
    return run_dir / checkpoint.path.rstrip("/").rsplit("/", 1)[-1] / RAY_CHECKPOINT_DIR


def epoch_rows(run_dir, result) -> list[dict[str, float]]:
    """One row per epoch (epoch, train_loss, val_loss, val_accuracy), from the Trainer's own log history.

    The history is read from the latest checkpoint's ``trainer_state.json``, which the Trainer carries
    across resumed runs. Ray's ``metrics_dataframe`` would do only while every checkpoint is kept: it
    describes the checkpoints left after ``num_to_keep``.
    """
    checkpoint = getattr(result, "checkpoint", None)
    if checkpoint is None:
        return []
    state_file = transformers_checkpoint(run_dir, checkpoint) / "trainer_state.json"
    history = json.loads(storage.read_text(state_file)).get("log_history", [])
    rows: dict[int, dict[str, float]] = {}
    for record in history:
        if record.get("epoch") is None:
            continue
        row = rows.setdefault(round(float(record["epoch"])), {"epoch": round(float(record["epoch"])),
                                                               "train_loss": float("nan")})
        if "loss" in record:
            row["train_loss"] = float(record["loss"])
        if "eval_accuracy" in record:
            row["val_loss"] = float(record["eval_loss"])
            row["val_accuracy"] = float(record["eval_accuracy"])
    return [rows[epoch] for epoch in sorted(rows) if "val_accuracy" in rows[epoch]]
