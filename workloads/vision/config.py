"""Parameters of the vision workload, as written in a spec's ``workload`` section.

This module imports only pydantic so that rayjobs can validate a spec on a laptop
without torch or ray.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from jobs.paths import SpecPath, SpecStoragePath
from jobs.strict import StrictModel
from jobs.workload_contract import Demand, WorkloadNeeds
from workloads.params import LocalWeights
from workloads.ray_train.config import RayTrainSettings, TrainingRunParams, run_name_field

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

# Class names of the datasets whose class list is fixed by the data itself.
MNIST_CLASSES = [str(digit) for digit in range(10)]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Sources that hold decoded pixel arrays of a fixed size; they are written to Parquet
# as raw uint8 arrays at that size instead of being re-encoded as JPEG.
ARRAY_SOURCES = {"mnist": (28, MNIST_CLASSES), "cifar10": (32, CIFAR10_CLASSES)}
# What every epoch reports that a sweep can choose by (the training loop reports these and more).
SWEEP_METRICS = ("val_accuracy", "val_loss", "train_loss")

Stage = Literal["preprocess", "train", "infer"]


class DataConfig(StrictModel):
    """Where images come from and how they are turned into Parquet."""

    source: Literal["food101", "hf_parquet", "imagefolder", "synthetic", "mnist", "cifar10"] = Field(
        "synthetic", description="Input format: official Food-101 layout, Hugging Face food101 Parquet shards, "
        "an ImageFolder tree, generated images (offline), torchvision's MNIST IDX files, or CIFAR-10 "
        "(python batches or Parquet shards)."
    )
    root: SpecPath | None = Field(None, description="Directory holding the source data (not used by 'synthetic').")
    download: bool = Field(False, description="mnist only: let torchvision download the IDX files into root "
                           "when they are missing (needs internet).")
    classes: list[str] | None = Field(
        None,
        min_length=2,
        description="Class names to keep, in label order. Default: the ten Food-101-Lite classes for photo "
        "sources, all ten classes for mnist and cifar10. Food-101 folder names or display names.",
    )
    max_per_class: PositiveInt | None = Field(None, description="Cap on images per class and split.")
    image_size: PositiveInt | None = Field(
        None, description="Side of the square images written to Parquet (resize + center crop). Default 224; "
        "mnist (28) and cifar10 (32) keep their native size."
    )
    val_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share of images held out for validation when the source has no split."
    )
    synthetic_per_class: PositiveInt = Field(120, description="Images generated per class by the 'synthetic' source.")
    output_dir: SpecStoragePath = Field(
        "~/rayjobs-data/food101-lite", description="Where the Parquet dataset is written (and read by training): "
        "a local folder or s3://BUCKET/PREFIX."
    )
    jpeg_quality: int = Field(90, ge=1, le=100, description="JPEG quality of the images re-encoded for Parquet "
                              "(photo sources; mnist and cifar10 keep raw pixels).")
    rows_per_file: PositiveInt = Field(256, description="Rows per Parquet row group; small groups stream well.")
    seed: int = Field(0, description="Seed of every random choice of preprocessing: the validation hold-out, "
                      "max_per_class sampling, row order and the 'synthetic' images.")
    force: bool = Field(False, description="Preprocess again even if the same inputs and settings were done before.")

    @model_validator(mode="after")
    def _source_defaults(self) -> "DataConfig":
        if self.source != "synthetic" and self.root is None:
            raise ValueError(f"data.root is required for source {self.source!r}: point it at the local copy of the data")
        if self.download and self.source != "mnist":
            raise ValueError(f"data.download is only for source 'mnist'; {self.source!r} data must already be on disk")
        native = ARRAY_SOURCES.get(self.source)
        if native is None:
            self.image_size = self.image_size or 224
            self.classes = self.classes if self.classes is not None else list(FOOD101_LITE_CLASSES)
        else:
            size, classes = native
            if self.image_size not in (None, size):
                raise ValueError(f"{self.source} images are {size}x{size}; data.image_size cannot change that "
                                 f"(leave it out or set {size})")
            self.image_size = size
            self.classes = self.classes if self.classes is not None else list(classes)
        return self


class ViTConfig(StrictModel):
    """Shape of torchvision's VisionTransformer (the defaults are the CIFAR-10 recipe's)."""

    patch_size: PositiveInt = Field(4, description="Side of the square patches each image is cut into; must "
                                    "divide data.image_size.")
    num_layers: PositiveInt = Field(12, description="Transformer encoder layers.")
    num_heads: PositiveInt = Field(8, description="Attention heads per layer; must divide hidden_dim.")
    hidden_dim: PositiveInt = Field(384, description="Width of the transformer (embedding size).")
    mlp_dim: PositiveInt = Field(768, description="Width of each layer's feed-forward block.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout rate inside the encoder.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ViTConfig":
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim ({self.hidden_dim}) must be a multiple of num_heads ({self.num_heads})")
        return self


# The recipe's batch on CPU, which its learning rate and schedule were tuned at (lr_batch_size), and the batch per
# GPU worker: at 224 px an H200 ran the bare ResNet-18 step 36 % busy at batch 64 and 100 % at 256 (docs/benchmarks.md).
CPU_BATCH = 64
GPU_BATCH_PER_WORKER = 256

# Images of a worker's share of the batch under which batch norm's statistics of that share alone are too noisy:
# sync_batch_norm and batch_norm_recalibration act below it.
SMALL_WORKER_SHARE = 16


class TrainConfig(RayTrainSettings):
    """Distributed training with Ray Train's TorchTrainer."""

    model: Literal["resnet18", "vit"] = Field("resnet18", description="torchvision ResNet-18, or a "
                                              "VisionTransformer shaped by train.vit.")
    vit: ViTConfig = Field(default_factory=lambda: ViTConfig(), description="Shape of the VisionTransformer "
                           "(model: vit only).")
    weights: LocalWeights = Field(
        "none", description="'none' (random initialization), 'imagenet' (torchvision's published ImageNet "
        "weights, resnet18 only, read from torch.hub's cache and downloaded into it once when the cluster has "
        "internet) or a path to a state dict of the same torchvision model.")
    ingest: Literal["torch", "ray_data"] = Field(
        "torch", description="How batches reach the workers: 'torch' reads Parquet row groups in a DataLoader "
        "(prepare_data_loader); 'ray_data' streams them from Ray Data (read_parquet -> map_batches on CPU "
        "tasks -> get_dataset_shard)."
    )
    augment: Literal["auto", "crop_flip", "shift_flip", "shift", "none"] = Field(
        "auto", description="Training augmentation: random resized crop + flip, 4-pixel shift + flip, shift "
        "only, or none. 'auto' picks what suits the source: crop_flip for photos, shift_flip for cifar10, "
        "shift for mnist (digits must not be mirrored)."
    )
    data_cpus: float = Field(1.0, ge=0, description="ray_data only: CPUs reserved by each decode/augment task.")
    prefetch_batches: int = Field(2, ge=0, description="ray_data only: batches prepared ahead of the model.")
    epochs: PositiveInt = Field(10, description="Passes over the training split; raise it and rerun the same "
                                "run_name to train further.")
    batch_size: PositiveInt | Literal["auto"] = Field(
        "auto", description="Global batch size, split evenly across workers; the learning rate follows it (lr). "
        f"auto: {CPU_BATCH} on CPU, {GPU_BATCH_PER_WORKER} per worker with use_gpu (a ResNet-18 step of 64 images "
        "keeps a GPU about a third busy).")
    # Measured on real Food-101 photos (docs/vision.md, "The training recipe"): SGD at lr 0.1 blew up in
    # its first epoch at 64 and at 224 px, while AdamW with the settings below learned at both sizes.
    optimizer: Literal["sgd", "adamw"] = Field(
        "adamw", description="AdamW (the default: stable from scratch and when fine-tuning) or SGD with "
        "Nesterov momentum.")
    lr: PositiveFloat | None = Field(
        None, description="Peak learning rate for a global batch of lr_batch_size images; other batch sizes "
        "scale it (see lr_scaling). Default: 0.002 for adamw and 0.1 for sgd from scratch, a quarter of that "
        "when fine-tuning pretrained weights.")
    lr_batch_size: PositiveInt = Field(64, description="The global batch size that lr is meant for.")
    lr_scaling: Literal["auto", "linear", "sqrt", "none"] = Field(
        "auto", description="How the learning rate follows batch_size / lr_batch_size: linear (SGD's rule), "
        "sqrt (Adam's rule) or none. 'auto': sqrt for adamw, linear for sgd.")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd only: momentum (Nesterov).")
    weight_decay: float | None = Field(
        None, ge=0, description="Weight decay of weights (never of biases and norm layers). Default: 0.05 "
        "for adamw (decoupled), 5e-4 for sgd.")
    lr_schedule: Literal["cosine", "step", "constant"] = Field(
        "cosine", description="After the warm-up: cosine decay to zero, /10 at half and three quarters, or flat.")
    warmup_epochs: float | None = Field(
        None, ge=0, description="Linear warm-up, in epochs (fractions allowed; counted in optimizer steps). "
        "Default: a fifth of the epochs, at most 5.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Cross-entropy label smoothing.")
    # Measured (docs/vision.md): with AdamW, whose steps are bounded by the learning rate, zeroed
    # residual gammas were still small after 12 epochs, and the 64 px dev set lost 0.05 accuracy.
    zero_init_residual: bool | None = Field(
        None, description="resnet18 from scratch: start the last BatchNorm of every residual block at zero, "
        "so each block begins as the identity. Default: true for sgd (Goyal et al.), false for adamw. True "
        "steadied very small runs (a few dozen steps, 8 images per worker) at 224 px.")
    grad_clip_norm: PositiveFloat | None = Field(
        5.0, description="Clip the global gradient norm to this before each step (none: no clipping).")
    batch_norm_recalibration: Literal["auto"] | NonNegativeInt = Field(
        "auto", description="Before each evaluation, estimate every batch-norm layer's statistics again with the "
        "epoch's final weights, over this many of each worker's last training batches, averaged across "
        "workers (0: never). auto: 32 when a worker's share of batch_size is under 16 images, where the "
        "statistics gathered step by step from so few images misdescribe the model; 0 otherwise.")
    sync_batch_norm: Literal["auto"] | bool = Field(
        "auto", description="With several workers, normalize by the batch norm moments of the whole global batch "
        "(an all-reduce per layer and step, on CPU too) instead of each worker's share. auto: when a worker's "
        "share of batch_size is under 16 images, where a share's own moments are too noisy to normalize by.")
    freeze_epochs: int = Field(
        0, ge=0, description="With pretrained weights: train only the new classification head for this "
        "many epochs before the whole network.")
    # auto, not true: a bare ResNet-18 step at 64 px ran 1.56x faster under bf16 autocast on an AMD EPYC with
    # avx512_bf16 (issue 31), but CPUs without bf16 instructions emulate it and run slower than in fp32.
    amp: Literal["auto"] | bool = Field(
        "auto", description="bf16 autocast of the forward pass and the loss (the weights, the optimizer and "
        "batch-norm statistics stay fp32), in training and batch inference. auto: on GPU, and on CPUs whose "
        "flags show avx512_bf16 or amx_bf16, decided on each worker; true: on every CPU too (emulated, so "
        "slower, where the CPU has no bf16 instructions); false: fp32 throughout.")
    channels_last: bool = Field(True, description="channels_last memory format for the model and its inputs, "
                                "on GPU and CPU (oneDNN's convolutions run faster in it).")
    # Measured (docs/benchmarks.md): two 1-CPU workers at 64 px spent about a sixth of each step in
    # gloo's fp32 all-reduce; bf16 halves the bytes, and the dev-set accuracy stayed within seed
    # noise (0.390 against 0.372 at the same seed).
    gradient_allreduce: Literal["bf16", "fp32"] = Field(
        "bf16", description="Precision in which DDP averages gradients between workers: bf16 sends half the "
        "bytes (the weights and optimizer stay fp32); fp32 sends them exactly.")
    decode: Literal["auto", "loader", "device"] = Field(
        "auto", description="ingest: torch only. Where the training and validation JPEGs are decoded and "
        "augmented: in the DataLoader (loader_workers processes, or the training process), or on the worker's "
        "device (nvJPEG on a GPU), the loader then only reading the files. auto: device on a GPU, loader on "
        "CPU. Datasets of raw pixels (mnist, cifar10) have nothing to decode.")
    loader_workers: int = Field(0, ge=0, description="DataLoader worker processes per training worker. On CPU "
                                "at most cpus_per_worker - 1: each needs a CPU beside the training process.")
    seed: int = Field(0, description="Seed of the weights' initialization and of the data shuffling.")

    @model_validator(mode="after")
    def _weights_exist_for_model(self) -> "TrainConfig":
        if self.uses_imagenet_weights and self.model != "resnet18":
            raise ValueError("weights 'imagenet' is available for model resnet18 only; give a path to a state dict "
                             "of the configured VisionTransformer, or 'none'")
        if self.decode == "device" and self.ingest == "ray_data":
            raise ValueError("decode: device decodes in the training worker's DataLoader path (ingest: torch); "
                             "with ingest: ray_data the data pipeline's tasks decode (set decode: auto or loader)")
        if self.freeze_epochs and not self.fine_tunes:
            raise ValueError("freeze_epochs holds pretrained weights still while the new head trains; with "
                             "weights 'none' there is nothing to hold (set weights, or freeze_epochs: 0)")
        return self

    @property
    def uses_imagenet_weights(self) -> bool:
        """``weights: imagenet``: torchvision's published weights of the model."""
        return self.weights.strip().lower() == "imagenet"

    @property
    def fine_tunes(self) -> bool:
        """Training starts from pretrained weights (ImageNet or a state dict), not from random ones."""
        return self.weights.strip().lower() not in ("", "none")

    @property
    def global_batch(self) -> int:
        """``batch_size`` resolved: ``auto`` is the device's batch, per GPU worker where the layout is known."""
        if self.batch_size != "auto":
            return self.batch_size
        if self.use_gpu:
            return GPU_BATCH_PER_WORKER * (self.num_workers if isinstance(self.num_workers, int) else 1)
        return CPU_BATCH

    def with_resolved_batch(self) -> "TrainConfig":
        """A copy whose ``batch_size`` is a number (:attr:`global_batch`): what the workers and the record see."""
        return self if self.batch_size != "auto" else self.model_copy(update={"batch_size": self.global_batch})

    def peak_lr(self) -> float:
        """The learning rate after warm-up: ``lr`` (or the recipe's default) scaled to ``batch_size``."""
        base = self.lr
        if base is None:
            base = 0.002 if self.optimizer == "adamw" else 0.1
            if self.fine_tunes:
                # Pretrained features are already good; large steps would wash them out.
                base /= 4
        rule = self.lr_scaling if self.lr_scaling != "auto" else ("sqrt" if self.optimizer == "adamw" else "linear")
        ratio = self.global_batch / self.lr_batch_size
        return base * {"linear": ratio, "sqrt": ratio ** 0.5, "none": 1.0}[rule]

    def zeroes_residuals(self) -> bool:
        """Whether a fresh ResNet starts with zeroed residual branches (``zero_init_residual`` resolved)."""
        if self.zero_init_residual is None:
            return self.optimizer == "sgd"
        return self.zero_init_residual

    def decay(self) -> float:
        """Weight decay of weights (biases and norm layers get none)."""
        if self.weight_decay is not None:
            return self.weight_decay
        return 0.05 if self.optimizer == "adamw" else 5e-4

    def recalibration_batches(self, world_size: int) -> int:
        """How many of a worker's last training batches re-estimate batch-norm statistics before evaluation."""
        if self.batch_norm_recalibration != "auto":
            return self.batch_norm_recalibration
        return 32 if self.global_batch // max(1, world_size) < SMALL_WORKER_SHARE else 0

    def syncs_batch_norm(self, world_size: int) -> bool:
        """Whether batch norm normalizes by the global batch's moments (``sync_batch_norm`` resolved)."""
        if world_size < 2:
            return False
        if self.sync_batch_norm != "auto":
            return self.sync_batch_norm
        return self.global_batch // world_size < SMALL_WORKER_SHARE

    def decodes_on_device(self, device_type: str, encoding: str) -> bool:
        """Whether the training worker decodes JPEGs on its device (``decode`` resolved for it)."""
        if encoding != "jpeg" or self.ingest != "torch":
            return False
        if self.decode == "auto":
            return device_type == "cuda"
        return self.decode == "device"

    def warmup(self) -> float:
        """Warm-up length in epochs."""
        return self.warmup_epochs if self.warmup_epochs is not None else min(5.0, self.epochs / 5)


