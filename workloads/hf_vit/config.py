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

# "google/vit-base-patch16-224": what a Hugging Face hub model id looks like.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")



class HFDataConfig(StrictModel):
    """An image-classification dataset in a Hugging Face ``datasets`` format, on local disk."""

    path: SpecPath = Field(description="A folder written by DatasetDict.save_to_disk, a folder of Parquet shards "
                           "as on the hub (data/train-*.parquet, ...), or an imagefolder tree (train/<class>/*.jpg).")
    format: Literal["auto", "disk", "parquet", "imagefolder"] = "auto"
    image_column: str | None = Field(None, description="Default: 'image' or 'img', whichever exists.")
    label_column: str | None = Field(None, description="Default: 'labels' or 'label', whichever exists.")
    train_split: str = "train"
    eval_split: str | None = Field(None, description="Default: 'validation', else 'test'.")
    max_per_split: PositiveInt | None = Field(None, description="Keep at most this many rows per split (quick runs).")


class HFModelConfig(StrictModel):
    """ViTForImageClassification: from local weights, or a fresh configuration trained from scratch."""

    weights: str = Field(
        "none", description="'none' (train from scratch with the shape below), a local folder holding config.json "
        "and the weights (save_pretrained / a hub snapshot), or a hub model id such as "
        "google/vit-base-patch16-224-in21k, read from the Hugging Face cache (HF_HOME) and downloaded into it "
        "once when downloads are allowed (HF_HUB_OFFLINE=0).")
    image_size: PositiveInt = 224
    patch_size: PositiveInt = 16
    hidden_size: PositiveInt = 768
    num_hidden_layers: PositiveInt = 12
    num_attention_heads: PositiveInt = 12
    intermediate_size: PositiveInt = 3072

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


class HFTrainConfig(StrictModel):
    """The transformers Trainer's settings, and how many Ray Train workers run it."""

    epochs: PositiveInt = 3
    batch_size: PositiveInt = Field(32, description="Global batch size, split evenly across workers.")
    lr: PositiveFloat = 5e-5
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    num_workers: PositiveInt = 2
    cpus_per_worker: PositiveFloat = 1.0
    use_gpu: bool = False
    bf16: bool = Field(True, description="bf16 mixed precision on GPU (ignored on CPU).")
    max_failures: int = Field(2, ge=-1)
    num_to_keep: PositiveInt = 2
    seed: int = 0


class HFViTParams(StrictModel):
    """The ``workload`` section of an ``hf_vit`` spec."""

    run_name: str = Field("vit-hf", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    storage_path: SpecPath = "~/rayjobs-results"
    data: HFDataConfig
    model: HFModelConfig = Field(default_factory=HFModelConfig)
    train: HFTrainConfig = Field(default_factory=HFTrainConfig)
