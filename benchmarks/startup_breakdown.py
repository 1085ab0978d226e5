"""Where the start of a training run and of a batch-inference run goes, phase by phase.

Training: the workload's own ``run_training`` (Ray Train's ``TorchTrainer``, in the specs'
default layout, ``auto``: 1 worker x 2 CPUs here; one epoch of a small 64 px dataset) on a private 2-CPU Ray instance. Its milestones come from
Ray's own task events (``ray.util.state.list_tasks``: when each actor was asked for, when its
process took it, when its constructor began and ended) and from timestamps taken inside each
worker by a wrapper around the workload's train loop, which changes nothing the loop does:
when the loop was entered, when ``setup_worker`` returned (data loader, model, optimizer),
and when the first optimizer step ended.

Batch inference: the workload's own ``prediction_dataset`` (an actor pool of 2 x 1 CPU) over
3,000 images of 64 px, with the same task events for its actors, and the moment the
first predictions reach the driver. Beside it, a fresh process alone times what each actor's
constructor does (importing torch and the inference module, loading the checkpoint, which builds
ResNet-18 without torchvision) and its first batch.

Every wall-clock figure is a median over the rounds, each run after a warm-up run. Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/startup_breakdown.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural, start_private_ray  # noqa: E402
from benchmarks.inference_throughput import make_checkpoint  # noqa: E402
from benchmarks.train_throughput import vision_params, write_dataset  # noqa: E402

TRIAL_GOAL_S = 10.0  # a trial's first step, from the call that starts it
INFERENCE_GOAL_S = 3.0  # the first predictions, from the moment the last actor was asked for


# --------------------------------------------------------------------------- inside a training worker


def timed_train_loop(config: dict, *, inner, marks_dir: str):
    """``inner(config)``, with this worker's milestones written to ``marks_dir/rank-N.json`` after its first step."""
    entered = time.time()
    import ray.train
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from workloads.vision.training import loop

    rank = ray.train.get_context().get_world_rank()
    marks = {"entered": entered}
    real_setup = loop.setup_worker

    def setup_worker(loop_config):
        worker = real_setup(loop_config)
        marks["setup_done"] = time.time()
        return worker

    def first_forward(module, args):
        marks.setdefault("first_forward", time.time())
        forward_hook.remove()

    def first_step(optimizer, args, kwargs):
        marks["first_step_done"] = time.time()
        step_hook.remove()
        Path(marks_dir, f"rank-{rank}.json").write_text(json.dumps(marks), encoding="utf-8")

    forward_hook = register_module_forward_pre_hook(first_forward)
    step_hook = register_optimizer_step_post_hook(first_step)
    loop.setup_worker = setup_worker
    try:
        return inner(config)
    finally:
        loop.setup_worker = real_setup


# --------------------------------------------------------------------------- Ray's task events


def actor_starts(since: float, class_part: str) -> list[dict]:
    """The constructor tasks of actors whose class name holds ``class_part``, asked for after ``since`` (s).

    Each as seconds since the epoch: ``asked`` (created), ``running`` (a worker process has started,
    loaded the class and begun the constructor), ``ready`` (the constructor ended).
    """
    import ray
    from ray.util.state import list_tasks

    found = []
    # The address of the Ray this process runs in: left out, the state API looks for "the" cluster of
    # the machine (/tmp/ray/ray_current_cluster), which can name another cluster or one long gone.
    for task in list_tasks(address=ray.get_runtime_context().gcs_address,
                           filters=[("type", "=", "ACTOR_CREATION_TASK")], detail=True, limit=10_000,
                           raise_on_missing_output=False):
        if class_part not in (task.func_or_class_name or "") or not task.creation_time_ms:
            continue
        if task.creation_time_ms / 1000 < since:
            continue
        states = {event["state"]: event["created_ms"] / 1000 for event in task.events or []}
        found.append({"asked": task.creation_time_ms / 1000, "running": states.get("RUNNING"),
                      "ready": states.get("FINISHED")})
    return found


def settled_actor_starts(since: float, class_part: str, count: int) -> list[dict]:
    """:func:`actor_starts`, once ``count`` of them have all their events (Ray reports them about every second)."""
    deadline = time.monotonic() + 30
    while True:
        found = [a for a in actor_starts(since, class_part) if all(a.values())]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


# --------------------------------------------------------------------------- training


