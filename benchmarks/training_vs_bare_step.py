"""Training per worker against the bare step: how close each worker comes to its core's compute.

The limit is the bare step: the workload's model (``build_model``), memory format and
optimizer (``make_optimizer``) taking forward, backward and optimizer steps on one random
batch held in memory, in one process with one thread, nothing else running. Each rung of the
ladder adds one thing a training worker does, and its images/s per worker says what that
thing costs:

1. the bare step, one process alone (the limit);
2. the bare step in two processes at once, one per core: what sharing the machine costs
   (memory bandwidth, the shared cache, the clock);
3. the workload's ``train_one_epoch`` in two independent processes, on batches decoded
   once and held in memory: the loop's own work (normalizing, the gradient norm and the
   divergence check, the schedule);
4. the same reading the Parquet dataset: decoding and augmenting in the loop;
5. the workload under plain PyTorch DDP, 2 ranks over gloo (``torchrun``): the gradient
   all-reduce and the ranks waiting for each other;
6. the workload's own ``run_training``: Ray Train's ``TorchTrainer``, 2 workers x 1 CPU.

Beside the ladder: ``run_training`` in the specs' default layout (``auto``, which on this 2-CPU
instance resolves to 1 worker x 2 CPUs: two threads, the same global batch), whose images/s per
core says what one process per node gives instead.

Every rung has the same model, image size, per-worker batch and precision (the one
``amp: auto`` picks here). Rungs 2-4 run two processes that start their timed part together
and keep stepping until both have finished it, so neither times a stretch alone. Rungs 5
and 6 time the training pass of their last epoch, as ``images_per_s`` does. The rungs
alternate in order from round to round (``benchmarks/common.py``). Run:

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/training_vs_bare_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural, start_private_ray  # noqa: E402
from benchmarks.plain_torch import (InMemoryBatches, run_torchrun, setup_plain_worker,  # noqa: E402
                                    workload_loop_config)
from benchmarks.train_throughput import vision_params, write_dataset  # noqa: E402

# (key, the rung's name in the table, what it adds to the rung above)
RUNGS = [
    ("bare_alone", "bare step, one process alone", "the limit: forward, backward, optimizer step"),
    ("bare_pair", "bare step, two processes at once", "sharing the machine"),
    ("loop_memory", "`train_one_epoch`, two processes, batches in memory", "the loop's own work"),
    ("loop_parquet", "`train_one_epoch`, two processes, Parquet dataset", "decode + augment in the loop"),
    ("ddp", "plain DDP, 2 ranks over gloo (`torchrun`)", "the gradient all-reduce"),
    ("ray_train", "Ray Train `TorchTrainer`, 2 workers × 1 CPU", "Ray Train"),
]
# Not a rung: the same global batch on one worker with both cores, its images/s per core.
ONE_WORKER = ("one_worker", "the default layout (`auto`): `TorchTrainer`, 1 worker × 2 CPUs (2 threads), per core",
              "one process per node instead of one per core")
DEFAULT_LAYOUT_GOAL = 0.85  # the default layout's images/s per core over the bare step's, alone
GOAL = 0.8  # the workload's images/s per worker over the bare step's, alone


# --------------------------------------------------------------------------- one process of rungs 1-4


def bare_step_unit(config: dict, steps: int):
    """A callable taking ``steps`` bare training steps; returns the images it trained on."""
    import torch

    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout, normalize
    from workloads.vision.training.model import build_model
    from workloads.vision.training.recipe import make_optimizer, training_precision

    cfg = TrainConfig.model_validate(config["train"])
    layout = ImageLayout.from_manifest({"layout": config["layout"]})
    # The precision the workload's workers pick here: on a CPU with bf16 instructions a bare step in
    # fp32 would be a limit the workload's bf16 steps pass (1.16x of it on an AMD EPYC with avx512_bf16).
    precision = training_precision(cfg, layout.height, layout.width, "cpu")
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = build_model(cfg, len(config["classes"]), layout).to(memory_format=memory_format).train()
    # The same arithmetic as the workload's step: under bf16 on a CPU, batch norm takes fp32 input.
    model = precision.keep_batch_norm_in_fp32(model, "cpu")
    optimizer = make_optimizer(model, cfg)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    batch = cfg.global_batch
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (batch, layout.channels, layout.height, layout.width), dtype=torch.uint8,
                           generator=generator)
    images = normalize(pixels, layout, memory_format)
    labels = torch.randint(0, len(config["classes"]), (batch,), generator=generator)

    def unit() -> int:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with precision.autocast_context("cpu"):
                loss = loss_fn(model(images).float(), labels)
            loss.backward()
            optimizer.step()
        return batch * steps

    return unit


def loop_unit(config: dict, in_memory: bool):
    """A callable running one epoch of the workload's ``train_one_epoch``; returns the images it trained on."""
    from workloads.vision.training.loop import train_one_epoch

    worker = setup_plain_worker(config, rank=0, world_size=1)
    if in_memory:
        worker.batches = InMemoryBatches(list(worker.batches.train_epoch(0)))
    epochs = iter(range(10_000))
    return lambda: int(train_one_epoch(worker, next(epochs)).seen)