# About 12,000 images of 64 px or 1,000 of 224 px: what one process on 2 cores classifies in the time a pool of
# actors takes to start and then make up for it (see InferConfig.classifies_in_process).
IN_PROCESS_PIXELS = 50_000_000


class InferConfig(StrictModel):
    """Batch inference over the validation split with the best checkpoint."""

    batch_size: PositiveInt = Field(64, description="Images per batch handed to a model actor.")
    num_actors: PositiveInt | Literal["auto"] = Field(
        "auto", description="Most model actors in the pool (it starts with as many as the cluster fits now). "
        "auto: a split small enough that starting actors would cost more than they save is classified in the "
        "job's own process, with its node's free CPUs; a larger one by as many actors as the cluster fits.")
    cpus_per_actor: PositiveFloat = Field(1.0, description="CPUs reserved by each actor; also its torch threads.")
    use_gpu: bool = Field(False, description="Give each actor one GPU.")

    def classifies_in_process(self, images: int, pixels_per_image: int, cluster_over_node_cpus: float) -> bool:
        """Whether ``auto`` classifies ``images`` in the job's own process instead of an actor pool.

        A pool pays for its start (actor processes importing torch and loading the model: 4.3 s on 2 cores)
        and then ran at 1.21x one process of the same CPUs (``docs/benchmarks.md``): it wins only on a split
        of more pixels than one process classifies in about 25 times that start. Where the cluster has more
        CPUs than the job's node (``cluster_over_node_cpus``), the pool also has more to run on.
        """
        if self.num_actors != "auto" or self.use_gpu:
            return False
        return images * pixels_per_image <= IN_PROCESS_PIXELS / max(1.0, cluster_over_node_cpus)

    def pool_size(self, cluster_cpus: float) -> int:
        """Most actors of the pool: ``num_actors``, or with ``auto`` as many as the cluster's CPUs hold."""
        if self.num_actors == "auto":
            return max(1, int(cluster_cpus // self.cpus_per_actor))
        return self.num_actors


class VisionParams(TrainingRunParams):
    """The ``workload`` section of a vision spec (``kind: vision``; the kind itself is read by rayjobs)."""

    stages: list[Stage] = Field(default_factory=lambda: ["preprocess", "train", "infer"], min_length=1,
                                description="Stages to run, in order: preprocess (images to Parquet), train, "
                                "infer (batch predictions on the validation split).")
    run_name: str = run_name_field("food101-lite")
    data: DataConfig = Field(default_factory=DataConfig, description="Where the images come from and how they "
                             "are written to Parquet.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Model, recipe and Ray Train workers of "
                               "the train stage.")
    infer: InferConfig = Field(default_factory=InferConfig, description="Actor pool of the infer stage.")

    @model_validator(mode="after")
    def _patches_fit(self) -> "VisionParams":
        if self.train.model == "vit" and self.data.image_size % self.train.vit.patch_size:
            raise ValueError(f"train.vit.patch_size ({self.train.vit.patch_size}) must divide data.image_size "
                             f"({self.data.image_size})")
        return self

    def needs(self) -> WorkloadNeeds:
        """The job's program, the locations every node reads or writes, and the workers or actors of the
        train and infer stages among ``stages`` (see :mod:`jobs.workload_contract`)."""
        shared: dict[str, str] = {}
        if "train" in self.stages or "infer" in self.stages:
            # Ray Train's workers write the run there, the inference actors read its checkpoint.
            shared["storage_path"] = str(self.storage_path)
        shared["data.output_dir"] = str(self.data.output_dir)
        demands = []
        if "train" in self.stages:
            demands.append(self.train.demand("training", "train"))
        if "infer" in self.stages:
            actors = 1 if self.infer.num_actors == "auto" else self.infer.num_actors  # auto: the least it runs on
            demands.append(Demand("inference", count=actors, cpus=float(self.infer.cpus_per_actor),
                                  gpus=1 if self.infer.use_gpu else 0))
        return WorkloadNeeds(entrypoint_module="workloads.vision", shared_locations=shared, demands=tuple(demands),
                             run_location=self.run_location, sweepable=("train",), metrics=SWEEP_METRICS,
                             epochs=self.train.epochs)
