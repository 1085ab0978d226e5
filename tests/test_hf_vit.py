"""The hf_vit workload: transformers Trainer inside Ray Train, on local Hugging Face datasets (extra ``hf``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import REPO_ROOT, read_metrics_csv, run_rayjobs, submit_spec
from tests.s3_server import aws_variables, create_bucket, object_keys

HF_BUCKET = "rayjobs-hf"
BEANS_CLASSES = ["angular_leaf_spot", "bean_rust", "healthy"]
TINY_VIT = ["workload.model.image_size=32", "workload.model.patch_size=8", "workload.model.hidden_size=32",
            "workload.model.num_hidden_layers=2", "workload.model.num_attention_heads=2",
            "workload.model.intermediate_size=64", "workload.train.batch_size=8", "workload.train.lr=0.001",
            "workload.train.num_workers=2", "workload.train.cpus_per_worker=1"]


def write_beans_like(root: Path, per_class: dict[str, int], as_parquet: bool = False) -> Path:
    """A DatasetDict laid out like the beans dataset (image, labels as a ClassLabel) on disk: the
    save_to_disk format, or the hub's Parquet shards (data/<split>-00000-of-00001.parquet)."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    splits = {}
    for split, count in per_class.items():
        images, labels = [], []
        for label in range(len(BEANS_CLASSES)):
            for _ in range(count):
                pixels = rng.integers(0, 60, (40, 40, 3), dtype=np.uint8)
                pixels[..., label] += 180  # each class its own colour
                images.append(Image.fromarray(pixels))
                labels.append(label)
        features = datasets.Features({"image": datasets.Image(), "labels": datasets.ClassLabel(names=BEANS_CLASSES)})
        splits[split] = datasets.Dataset.from_dict({"image": images, "labels": labels}, features=features)
    dataset = datasets.DatasetDict(splits)
    if as_parquet:
        (root / "data").mkdir(parents=True, exist_ok=True)
        for split, part in dataset.items():
            part.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    else:
        dataset.save_to_disk(str(root))
    return root


def test_a_hub_model_id_is_a_valid_weights_value():
    result = run_rayjobs("validate", "specs/vit-hf.yaml", "--set", "workload.model.weights=google/vit-base-patch16-224")
    assert result.returncode == 0, result.stderr


def _resolve_in_subprocess(hf_home: Path, hub_id: str, **env: str) -> subprocess.CompletedProcess[str]:
    # huggingface_hub reads HF_HOME when it is imported: a fresh interpreter sees this test's cache only.
    code = ("import sys\nfrom workloads.hf_vit.train import HFWorkloadError, resolve_hub_weights\n"
            "try:\n    print(resolve_hub_weights(sys.argv[1]))\n"
            "except HFWorkloadError as exc:\n    print(exc, file=sys.stderr); sys.exit(3)\n")
    variables = {**os.environ, "HF_HOME": str(hf_home), "PYTHONPATH": str(REPO_ROOT), **env}
    variables.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code, hub_id], capture_output=True, text=True, timeout=120,
                          env=variables, cwd=REPO_ROOT)


def test_a_hub_model_id_is_read_from_a_pre_seeded_cache(tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    from transformers import ViTConfig, ViTForImageClassification

    # The hub cache's own layout: models--<org>--<name>/snapshots/<revision>/, refs/main names the revision.
    entry = tmp_path / "hf" / "hub" / "models--example--tiny-vit"
    snapshot = entry / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=32)).save_pretrained(snapshot)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(snapshot.name)
    result = _resolve_in_subprocess(tmp_path / "hf", "example/tiny-vit", HF_HUB_OFFLINE="1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()) == snapshot


def test_a_hub_model_id_missing_from_the_cache_is_one_clear_message(tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    offline = _resolve_in_subprocess(tmp_path / "hf", "example/absent-vit", HF_HUB_OFFLINE="1")
    assert offline.returncode == 3, offline.stderr[-2000:]
    assert str(tmp_path / "hf" / "hub") in offline.stderr
    assert "downloads are off (HF_HUB_OFFLINE=1)" in offline.stderr
    assert "huggingface-cli download example/absent-vit" in offline.stderr
    assert "Traceback" not in offline.stderr
    # Downloads allowed, but the hub cannot be reached: a closed loopback port stands in for it.
    unreachable = _resolve_in_subprocess(tmp_path / "hf", "example/absent-vit", HF_HUB_OFFLINE="0",
                                         HF_ENDPOINT="http://127.0.0.1:9")
    assert unreachable.returncode == 3, unreachable.stderr[-2000:]
    assert "downloading it failed" in unreachable.stderr and "Traceback" not in unreachable.stderr


@pytest.mark.cluster
def test_vit_fine_tuning_from_scratch_on_a_saved_dataset(ray_cluster, ray_cluster_home, tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    data = write_beans_like(tmp_path / "beans", {"train": 16, "validation": 6})
    result = submit_spec(ray_cluster_home, "specs/vit-hf.yaml", f"workload.data.path={data}",
                         f"workload.storage_path={tmp_path / 'results'}", "workload.train.epochs=2", *TINY_VIT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    run_dir = tmp_path / "results" / "vit-hf-beans"
    rows = read_metrics_csv(run_dir)
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(0 <= r["val_accuracy"] <= 1 and r["val_loss"] > 0 for r in rows)
    assert (run_dir / "loss_curve.png").stat().st_size > 1000
    saved = list(run_dir.glob("checkpoint_*/checkpoint/model.safetensors"))
    assert saved, "each epoch's Ray checkpoint holds the transformers checkpoint"
    assert "Best checkpoint:" in result.stdout


@pytest.mark.cluster
def test_vit_fine_tuning_from_local_weights_on_parquet_shards_into_s3(ray_cluster, ray_cluster_home, s3_endpoint,
                                                                         tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    from transformers import ViTConfig, ViTForImageClassification

    data = write_beans_like(tmp_path / "beans-hub", {"train": 8, "test": 4}, as_parquet=True)
    pretrained = tmp_path / "vit-local"
    ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, num_labels=5)).save_pretrained(pretrained)
    # The run (checkpoints, metrics.csv, the loss curve) goes to object storage.
    create_bucket(s3_endpoint, HF_BUCKET)
    aws = [f"runtime_env.env_vars.{name}={value}" for name, value in aws_variables(s3_endpoint).items()]
    result = submit_spec(ray_cluster_home, "specs/vit-hf.yaml", f"workload.data.path={data}",
                         f"workload.model.weights={pretrained}", "workload.run_name=from-local",
                         f"workload.storage_path=s3://{HF_BUCKET}/runs", "workload.train.epochs=1",
                         "workload.train.num_workers=1", "workload.train.batch_size=8", *aws)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "24 train and 12 eval images" in result.stdout
    keys = object_keys(s3_endpoint, HF_BUCKET, "runs/from-local/")
    assert "runs/from-local/metrics.csv" in keys and "runs/from-local/loss_curve.png" in keys, keys
    assert any(key.endswith("/checkpoint/config.json") and "/checkpoint_" in key for key in keys), keys
    assert f"Best checkpoint: s3://{HF_BUCKET}/runs/from-local/checkpoint_" in result.stdout
