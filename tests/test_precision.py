"""Precision of the vision workload: bf16 autocast or fp32, chosen from the worker's CPU flags and ``train.amp``,
and one real training step, evaluation and inference under each (fast tier: no Ray)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from workloads.ray_train.precision import Precision, agreed_precision, choose_precision, cpu_bf16_flags

# Trimmed /proc/cpuinfo texts: an AMD EPYC (Zen 4) with avx512_bf16, a Sapphire Rapids with AMX, and an AVX2
# CPU whose "vmx flags" line must not be read as its flags.
EPYC_ZEN4 = """processor\t: 0
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\nvmx flags\t: vnmi avx512_bf16_looking_name\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\n"


def test_the_cpu_flags_of_native_bf16_are_read_from_cpuinfo():
    assert cpu_bf16_flags(EPYC_ZEN4) == ["avx512_bf16"]
    assert cpu_bf16_flags(SAPPHIRE_RAPIDS) == ["amx_bf16"]
    assert cpu_bf16_flags(AVX2_ONLY) == []
    assert cpu_bf16_flags(ARM) == [] and cpu_bf16_flags("") == []


def test_auto_takes_bf16_on_a_cpu_with_bf16_instructions_and_fp32_elsewhere():
    chosen = choose_precision("auto", "cpu", EPYC_ZEN4)
    assert chosen.autocast and chosen.name == "bf16"
    assert chosen.line() == "precision: bf16 autocast (CPU has avx512_bf16)"
    assert choose_precision("auto", "cpu", SAPPHIRE_RAPIDS).line() == "precision: bf16 autocast (CPU has amx_bf16)"

    plain = choose_precision("auto", "cpu", AVX2_ONLY)
    assert not plain.autocast and plain.name == "fp32"
    assert plain.line() == "precision: fp32 (CPU has neither avx512_bf16 nor amx_bf16)"
    assert choose_precision("auto", "cpu", "").name == "fp32", "no /proc/cpuinfo (macOS): fp32"


def test_amp_false_forces_fp32_and_amp_true_forces_bf16_on_any_cpu():
    assert choose_precision(False, "cpu", EPYC_ZEN4) == Precision(False, "amp: false")
    assert choose_precision(True, "cpu", EPYC_ZEN4).line() == "precision: bf16 autocast (CPU has avx512_bf16)"
    emulated = choose_precision(True, "cpu", AVX2_ONLY)
    assert emulated.autocast and "emulates" in emulated.reason


def test_a_gpu_runs_bf16_autocast_as_before_whatever_the_cpu():
    assert choose_precision("auto", "cuda", AVX2_ONLY) == Precision(True, "GPU")
    assert choose_precision(True, "cuda", AVX2_ONLY).autocast
    assert not choose_precision(False, "cuda", EPYC_ZEN4).autocast


def test_auto_keeps_resnet_in_fp32_where_its_bf16_gradients_break():
    from workloads.vision.config import TrainConfig
    from workloads.vision.training.recipe import training_precision

    auto = TrainConfig()
    kept = training_precision(auto, 16, 16, "cpu", EPYC_ZEN4)
    assert kept.name == "fp32"
    assert kept.line() == ("precision: fp32 (CPU has avx512_bf16, but at 16 px its bf16 convolutions give "
                           "ResNet-18 non-finite gradients; amp: true forces bf16)")
    assert training_precision(auto, 17, 17, "cpu", EPYC_ZEN4).name == "bf16"
    assert training_precision(TrainConfig(amp=True), 16, 16, "cpu", EPYC_ZEN4).name == "bf16", "asked for"
    assert training_precision(auto, 16, 16, "cuda", EPYC_ZEN4).name == "bf16", "a GPU's kernels are others"
    assert training_precision(TrainConfig(model="vit"), 16, 16, "cpu", EPYC_ZEN4).name == "bf16"
    assert training_precision(auto, 16, 16, "cpu", AVX2_ONLY) == choose_precision("auto", "cpu", AVX2_ONLY)


def test_train_amp_is_auto_by_default_and_takes_only_auto_true_or_false():
    from pydantic import ValidationError

    from workloads.vision.config import TrainConfig

    assert TrainConfig().amp == "auto"
    assert TrainConfig(amp=False).amp is False and TrainConfig(amp=True).amp is True
    with pytest.raises(ValidationError):
        TrainConfig(amp="sometimes")