TRAINING_PHASES = [
    # (key, the phase in the table)
    ("controller", "Ray Train's controller: process started, constructor done"),
    ("workers_asked", "placement group created, workers asked for (→ the last one)"),
    ("workers_running", "workers' processes started, constructors begin (→ the last one)"),
    ("workers_ready", "workers' constructors done (→ the last one)"),
    ("loop_entered", "process group and train loop started (→ the last rank entered the loop)"),
    ("setup", "`setup_worker`: data loader, model, optimizer (→ the last rank done)"),
    ("first_batch", "first batch read and decoded (→ the last rank's first forward pass)"),
    ("first_step", "first step: forward, backward, all-reduce, optimizer (→ the last rank done)"),
]


def training_start(data: Path, scratch: Path, run: int) -> dict:
    """One run of ``run_training``; its milestones as seconds after the call."""
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.training import stage

    marks_dir = scratch / f"marks-{run}"
    marks_dir.mkdir()
    real_fit = stage.fit

    def fit(train_loop, *args, **kwargs):
        return real_fit(functools.partial(timed_train_loop, inner=train_loop, marks_dir=str(marks_dir)),
                        *args, **kwargs)

    settings = SimpleNamespace(epochs=1, batch=32, overrides={})
    # The layout every spec starts with (auto): on this 2-CPU instance, one worker of 2 CPUs.
    params = vision_params(scratch / "runs", f"start-{run}", settings, num_workers="auto", cpus_per_worker="auto")
    info = load_dataset_info(data)
    called = time.time()
    with mock.patch.object(stage, "fit", fit):
        outcome = stage.run_training(params, info)
    shutil.rmtree(outcome.run_dir, ignore_errors=True)

    ranks = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(marks_dir.glob("rank-*.json"))]
    (controller,) = settled_actor_starts(called, "TrainController", 1)[:1]
    workers = settled_actor_starts(called, "RayTrainWorker", len(ranks))[:len(ranks)]
    last = {key: max(rank[key] for rank in ranks) for key in ("entered", "setup_done", "first_forward",
                                                                "first_step_done")}
    milestones = {
        "controller": controller["ready"],
        "workers_asked": max(w["asked"] for w in workers),
        "workers_running": max(w["running"] for w in workers),
        "workers_ready": max(w["ready"] for w in workers),
        "loop_entered": last["entered"],
        "setup": last["setup_done"],
        "first_batch": last["first_forward"],
        "first_step": last["first_step_done"],
    }
    return {key: moment - called for key, moment in milestones.items()}


# --------------------------------------------------------------------------- inference


INFERENCE_PHASES = [
    ("actors_asked", "Ray Data plans the pipeline, asks for the actors (→ the last one)"),
    ("actors_running", "actors' processes started, constructors begin (→ the last one)"),
    ("actors_ready", "constructors: imports, checkpoint loaded (→ the last one done)"),
    ("first_predictions", "first predictions reach the driver"),
]


def inference_start(files: list[str], checkpoint: Path, batch: int) -> dict:
    """One pass of ``prediction_dataset`` over ``files``; its milestones as seconds after the pass began."""
    from workloads.vision.config import InferConfig
    from workloads.vision.inference.stage import prediction_dataset

    config = InferConfig(batch_size=batch, num_actors=2, cpus_per_actor=1)
    started = time.time()
    first = None
    rows = 0
    for predictions in prediction_dataset(files, checkpoint, config).iter_batches(batch_size=None):
        if first is None:
            first = time.time()
        rows += len(predictions["label"])
    ended = time.time()
    actors = settled_actor_starts(started, "MapWorker", 2)
    milestones = {
        "actors_asked": max(a["asked"] for a in actors),
        "actors_running": max(a["running"] for a in actors),
        "actors_ready": max(a["ready"] for a in actors),
        "first_predictions": first,
        "end": ended,
    }
    return {key: moment - started for key, moment in milestones.items()} | {"rows": rows}


STOPWATCH = """
import json, sys, time
started = time.perf_counter()
marks = {}
import torch
torch.set_num_threads(1)
marks["import torch"] = time.perf_counter()
from workloads.vision.inference import stage
marks["import the inference module"] = time.perf_counter()
from workloads.vision.inference.classify import classify_tensors, load_checkpoint_model
loaded = load_checkpoint_model(sys.argv[1])
marks["load the checkpoint"] = time.perf_counter()
from workloads.vision.images import decode_batch
import pyarrow.parquet as pq
images = pq.read_table(sys.argv[2], columns=["image"]).column("image").to_pylist()[:int(sys.argv[3])]
classify_tensors(loaded, decode_batch(images, loaded.layout))
marks["decode and classify the first batch"] = time.perf_counter()
previous, phases = started, {}
for name, moment in marks.items():
    phases[name] = moment - previous
    previous = moment
print("RESULT " + json.dumps(phases))
"""


