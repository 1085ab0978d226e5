"""What the training workloads share: run directory, worker resources, error lines and the final metrics line."""

from __future__ import annotations

from pathlib import Path


def test_both_workloads_place_the_run_under_storage_path(tmp_path):
    from workloads.hf_vit.config import HFViTParams
    from workloads.vision.config import VisionParams

    vision = VisionParams.model_validate({"storage_path": str(tmp_path / "results"), "run_name": "a"})
    hf = HFViTParams.model_validate({"storage_path": str(tmp_path / "results"), "data": {"path": str(tmp_path)}})
    assert vision.run_dir == (tmp_path / "results" / "a").resolve()
    assert hf.run_dir == (tmp_path / "results" / "vit-hf").resolve()
    assert VisionParams().run_dir == Path("~/rayjobs-results").expanduser().resolve() / "food101-lite"


def test_worker_resources_add_a_gpu_unless_one_is_given():
    from workloads.vision.config import TrainConfig

    assert TrainConfig(cpus_per_worker=2).worker_resources() == {"CPU": 2.0}
    assert TrainConfig(use_gpu=True).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    assert TrainConfig(use_gpu=True, resources_per_worker={"GPU": 0.5, "fast": 1}).worker_resources() == {
        "CPU": 1.0, "GPU": 0.5, "fast": 1.0}


def test_root_cause_reaches_the_innermost_error():
    from workloads.ray_train.trainer import first_line, root_cause

    try:
        try:
            raise ValueError("first\nthe real reason")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "ValueError: the real reason"
        assert first_line(outer.__cause__) == "first"


def test_final_metrics_line_prints_the_epoch_as_a_whole_number():
    from workloads.ray_train.metrics import final_metrics_line

    final = {"epoch": 3.0, "train_loss": 0.123456, "val_accuracy": 0.5}
    assert final_metrics_line(final) == "Final metrics: epoch=3, train_loss=0.1235, val_accuracy=0.5"
    assert final_metrics_line(final, ["val_accuracy", "lr", "epoch"]) == "Final metrics: val_accuracy=0.5, epoch=3"


def test_the_summary_names_the_node_of_every_training_rank():
    from workloads.vision.training.stage import worker_nodes_line

    assert worker_nodes_line(["a" * 56, "b" * 56]) == (
        "Training workers: rank 0 on node aaaaaaaa, rank 1 on node bbbbbbbb (2 nodes)")
    assert worker_nodes_line(["c" * 56]) == "Training workers: rank 0 on node cccccccc (1 node)"


def test_tensorboard_shows_every_epoch_and_a_reload_sees_each_new_epoch_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.tensorboard_events import tensorboard_scalars
    from workloads.ray_train.metrics import write_tensorboard_events

    rows = [{"epoch": epoch, "train_loss": 2.0 / epoch, "val_accuracy": 0.25 * epoch} for epoch in (1, 2)]
    written = write_tensorboard_events(tmp_path, rows)
    assert written == tmp_path / "tensorboard" / "events.out.tfevents.rayjobs"
    assert tensorboard_scalars(tmp_path / "tensorboard") == {"train_loss": [(1, 2.0), (2, 1.0)],
                                                             "val_accuracy": [(1, 0.25), (2, 0.5)]}
    # TensorBoard, left open on the run, reads on from where it stopped: the file rewritten after the next
    # epoch adds that epoch once, and stays the folder's only event file.
    watching = EventAccumulator(str(tmp_path / "tensorboard"))
    watching.Reload()
    write_tensorboard_events(tmp_path, [*rows, {"epoch": 3, "train_loss": 0.5, "val_accuracy": 0.75}])
    watching.Reload()
    assert [(event.step, event.value) for event in watching.Scalars("train_loss")] == [(1, 2.0), (2, 1.0), (3, 0.5)]
    assert [path.name for path in (tmp_path / "tensorboard").iterdir()] == ["events.out.tfevents.rayjobs"]
