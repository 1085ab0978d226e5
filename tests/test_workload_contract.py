"""What each built-in workload declares to the client through ``needs()``: no Ray, no torch, as on a laptop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.loader import load_spec
from jobs.workload_contract import Demand, WorkloadNeeds, workload_needs
from tests.support.cli import REPO_ROOT
from workloads.hello import HelloParams
from workloads.hf_vit.config import HFViTParams
from workloads.vision.config import VisionParams

TRAINING_RESOURCES = "train.resources_per_worker"


def test_vision_declares_its_program_its_shared_locations_and_both_phases(tmp_path):
    params = VisionParams.model_validate({
        "storage_path": str(tmp_path / "runs"), "data": {"output_dir": "s3://bucket/data/"},
        "train": {"num_workers": 3, "cpus_per_worker": 2, "use_gpu": True, "resources_per_worker": {"accel": 1}},
        "infer": {"num_actors": 4, "cpus_per_actor": 1.5, "use_gpu": False},
    })
    needs = workload_needs(params)
    assert needs.entrypoint_module == "workloads.vision"
    # The values as validated: the trailing slash of the URI is gone.
    assert needs.shared_locations == {"storage_path": str(tmp_path / "runs"), "data.output_dir": "s3://bucket/data"}
    assert needs.demands == (Demand("training", 3, 2.0, 1, {"accel": 1.0}, TRAINING_RESOURCES),
                             Demand("inference", 4, 1.5, 0))


@pytest.mark.parametrize("stages, phases", [
    (["preprocess"], ()),
    (["train"], ("training",)),
    (["infer"], ("inference",)),
    (["preprocess", "train", "infer"], ("training", "inference")),
])
def test_vision_asks_for_the_phases_of_its_stages_only(stages, phases):
    needs = VisionParams.model_validate({"stages": stages}).needs()
    assert tuple(demand.phase for demand in needs.demands) == phases


def test_inference_on_gpus_asks_one_per_actor():
    needs = VisionParams.model_validate({"stages": ["infer"], "infer": {"use_gpu": True, "num_actors": 2}}).needs()
    assert needs.demands == (Demand("inference", 2, 1.0, 1),)


def test_a_preprocess_only_job_shares_its_dataset_folder_and_no_run_folder(tmp_path):
    needs = VisionParams.model_validate({"stages": ["preprocess"], "data": {"output_dir": str(tmp_path)}}).needs()
    assert needs.shared_locations == {"data.output_dir": str(tmp_path)}


def test_paths_in_a_spec_are_declared_resolved_against_the_spec(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: relative\nentrypoint: python -m workloads.vision\nworkload:\n  kind: vision\n"
                    "  storage_path: runs\n  data:\n    output_dir: data/out\n")
    needs = workload_needs(load_spec(spec, []).workload)
    assert needs.shared_locations == {"storage_path": str(tmp_path / "runs"),
                                      "data.output_dir": str(tmp_path / "data" / "out")}


def test_hf_vit_declares_its_run_its_dataset_and_local_weights(tmp_path):
    weights = tmp_path / "vit-local"
    weights.mkdir()
    params = HFViTParams.model_validate({
        "storage_path": "s3://bucket/runs", "data": {"path": str(tmp_path / "beans")},
        "model": {"weights": str(weights)}, "train": {"num_workers": 2, "cpus_per_worker": 1},
    })
    needs = params.needs()
    assert needs.entrypoint_module == "workloads.hf_vit"
    assert needs.shared_locations == {"storage_path": "s3://bucket/runs", "data.path": str(tmp_path / "beans"),
                                      "model.weights": str(weights)}
    assert needs.demands == (Demand("training", 2, 1.0, 0, {}, TRAINING_RESOURCES),)


@pytest.mark.parametrize("weights", ["none", "google/vit-base-patch16-224-in21k"])
def test_hf_vit_weights_from_the_hub_cache_or_none_are_no_shared_location(tmp_path, weights):
    params = HFViTParams.model_validate({"data": {"path": str(tmp_path)}, "model": {"weights": weights}})
    assert "model.weights" not in params.needs().shared_locations


def test_hello_declares_its_program_and_nothing_to_size():
    assert workload_needs(HelloParams()) == WorkloadNeeds(entrypoint_module="workloads.hello")


@pytest.mark.parametrize("spec", sorted((REPO_ROOT / "specs").glob("*.yaml")), ids=lambda path: path.name)
def test_every_example_spec_runs_the_module_its_workload_declares(spec: Path):
    overrides = ["workload.data.path=/tmp"] if spec.name == "vit-hf.yaml" else []
    loaded = load_spec(spec, overrides)
    assert loaded.spec.entrypoint == f"python -m {workload_needs(loaded.workload).entrypoint_module}"


def test_the_parameter_models_load_without_ray_torch_or_pyarrow():
    code = ("import sys\nimport workloads.hello, workloads.hf_vit.config, workloads.vision.config\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch', 'pyarrow', 'numpy')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