def test_ranks_agree_on_fp32_when_any_of_them_lacks_bf16(monkeypatch):
    import torch.distributed as dist

    bf16, fp32 = Precision(True, "CPU has avx512_bf16"), Precision(False, "CPU has neither")

    def gathered(*ranks):
        def all_gather_object(out, own):  # what each rank would hand in, this rank's at its place
            out[:] = [(choice.autocast, choice.reason) for choice in ranks]
        monkeypatch.setattr(dist, "all_gather_object", all_gather_object)

    assert agreed_precision(fp32, world_size=1) is fp32
    gathered(bf16, bf16)
    assert agreed_precision(bf16, world_size=2) == bf16
    gathered(fp32, fp32)
    assert agreed_precision(fp32, world_size=2) == fp32
    gathered(bf16, fp32)
    assert agreed_precision(bf16, world_size=2) == Precision(False, "rank 1: CPU has neither")
    assert agreed_precision(fp32, world_size=2) == Precision(False, "rank 1: CPU has neither")


# --------------------------------------------------------------------------- the workload's own step


@pytest.fixture
def one_thread():
    """One torch thread, as a 1-CPU training worker sets: on a busy machine more threads only contend."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


IMAGE_SIZE = 24


def _tiny_worker(tmp_path, precision: Precision, steps: int = 1):
    """A real loop ``Worker`` (ResNet-18, AdamW, schedule, guard) on 16 px images held in memory."""
    import torch

    from workloads import storage
    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.loop import Worker
    from workloads.vision.training.model import build_model
    from workloads.vision.training.recipe import DivergenceGuard, make_optimizer, make_scheduler

    torch.manual_seed(0)
    cfg = TrainConfig(batch_size=8, epochs=1, num_workers=1, amp=precision.autocast)
    # Not 16 px: there PyTorch's bf16 kernels give ResNet-18 non-finite gradients now and then
    # (test_auto_keeps_resnet_in_fp32_where_its_bf16_gradients_break).
    layout = ImageLayout.photos(IMAGE_SIZE)
    model = build_model(cfg, 3, layout).to(memory_format=torch.channels_last)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (8, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=torch.uint8, generator=generator),
                torch.randint(0, 3, (8,), generator=generator)) for _ in range(steps)]
    optimizer = make_optimizer(model, cfg)
    return Worker(
        cfg=cfg, classes=["a", "b", "c"], layout=layout, run_dir=storage.storage_path(str(tmp_path)), rank=0,
        world_size=1, device=torch.device("cpu"), precision=precision, memory_format=torch.channels_last,
        batches=SimpleNamespace(steps_per_epoch=steps, train_epoch=lambda epoch: iter(batches),
                                val_batches=lambda: iter(batches)),
        model=model, optimizer=optimizer, scheduler=make_scheduler(optimizer, cfg, steps),
        loss_fn=torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        guard=DivergenceGuard(torch.device("cpu"), check_every=1))


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16", "fp32"])
def test_a_training_step_under_the_chosen_precision_keeps_weights_optimizer_and_norm_statistics_fp32(
        tmp_path, one_thread, autocast):
    import torch

    from workloads.vision.training.loop import epoch_metrics, evaluate, train_one_epoch

    worker = _tiny_worker(tmp_path, Precision(autocast, "test"))
    head_outputs = []
    worker.model.fc.register_forward_hook(lambda module, inputs, output: head_outputs.append(output.dtype))
    norm = worker.model.bn1
    mean_before = norm.running_mean.clone()

    training = train_one_epoch(worker, 0)

    assert head_outputs[0] == (torch.bfloat16 if autocast else torch.float32), "autocast ran (or not) as chosen"
    assert math.isfinite(training.loss_sum) and training.seen == 8
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in worker.model.parameters())
    assert all(value.dtype == torch.float32 for state in worker.optimizer.state.values()
               for value in state.values() if torch.is_tensor(value) and value.is_floating_point())
    assert norm.running_mean.dtype == torch.float32 and not torch.equal(norm.running_mean, mean_before)

    evaluation = evaluate(worker)
    assert math.isfinite(evaluation.loss_sum) and evaluation.seen == 8
    metrics = epoch_metrics(worker, 0, training, evaluation)
    assert metrics["precision"] == ("bf16" if autocast else "fp32")


def test_inference_under_bf16_hands_numpy_fp32_probabilities(tmp_path, one_thread):
    import numpy as np
    import torch

    from workloads.vision.inference.classify import LoadedModel, classify_tensors
    from workloads.vision.inference.stage import confusion_matrix

    worker = _tiny_worker(tmp_path, Precision(True, "test"))
    loaded = LoadedModel(worker.model.eval(), worker.classes, worker.layout, torch.device("cpu"),
                         Precision(True, "test"))
    images, labels = worker.batches.train_epoch(0).__next__()
    predicted, probabilities = classify_tensors(loaded, images)
    assert probabilities.dtype == np.float32 and probabilities.shape == (8, 3)
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    assert (predicted == probabilities.argmax(axis=1)).all()
    assert sum(map(sum, confusion_matrix(labels.numpy(), predicted, 3))) == 8


def test_the_precision_reported_as_text_is_left_out_of_tensorboard(tmp_path):
    from tests.support.tensorboard_events import tensorboard_scalars
    from workloads import storage
    from workloads.ray_train.metrics import write_tensorboard_events

    write_tensorboard_events(storage.storage_path(str(tmp_path)),
                             [{"epoch": 1, "val_accuracy": 0.5, "precision": "bf16"}])
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars == {"val_accuracy": [(1, 0.5)]}


def test_the_live_view_names_the_precision_the_job_reported_beside_its_metrics():
    from tests.support.live_view import progress_after, rendered_live_view

    screen = rendered_live_view(progress_after([
        {"event": "train_start", "epochs": 4},
        {"event": "report", "iteration": 1,
         "metrics": {"epoch": 1, "val_loss": 1.5, "val_accuracy": 0.25, "precision": "bf16"}}]))
    assert "val_loss 1.5 · val_accuracy 0.25 · bf16" in screen, screen


# --------------------------------------------------------------------------- the shared run (in-process Ray)


def test_the_precision_that_ran_is_in_every_checkpoint_and_in_the_inference_metrics(tiny_run):
    import json

    import pyarrow.parquet as pq

    run_dir = tiny_run.outcome.run_dir
    # The shared run sets amp: false, so its figures are the same on every CPU.
    assert tiny_run.params.train.amp is False
    for meta in sorted(run_dir.glob("checkpoint_*/meta.json")):
        assert json.loads(meta.read_text())["precision"] == "fp32", meta
    assert "precision" not in tiny_run.rows[-1], "metrics.csv holds numbers only"
    assert tiny_run.inference["precision"] == "fp32"
    assert set(pq.read_table(run_dir / "predictions", columns=["precision"]).column("precision").to_pylist()) == {
        "fp32"}
    assert "(fp32)" in tiny_run.infer_printed


def test_under_bf16_on_a_cpu_batch_norm_takes_fp32_while_the_convolutions_run_in_bf16():
    import torch

    from workloads.vision.training.resnet import ResNet18

    model = Precision(True, "test").keep_batch_norm_in_fp32(ResNet18(num_classes=3), "cpu")
    produced: dict[str, set] = {"conv": set(), "norm": set()}
    for module in model.modules():
        kind = "conv" if isinstance(module, torch.nn.Conv2d) else "norm" if isinstance(module, torch.nn.BatchNorm2d) else None
        if kind:
            module.register_forward_hook(lambda _, inputs, output, kind=kind: produced[kind].add(output.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 3, 32, 32))
    assert produced == {"conv": {torch.bfloat16}, "norm": {torch.float32}}
    assert model.state_dict().keys() == ResNet18(num_classes=3).state_dict().keys()  # a plain model's checkpoint

    # fp32 runs, and a GPU (not measured), are left as they are.
    for precision, device_type in ((Precision(False, "test"), "cpu"), (Precision(True, "test"), "cuda")):
        untouched = precision.keep_batch_norm_in_fp32(ResNet18(num_classes=3), device_type)
        assert not any(module._forward_pre_hooks for module in untouched.modules())
