"""The hf_vit workload: transformers Trainer inside Ray Train, on local Hugging Face datasets (extra ``hf``)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import REPO_ROOT, run_rayjobs
from tests.support.s3_server import create_bucket, object_keys, s3_client

HF_BUCKET = "rayjobs-hf"
BEANS_CLASSES = ["angular_leaf_spot", "bean_rust", "healthy"]


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


@pytest.mark.processes
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


def test_importing_the_workload_leaves_the_environment_alone():
    # The offline defaults are set by the functions that load the Hugging Face libraries, not on import.
    code = ("import os\nbefore = dict(os.environ)\nimport workloads.hf_vit.__main__, workloads.hf_vit.train\n"
            "print(sorted(set(os.environ.items()) ^ set(before.items())))\n")
    env = {key: value for key, value in os.environ.items() if not key.endswith("_OFFLINE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.processes
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


@pytest.mark.processes
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


def test_both_dataset_layouts_are_read_with_their_splits_labels_and_classes(tmp_path):
    pytest.importorskip("datasets", reason="the hf extra (transformers, datasets) is not installed")
    from workloads.hf_vit.config import HFDataConfig
    from workloads.hf_vit.train import dataset_splits

    saved = write_beans_like(tmp_path / "saved", {"train": 3, "validation": 2})
    shards = write_beans_like(tmp_path / "shards", {"train": 3, "test": 2}, as_parquet=True)
    for root in (saved, shards):
        train, evaluation, image_column, label_column, classes = dataset_splits(HFDataConfig(path=root))
        assert (len(train), len(evaluation)) == (9, 6)
        assert (image_column, label_column, classes) == ("image", "labels", BEANS_CLASSES)
        assert sorted(train[label_column]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_weights_none_builds_a_fresh_vit_of_the_configured_shape():
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    from workloads.hf_vit.config import HFModelConfig
    from workloads.hf_vit.train import build_model

    model, processor = build_model(HFModelConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=64), BEANS_CLASSES)
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_labels) == (32, 2, 3)
    assert model.config.id2label == dict(enumerate(BEANS_CLASSES))
    assert processor.size == {"height": 32, "width": 32}


# A value no fresh ViT starts with (layer norms start at 1.0) and a few fine-tuning steps cannot reach.
# Named by its ending: transformers 5 names it vit.layers.0.… in memory and vit.encoder.layer.0.… on disk.
MARKED_NORM = "0.layernorm_before.weight"
MARK = 2.5


def test_vit_fine_tuned_from_local_weights_learns_writes_its_run_to_s3_and_to_mlflow(
        workload_ray, s3_endpoint, aws_env, mlflow_tracking_server, monkeypatch, capsys, tmp_path):
    # The spec's stages on the in-process Ray, as its job's entry point runs them: submitting and following a
    # job is the same for every workload, and the CLI tests prove it on the session's cluster.
    pytest.importorskip("transformers", reason="the hf extra (transformers, datasets) is not installed")
    import torch
    from safetensors.torch import load as load_safetensors
    from transformers import ViTConfig, ViTForImageClassification

    from rayjobs_agent.wire import TRACKING_ENV_VAR
    from jobs.loader import load_spec
    from workloads.hf_vit.__main__ import require_hf_extra
    from workloads.hf_vit.train import run
    from workloads.storage import check_storage, storage_path

    data = write_beans_like(tmp_path / "beans-hub", {"train": 24, "test": 8}, as_parquet=True)
    pretrained = tmp_path / "vit-local"
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64, num_labels=5))
    with torch.no_grad():
        next(value for name, value in model.named_parameters() if name.endswith(MARKED_NORM)).fill_(MARK)
    model.save_pretrained(pretrained)
    # The run (checkpoints, metrics.csv, the loss curve) goes to object storage.
    create_bucket(s3_endpoint, HF_BUCKET)
    experiment = f"hf-{tmp_path.name}"
    # What the job's environment holds (rayjobs sets it from the spec's tracking block).
    monkeypatch.setenv(TRACKING_ENV_VAR, json.dumps({"mlflow": {"tracking_uri": mlflow_tracking_server.uri,
                                                                "experiment": experiment}}))
    loaded = load_spec(REPO_ROOT / "specs" / "vit-hf.yaml", [
        f"workload.data.path={data}", f"workload.model.weights={pretrained}", "workload.run_name=from-local",
        f"workload.storage_path=s3://{HF_BUCKET}/runs", "workload.train.epochs=3", "workload.train.num_workers=1",
        "workload.train.cpus_per_worker=1", "workload.train.batch_size=8", "workload.train.lr=0.002",
        "workload.train.warmup_ratio=0"])
    params = loaded.workload
    require_hf_extra()
    check_storage(storage_path(params.storage_path), "storage_path")
    run(params)
    printed = capsys.readouterr().out
    assert "72 train and 24 eval images" in printed
    keys = object_keys(s3_endpoint, HF_BUCKET, "runs/from-local/")
    assert {"runs/from-local/metrics.csv", "runs/from-local/loss_curve.png",
            "runs/from-local/tensorboard/events.out.tfevents.rayjobs"} <= set(keys), keys
    best = re.search(rf"Best checkpoint: s3://{HF_BUCKET}/(runs/from-local/checkpoint_\S+/checkpoint) ", printed)
    assert best, printed[-3000:]

    metrics = s3_client(s3_endpoint).get_object(Bucket=HF_BUCKET, Key="runs/from-local/metrics.csv")["Body"].read()
    rows = list(csv.DictReader(io.StringIO(metrics.decode())))
    assert [int(row["epoch"]) for row in rows] == [1, 2, 3]
    # Three colour classes, 24 evaluation images: chance is 1/3.
    assert float(rows[-1]["val_accuracy"]) >= 0.75, rows

    weights = s3_client(s3_endpoint).get_object(Bucket=HF_BUCKET, Key=f"{best[1]}/model.safetensors")["Body"].read()
    tuned = load_safetensors(weights)
    marked = next(value for name, value in tuned.items() if name.endswith(MARKED_NORM))
    # Fine-tuned from the local folder, not a fresh model of the same shape: its marked norm is still near MARK.
    assert torch.allclose(marked, torch.full_like(marked, MARK), atol=0.2), marked
    assert tuned["classifier.weight"].shape == (3, 32)  # a new head for the three classes

    # One MLflow run for the training run, each epoch's metrics at its step (one worker: the reporter is the
    # Train controller's, the same for any number of workers).
    client = mlflow_tracking_server.client()
    (tracked,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert tracked.info.status == "FINISHED" and tracked.data.tags["rayjobs.run_dir"] == f"s3://{HF_BUCKET}/runs/from-local"
    assert tracked.data.params["train.num_workers"] == "1" and tracked.data.params["model.weights"] == str(pretrained)
    history = client.get_metric_history(tracked.info.run_id, "eval_accuracy")
    assert [(point.step, point.value) for point in history] == [
        (int(row["epoch"]), pytest.approx(float(row["val_accuracy"]))) for row in rows]
    assert {artifact.path for artifact in client.list_artifacts(tracked.info.run_id)} >= {"metrics.csv",
                                                                                           "loss_curve.png"}