def actor_constructor_alone(checkpoint: Path, first_file: str, batch: int) -> dict:
    """What one actor's constructor and first batch cost, timed in a fresh process alone (1 thread)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", STOPWATCH, str(checkpoint), first_file, str(batch)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT,
                          stdin=subprocess.DEVNULL)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"the stopwatch process exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(found[-1][len("RESULT "):])


# --------------------------------------------------------------------------- report


def phase_rows(result: Result, prefix: str, phases: list[tuple[str, str]], runs: list[dict]) -> None:
    """Rows of ``phases``: each one's own seconds (from the milestone before it), and its milestone's."""
    previous = None
    for key, name in phases:
        at = result.figure(f"{prefix}_{key}_at_s", Spread.of([run[key] for run in runs]), "s")
        own = Spread.of([run[key] - (run[previous] if previous else 0.0) for run in runs])
        result.figure(f"{prefix}_{key}_s", own, "s")
        result.rows.append([prefix, name, own.text(1, " s"), at.text(1, " s")])
        previous = key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-images", type=int, default=256, help="training images (one epoch is run)")
    parser.add_argument("--infer-images", type=int, default=3000, help="images batch inference classifies")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=64, help="inference batch")
    add_json_option(parser)
    args = parser.parse_args()

    stamp = Stamp.begin()
    result = Result("startup_breakdown", "Where the start of training and of batch inference goes",
                    ["run", "phase", "seconds (rounds)", "since the start (rounds)"], [], stamp)
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-startup-bench-"))
    try:
        started = time.perf_counter()
        train_data = write_dataset(scratch / "train-data", args.train_images, 64, args.size)
        infer_data = write_dataset(scratch / "infer-data", 0, args.infer_images, args.size)
        files = sorted(str(path) for path in (infer_data / "val").glob("*.parquet"))
        checkpoint = make_checkpoint(scratch / "checkpoint", args.size)
        import ray

        # Ray's dashboard serves the task events (the state API).
        start_private_ray(2, dashboard=True)
        runs = iter(range(1_000))
        measured = alternate({"training": lambda: training_start(train_data, scratch, next(runs)),
                              "inference": lambda: inference_start(files, checkpoint, args.batch)},
                             args.rounds, show=lambda i, r: print(
                                 f"  round {i + 1}: " + "; ".join(
                                     f"{side}: " + ", ".join(f"{k} {v:.1f}" for k, v in marks.items())
                                     for side, marks in r.items()), flush=True))
        ray.shutdown()
        alone = alternate({"stopwatch": lambda: actor_constructor_alone(checkpoint, files[0], args.batch)},
                          args.rounds)["stopwatch"]

        training, inference = measured["training"], measured["inference"]
        phase_rows(result, "training", TRAINING_PHASES, training)
        phase_rows(result, "inference", INFERENCE_PHASES, inference)
        first_step = result.figures["training_first_step_at_s"]
        after_asked = result.figure("inference_first_predictions_after_asked_s", Spread.of(
            [run["first_predictions"] - run["actors_asked"] for run in inference]), "s")
        end = result.figure("inference_end_s", Spread.of([run["end"] for run in inference]), "s")
        for phase in alone[0]:
            key = "alone_" + phase.split(" (")[0].replace(" ", "_") + "_s"
            spread = result.figure(key, Spread.of([run[phase] for run in alone]), "s")
            result.rows.append(["one actor's work, a fresh process alone", phase, spread.text(2, " s"), "—"])
        print(f"[training] first step after {Spread.of(first_step['values']).text(1)} s (goal <= {TRIAL_GOAL_S:g} s)")
        print(f"[inference] first predictions {after_asked.text(1)} s after the last actor was asked for "
              f"(goal <= {INFERENCE_GOAL_S:g} s); {args.infer_images} images done after {end.text(1)} s")
        result.notes.append(
            f"Training: `run_training` in the default layout (`auto`: 1 worker × 2 CPUs here), {args.train_images} "
            f"training images of {args.size} px, "
            f"global batch 32, one epoch. Goal: the first step within {TRIAL_GOAL_S:g} s of the call.")
        result.notes.append(
            f"Inference: `prediction_dataset`, 2 actors × 1 CPU, batch {args.batch}, {args.infer_images} images of "
            f"{args.size} px, done after {end.text(1)} s. The first predictions came {after_asked.text(1)} s after "
            f"the last actor was asked for (goal ≤ {INFERENCE_GOAL_S:g} s).")
        result.notes.append(f"{plural(args.rounds, 'round')} after a warm-up run of each; a private 2-CPU Ray "
                            "instance. Milestones from Ray's task events and from the workers' own clocks.")
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.save(args.json)


if __name__ == "__main__":
    main()
