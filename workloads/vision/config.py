"""Parameters of the vision workload, as written in a spec's ``workload`` section.

This module imports only pydantic so that rayjobs can validate a spec on a laptop
without torch or ray.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from jobs.paths import SpecPath

# The ten Food-101-Lite classes, by their display names.
FOOD101_LITE_CLASSES = [
    "pizza",
    "hamburger",
    "sushi",
    "ramen",
    "fried rice",
    "steak",
    "hot dog",
    "pancake",
    "burrito",
    "caesar salad",
]

Stage = Literal["preprocess", "train", "infer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class DataConfig(_Strict):
    """Where images come from and how they are turned into Parquet."""

    source: Literal["food101", "hf_parquet", "imagefolder", "synthetic"] = Field(
        "synthetic", description="Input format: official Food-101 layout, Hugging Face food101 Parquet shards, "
        "an ImageFolder tree, or generated images (offline)."
    )
    root: SpecPath | None = Field(None, description="Directory holding the source data (not used by 'synthetic').")
    classes: list[str] = Field(
        default_factory=lambda: list(FOOD101_LITE_CLASSES),
        min_length=2,
        description="Class names to keep, in label order. Food-101 folder names or display names.",
    )
    max_per_class: PositiveInt | None = Field(None, description="Cap on images per class and split.")
    image_size: PositiveInt = Field(224, description="Side of the square images written to Parquet (resize + center crop).")
    val_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share of images held out for validation when the source has no split."
    )
    synthetic_per_class: PositiveInt = Field(120, description="Images generated per class by the 'synthetic' source.")
    output_dir: SpecPath = Field(
        "~/rayjobs-data/food101-lite", description="Where the Parquet dataset is written (and read by training)."
    )
    jpeg_quality: int = Field(90, ge=1, le=100)
    rows_per_file: PositiveInt = Field(256, description="Rows per Parquet row group; small groups stream well.")
    seed: int = 0
    force: bool = Field(False, description="Preprocess again even if the same inputs and settings were done before.")

    @model_validator(mode="after")
    def _root_required(self) -> "DataConfig":
        if self.source != "synthetic" and self.root is None:
            raise ValueError(f"data.root is required for source {self.source!r}: point it at the local copy of the data")
        return self


class TrainConfig(_Strict):
    """Distributed training with Ray Train's TorchTrainer."""

    model: Literal["resnet18"] = "resnet18"
    weights: str = Field("none", description="'none' or a path to a torchvision ResNet-18 state dict (no downloads).")
    epochs: PositiveInt = 10
    batch_size: PositiveInt = Field(64, description="Global batch size, split evenly across workers.")
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: PositiveFloat = 0.05
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(1e-4, ge=0)
    lr_schedule: Literal["cosine", "step", "constant"] = "cosine"
    warmup_epochs: int = Field(0, ge=0)
    num_workers: PositiveInt = Field(2, description="Ray Train workers (processes).")
    cpus_per_worker: PositiveFloat = 1.0
    use_gpu: bool = False
    resources_per_worker: dict[str, float] = Field(default_factory=dict)
    amp: bool = Field(True, description="bf16 autocast on GPU (ignored on CPU).")
    channels_last: bool = Field(True, description="channels_last memory format on GPU (ignored on CPU).")
    loader_workers: int = Field(0, ge=0, description="DataLoader worker processes per training worker.")
    max_failures: int = Field(2, ge=-1, description="Worker failures survived by restoring the latest checkpoint (-1: no limit).")
    num_to_keep: PositiveInt = Field(2, description="Checkpoints kept, best by validation accuracy.")
    seed: int = 0


class InferConfig(_Strict):
    """Batch inference over the validation split with the best checkpoint."""

    batch_size: PositiveInt = 64
    num_actors: PositiveInt = 2
    cpus_per_actor: PositiveFloat = 1.0
    use_gpu: bool = False


class VisionParams(_Strict):
    """The ``workload`` section of a vision spec (``kind: vision``; the kind itself is read by rayjobs)."""

    stages: list[Stage] = Field(default_factory=lambda: ["preprocess", "train", "infer"], min_length=1)
    run_name: str = Field("food101-lite", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                          description="Ray Train run name; the same name resumes from its latest checkpoint.")
    storage_path: SpecPath = Field("~/rayjobs-results", description="Where runs, checkpoints and artifacts are kept.")
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    infer: InferConfig = Field(default_factory=InferConfig)
