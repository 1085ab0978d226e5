"""Parameters of the ``hf_vit`` workload, as written in a spec's ``workload`` section.

Imports only pydantic, so rayjobs validates a spec without transformers installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from jobs.paths import SpecPath
from jobs.strict import StrictModel
from jobs.workload_contract import WorkloadNeeds
from workloads.params import LocalWeights
from workloads.ray_train.config import RayTrainSettings, TrainingRunParams, run_name_field

# "google/vit-base-patch16-224": what a Hugging Face hub model id looks like.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HFDataConfig(StrictModel):
    """An image-classification dataset in a Hugging Face ``datasets`` format, on local disk."""

    path: SpecPath = Field(description="A folder written by DatasetDict.save_to_disk, a folder of Parquet shards "
                           "as on the hub (data/train-*.parquet, ...), or an imagefolder tree (train/<class>/*.jpg).")
    format: Literal["auto", "disk", "parquet", "imagefolder"] = Field(
        "auto", description="How path is laid out: 'disk' (save_to_disk), 'parquet' (shards named <split>-*.parquet), "
        "'imagefolder', or 'auto' to tell from the files.")
    image_column: str | None = Field(None, description="Column holding the images. Default: 'image' or 'img', "
                                     "whichever exists.")
    label_column: str | None = Field(None, description="Column holding the class labels. Default: 'labels' or "
                                     "'label', whichever exists.")
    train_split: str = Field("train", description="Split to train on.")
    eval_split: str | None = Field(None, description="Split to evaluate on after each epoch. Default: 'validation' "
                                   "(or 'valid', 'val'), else 'test'.")
    max_per_split: PositiveInt | None = Field(None, description="Keep at most this many rows per split (quick runs).")


class HFModelConfig(StrictModel):
    """ViTForImageClassification: from local weights, or a fresh configuration trained from scratch."""

    weights: LocalWeights = Field(
        "none", description="'none' (train from scratch with the shape below), a local folder holding config.json "
        "and the weights (save_pretrained / a hub snapshot), or a hub model id such as "
        "google/vit-base-patch16-224-in21k, read from the Hugging Face cache (HF_HOME) and downloaded into it "
        "once when downloads are allowed (HF_HUB_OFFLINE=0).")
    image_size: PositiveInt = Field(224, description="Side of the square input images (weights 'none' only; "
                                    "loaded weights keep their own).")
    patch_size: PositiveInt = Field(16, description="Side of the square patches each image is cut into; must "
                                    "divide image_size.")
    hidden_size: PositiveInt = Field(768, description="Width of the transformer (embedding size).")
    num_hidden_layers: PositiveInt = Field(12, description="Transformer encoder layers.")
    num_attention_heads: PositiveInt = Field(12, description="Attention heads per layer; must divide hidden_size.")
    intermediate_size: PositiveInt = Field(3072, description="Width of each layer's feed-forward block.")

    @property
    def hub_id(self) -> str | None:
        """The hub model id named by ``weights``, unless a local folder of that name exists."""
        value = self.weights.strip()
        if value.lower() != "none" and HUB_ID.match(value) and not Path(value).expanduser().exists():
            return value
        return None

    @model_validator(mode="after")
    def _shape(self) -> "HFModelConfig":
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size ({self.patch_size}) must divide image_size ({self.image_size})")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        return self


class HFTrainConfig(RayTrainSettings):
    """The transformers Trainer's settings, and how many Ray Train workers run it."""

    epochs: PositiveInt = Field(3, description="Passes over the training split.")
    batch_size: PositiveInt = Field(32, description="Global batch size, split evenly across workers.")
    lr: PositiveFloat = Field(5e-5, description="Peak learning rate (AdamW), reached after the warm-up, then "
                              "decayed linearly to zero.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW's decoupled weight decay.")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Share of the training steps spent warming the "
                                "learning rate up linearly from zero.")
    bf16: bool = Field(True, description="bf16 mixed precision on GPU (ignored on CPU).")
    seed: int = Field(0, description="Seed of the Trainer's random numbers (initialization, shuffling).")


class HFViTParams(TrainingRunParams):
    """The ``workload`` section of an ``hf_vit`` spec."""

    run_name: str = run_name_field("vit-hf")
    data: HFDataConfig = Field(description="The local image-classification dataset to fine-tune on.")
    model: HFModelConfig = Field(default_factory=HFModelConfig, description="The ViT to fine-tune: local or "
                                 "cached weights, or a fresh one of the given shape.")
    train: HFTrainConfig = Field(default_factory=HFTrainConfig, description="Trainer settings and Ray Train "
                                 "workers.")

    def needs(self) -> WorkloadNeeds:
        """The job's program, the locations every node reads or writes, and the Ray Train workers (see
        :mod:`jobs.workload_contract`)."""
        # Every worker writes the run, reads the dataset, and loads local weights itself.
        shared = {"storage_path": str(self.storage_path), "data.path": str(self.data.path)}
        if self.model.weights.strip().lower() != "none" and self.model.hub_id is None:
            shared["model.weights"] = self.model.weights
        return WorkloadNeeds(entrypoint_module="workloads.hf_vit", shared_locations=shared,
                             demands=(self.train.demand("training", "train"),), run_location=self.run_location)