def process_main(plan_file: str, index: int) -> None:
    """One process of rungs 1-4: warm up, meet the others, time ``units`` units, keep stepping until all are done."""
    import torch

    plan = json.loads(Path(plan_file).read_text(encoding="utf-8"))
    torch.set_num_threads(1)
    config = plan["config"]
    if plan["rung"].startswith("bare"):
        unit = bare_step_unit(config, plan["steps_per_unit"])
    else:
        unit = loop_unit(config, in_memory=plan["rung"] == "loop_memory")
    unit()  # warm-up: first-touch allocations, the allocator's caches, lazy imports
    meeting = Path(plan["meeting"])

    def signal_and_wait(stage: str, keep_busy) -> None:
        (meeting / f"{stage}-{index}").touch()
        while len(list(meeting.glob(f"{stage}-*"))) < plan["processes"]:
            keep_busy()

    signal_and_wait("ready", lambda: time.sleep(0.01))
    started, images = time.perf_counter(), 0
    for _ in range(plan["units"]):
        images += unit()
    rate = images / (time.perf_counter() - started)
    print("RESULT " + json.dumps({"images_per_s": rate}), flush=True)
    # Until the other process is done too, this one keeps the machine as busy as it was.
    signal_and_wait("done", unit)


def run_processes(rung: str, config: dict, processes: int, units: int, steps_per_unit: int, scratch: Path) -> float:
    """Start ``processes`` processes of ``rung`` at once; their mean images/s per process."""
    meeting = Path(tempfile.mkdtemp(prefix="meeting-", dir=scratch))
    plan_file = meeting / "plan.json"
    plan_file.write_text(json.dumps({"rung": rung, "config": config, "processes": processes, "units": units,
                                     "steps_per_unit": steps_per_unit, "meeting": str(meeting)}), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    children = [subprocess.Popen([sys.executable, __file__, "--process", str(plan_file), str(index)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
                for index in range(processes)]
    rates = []
    for child in children:
        stdout, stderr = child.communicate(timeout=1800)
        found = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        if child.returncode != 0 or not found:
            raise RuntimeError(f"{rung} process exited {child.returncode}:\n{stdout[-2000:]}\n{stderr[-3000:]}")
        rates.append(json.loads(found[-1][len("RESULT "):])["images_per_s"])
    shutil.rmtree(meeting, ignore_errors=True)
    return sum(rates) / len(rates)


# --------------------------------------------------------------------------- the ladder


def ladder(data: Path, scratch: Path, args) -> dict:
    """One callable per rung, each returning images/s per worker."""
    from workloads.vision.reading.manifest import load_dataset_info
    from workloads.vision.training.stage import run_training

    info = load_dataset_info(data)
    settings = SimpleNamespace(epochs=10_000, batch=args.batch, overrides=args.overrides)
    # One worker's share: the per-worker batch, and the schedule far from its end (lr 0) while timed.
    one = workload_loop_config(vision_params(scratch / "runs", "one", settings, num_workers=1), info)
    steps_per_unit = max(1, args.images // args.batch)
    # Rungs 5 and 6: two workers and the global batch, a few epochs, the last one timed.
    pair_settings = SimpleNamespace(epochs=args.epochs, batch=2 * args.batch, overrides=args.overrides)
    pair_config = scratch / "ddp_config.json"
    pair_config.write_text(json.dumps(workload_loop_config(vision_params(scratch / "runs", "ddp", pair_settings),
                                                           info)), encoding="utf-8")
    runs = iter(range(1_000))

    def processes(rung: str, count: int):
        return lambda: run_processes(rung, one, count, args.units, steps_per_unit, scratch)

    def ddp() -> float:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
        metrics = run_torchrun(pair_config, 2, env)
        print(f"  ddp ranks trained with: {metrics['setup']}", flush=True)
        return metrics["images_per_s"] / 2

    def ray_train(**train) -> float:
        params = vision_params(scratch / "runs", f"ladder-{next(runs)}", pair_settings, **train)
        outcome = run_training(params, info)
        shutil.rmtree(outcome.run_dir, ignore_errors=True)
        return outcome.final_metrics["images_per_s"] / 2  # per worker, or per core of the one worker

    return {"bare_alone": processes("bare_alone", 1), "bare_pair": processes("bare_pair", 2),
            "loop_memory": processes("loop_memory", 2), "loop_parquet": processes("loop_parquet", 2),
            "ddp": ddp, "ray_train": ray_train,
            "one_worker": lambda: ray_train(num_workers="auto", cpus_per_worker="auto")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--images", type=int, default=768, help="training images")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch", type=int, default=32, help="batch per worker (the global batch is twice it)")
    parser.add_argument("--units", type=int, default=2,
                        help="epochs (or as many bare steps) each process of rungs 1-4 times")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run of rungs 5-6; the last one is timed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a train setting for every rung, e.g. --set channels_last=false")
    add_json_option(parser)
    args = parser.parse_args()
    from benchmarks.train_throughput import parse_overrides

    args.overrides = parse_overrides(args.overrides)

    stamp = Stamp.begin()
    result = Result("training_vs_bare_step", "Training per worker against the bare step",
                    ["rung", "adds", "images/s per worker (rounds)", "vs the bare step alone",
                     "vs the rung above"], [], stamp)
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-bare-step-bench-"))
    try:
        started = time.perf_counter()
        data = write_dataset(scratch / "data", args.images, 64, args.size)
        print(f"dataset: {args.images} train images of {args.size}px; batch {args.batch} per worker, "
              f"{args.rounds} rounds", flush=True)
        import ray

        start_private_ray(2)
        names = {key: name for key, name, _ in [*RUNGS, ONE_WORKER]}
        rungs = ladder(data, scratch, args)
        # Rungs 1-4 warm up inside each process; Ray Train's first run also starts its cluster's workers.
        warmups = {key: (rungs[key] if key in ("ray_train", "one_worker") else (lambda: None)) for key in rungs}
        rates = alternate(rungs, args.rounds, warmup=warmups, show=lambda i, r: print(
            f"  round {i + 1}: " + ", ".join(f"{names[k]} {v:.1f}" for k, v in r.items()), flush=True))
        ray.shutdown()

        limit = rates["bare_alone"]
        previous = None
        for key, name, adds in RUNGS:
            spread = result.figure(f"{key}_images_per_s", Spread.of(rates[key]), "images/s")
            versus_limit = result.figure(f"{key}_vs_bare", Spread.ratio(rates[key], limit), "x")
            step = Spread.ratio(rates[key], rates[previous]).times() if previous else "—"
            result.rows.append([name, adds, spread.text(1), versus_limit.times(), step])
            print(f"[{key}] {spread.text(1)} images/s per worker, {versus_limit.median:.2f}x the bare step", flush=True)
            previous = key
        key, name, adds = ONE_WORKER
        spread = result.figure(f"{key}_images_per_s", Spread.of(rates[key]), "images/s")
        versus_limit = result.figure(f"{key}_vs_bare", Spread.ratio(rates[key], limit), "x")
        versus_two = Spread.ratio(rates[key], rates["ray_train"]).times()
        result.rows.append([name, adds, spread.text(1), versus_limit.times(), f"{versus_two} vs 2 × 1"])
        print(f"[{key}] {spread.text(1)} images/s per core, {versus_limit.median:.2f}x the bare step", flush=True)
        goal = Spread.of(result.figures["ray_train_vs_bare"]["values"])
        print(f"[goal] TorchTrainer per worker / bare step alone: {goal.median:.2f} (goal >= {GOAL})", flush=True)
        default = Spread.of(result.figures["one_worker_vs_bare"]["values"])
        print(f"[goal] default layout per core / bare step alone: {default.median:.2f} "
              f"(goal >= {DEFAULT_LAYOUT_GOAL})", flush=True)

        from benchmarks.precision import cpu_note

        settings = ", ".join(f"{k}={v}" for k, v in args.overrides.items()) or "the workload's defaults"
        result.notes.append(
            f"ResNet-18, {args.size} px, batch {args.batch} per worker, one thread per process, {settings}; "
            f"{cpu_note().rstrip('.')}. Goals: Ray Train's images/s per worker ≥ {GOAL}× the bare step alone; the "
            f"default layout's images/s per core ≥ {DEFAULT_LAYOUT_GOAL}× it.")
        result.notes.append(
            f"{args.images} noise-textured JPEGs (costly to decode like photos). Rungs 1–4 time {args.units} "
            f"epochs per process (the bare step: as many steps); rungs 5–6 the training pass of the last of "
            f"{args.epochs} epochs at global batch {2 * args.batch}. {plural(args.rounds, 'round')} after a "
            "warm-up of each rung.")
        print(f"total {time.perf_counter() - started:.0f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.save(args.json)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--process":
        process_main(sys.argv[2], int(sys.argv[3]))
    else:
        main()
