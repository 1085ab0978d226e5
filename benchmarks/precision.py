"""bf16 autocast against fp32 on this machine's CPU: the bare training step, inference, and the food101 recipe.

1. Bare step: the workload's own ``train_one_epoch`` (ResNet-18, fused AdamW, channels_last, the
   divergence guard) in this process, with ``--threads`` torch threads. It trains on random batches
   held in memory, once under bf16 autocast and once in fp32, at each of ``--sizes`` (64 and 224 px).
   Beside it, the forward pass of batch inference (the workload's ``classify_tensors``) on the same
   batches. The result is images/s: each side is warmed up once, then the rounds alternate their order.
2. Recipe: ``specs/food101.yaml`` through the workload (preprocess + TorchTrainer, 2 workers × 1 CPU,
   as ``benchmarks/learning_quality.py`` runs it), with ``train.amp: true`` and ``train.amp: false``. It
   runs once per seed on the 64 px dev set (``--data``) and on the real 512 px sample photos at 224 px
   (``--photos``). It reports the final validation accuracy and the images/s of epochs 2 onwards. The
   two sides swap order from seed to seed.

``amp: true`` forces bf16 even on a CPU without bf16 instructions, so the figures say what bf16 costs
or gains here. The notes give the CPU's bf16 flags and what ``amp: auto`` picks on it. Run:
    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/precision.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import Result, Spread, Stamp, add_json_option, alternate, plural  # noqa: E402
from benchmarks.learning_quality import food101_subset, mean, run_workload, spec_overrides  # noqa: E402
from benchmarks.plain_torch import InMemoryBatches  # noqa: E402

SIDES = ("bf16 autocast", "fp32")
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def bare_worker(size: int, batch: int, steps: int, autocast: bool, scratch: Path):
    """The loop's ``Worker`` for one process, on ``steps`` random batches of ``size`` px held in memory."""
    import torch

    from workloads import storage
    from workloads.ray_train.precision import Precision
    from workloads.vision.config import TrainConfig
    from workloads.vision.images import ImageLayout
    from workloads.vision.training.loop import Worker
    from workloads.vision.training.model import build_model
    from workloads.vision.training.recipe import DivergenceGuard, make_optimizer, make_scheduler

    torch.manual_seed(0)
    # Epochs far beyond the benchmark: the schedule must not reach its end (lr 0) while it runs.
    cfg = TrainConfig(batch_size=batch, epochs=10_000, num_workers=1, amp=autocast)
    layout = ImageLayout.photos(size)
    precision = Precision(autocast, "benchmark")
    # As the loop's setup_worker does: under bf16 on the CPU, batch norm takes fp32 input.
    model = precision.keep_batch_norm_in_fp32(build_model(cfg, 10, layout).to(memory_format=torch.channels_last), "cpu")
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator),
                torch.randint(0, 10, (batch,), generator=generator)) for _ in range(steps)]
    optimizer = make_optimizer(model, cfg)
    cpu = torch.device("cpu")
    return Worker(cfg=cfg, classes=[f"class{i}" for i in range(10)], layout=layout,
                  run_dir=storage.storage_path(str(scratch)), rank=0, world_size=1, device=cpu,
                  precision=precision, memory_format=torch.channels_last,
                  batches=InMemoryBatches(batches), model=model, optimizer=optimizer,
                  scheduler=make_scheduler(optimizer, cfg, steps), loss_fn=torch.nn.CrossEntropyLoss(),
                  guard=DivergenceGuard(cpu, check_every=1))


def bare_sides(size: int, batch: int, steps: int, scratch: Path) -> tuple[dict, dict]:
    """Callables of one epoch each, per precision: the training step's images/s, and inference's."""
    import torch

    from workloads.vision.inference.classify import LoadedModel, classify_tensors
    from workloads.vision.training.loop import train_one_epoch
    from workloads.vision.training.model import build_model

    training, inference = {}, {}
    for label, autocast in zip(SIDES, (True, False)):
        worker = bare_worker(size, batch, steps, autocast, scratch)
        epochs = iter(range(10_000))
        training[label] = lambda worker=worker, epochs=epochs: (
            batch * steps / train_one_epoch(worker, next(epochs)).seconds)
        model = build_model(worker.cfg, 10, worker.layout).eval().to(memory_format=torch.channels_last)
        # As load_checkpoint_model does.
        model = worker.precision.keep_batch_norm_in_fp32(model, "cpu")
        loaded = LoadedModel(model, worker.classes, worker.layout, worker.device, worker.precision)

        def classify(loaded=loaded, batches=worker.batches.batches) -> float:
            started = time.perf_counter()
            for images, _ in batches:
                classify_tensors(loaded, images)
            return batch * len(batches) / (time.perf_counter() - started)

        inference[label] = classify
    return training, inference


def recipe_side(data: Path, size: int, epochs: int, seed: int, amp: bool, scratch: Path, extra: list[str]) -> dict:
    """One training run of the food101 spec on ``data``: final accuracy and images/s of epochs 2 onwards."""
    train_images = len((data / "meta" / "train.txt").read_text(encoding="utf-8").split())
    overrides = spec_overrides(data, epochs, size, 2, scratch) + [
        f"workload.train.seed={seed}", f"workload.train.amp={'true' if amp else 'false'}",
        f"workload.run_name=precision-{'bf16' if amp else 'fp32'}-seed-{seed}"] + extra
    rows, _ = run_workload(REPO_ROOT / "specs" / "food101.yaml", overrides, cpus=2)
    return {"accuracy": rows[-1]["val_accuracy"],
            "images_per_s": mean([train_images / row["epoch_s"] for row in rows[1:]] or
                                 [train_images / rows[-1]["epoch_s"]])}


def compare_recipe(result: Result, name: str, data: Path, size: int, epochs: int, seeds: list[int],
                   scratch: Path, extra: list[str]) -> None:
    """Train the recipe in both precisions per seed on ``data``; one row per seed and figure, and the means."""
    runs: dict[str, list[dict]] = {label: [] for label in SIDES}
    for turn, seed in enumerate(seeds):
        order = list(zip(SIDES, (True, False)))
        for label, amp in (order if turn % 2 == 0 else order[::-1]):
            print(f"{name}, seed {seed}: {label}", flush=True)
            runs[label].append(recipe_side(data, size, epochs, seed, amp, scratch, extra))
    for key, unit, digits in (("accuracy", "accuracy", 3), ("images_per_s", "images/s", 1)):
        ours, theirs = ([run[key] for run in runs[label]] for label in SIDES)
        bf16 = result.figure(f"{name}_{key}_bf16", Spread.of(ours), unit)
        fp32 = result.figure(f"{name}_{key}_fp32", Spread.of(theirs), unit)
        ratio = result.figure(f"{name}_{key}_ratio", Spread.ratio(ours, theirs), "x")
        result.rows.append([f"recipe, {name} at {size} px, {plural(epochs, 'epoch')}: {unit} "
                            f"({plural(len(seeds), 'seed')}: {', '.join(map(str, seeds))})",
                            bf16.text(digits), fp32.text(digits), ratio.times()])
        print(f"[{name}] {unit}: bf16 {bf16.text(digits)}, fp32 {fp32.text(digits)} -> {ratio.median:.2f}x",
              flush=True)


def cpu_note() -> str:
    """What this CPU offers for bf16 and what ``amp: auto`` picks on it."""
    import torch

    from workloads.ray_train.precision import choose_precision, cpu_bf16_flags, read_cpuinfo

    flags = cpu_bf16_flags(read_cpuinfo())
    return (f"CPU bf16 flags: {', '.join(flags) or 'none'}; torch's CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}; `amp: auto` picks: {choose_precision('auto', 'cpu').line()}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 224], help="image sides of the bare step")
    parser.add_argument("--batch", type=int, default=32, help="images per step of the bare step")
    parser.add_argument("--steps", type=int, default=20,
                        help="steps per timed epoch at 64 px (fewer at larger sizes, for about the same pixels)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the bare step")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "food101-64px-dev", help="the 64 px dev set")
    parser.add_argument("--photos", type=Path, default=SHARED_DATA / "food101-sample", help="the real photos")
    parser.add_argument("--epochs", type=int, default=12, help="epochs of the recipe on the dev set")
    parser.add_argument("--photo-epochs", type=int, default=6, help="epochs of the recipe on the photos")
    parser.add_argument("--photo-size", type=int, default=224)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED")
    parser.add_argument("--skip-recipe", action="store_true", help="measure the bare step and inference only")
    add_json_option(parser)
    args = parser.parse_args()

    import torch

    stamp = Stamp.begin()
    result = Result("precision", "bf16 autocast vs fp32 on this CPU",
                    ["measured", SIDES[0], SIDES[1], "bf16 / fp32 (rounds)"], [], stamp)
    result.notes.append(cpu_note())
    print(result.notes[-1], flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="rayjobs-precision-"))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        for size in args.sizes:
            steps = max(2, round(args.steps * (64 / size) ** 2))
            training, inference = bare_sides(size, args.batch, steps, scratch)
            for part, sides in (("training step", training), ("inference forward pass", inference)):
                rates = alternate(sides, args.rounds, show=lambda i, r: print(
                    f"  {size} px {part}, round {i + 1}: " + ", ".join(f"{k} {v:.1f} images/s" for k, v in r.items()),
                    flush=True))
                key = f"{'train' if part == 'training step' else 'infer'}_{size}px"
                bf16 = result.figure(f"{key}_bf16", Spread.of(rates[SIDES[0]]), "images/s")
                fp32 = result.figure(f"{key}_fp32", Spread.of(rates[SIDES[1]]), "images/s")
                ratio = result.figure(f"{key}_ratio", Spread.ratio(rates[SIDES[0]], rates[SIDES[1]]), "x")
                result.rows.append([f"bare {part}, ResNet-18, {size} px, batch {args.batch}, {steps} steps",
                                    bf16.text(1, " images/s"), fp32.text(1, " images/s"), ratio.times()])
                print(f"[{size} px {part}] bf16 {bf16.text()} vs fp32 {fp32.text()} images/s -> "
                      f"{ratio.median:.2f}x", flush=True)
        torch.set_num_threads(previous_threads)
        result.notes.append(f"Bare step: one process, {plural(args.threads, 'thread')}, random images held in "
                            f"memory; {plural(args.rounds, 'round')} after a warm-up of each side.")
        if args.skip_recipe:
            result.notes.append("The recipe was not run (--skip-recipe).")
        for name, data, size, epochs, extra in (
                ("dev set", args.data, 64, args.epochs, []),
                # The 224 px check of docs/vision.md: 72 photos, 8 per worker.
                ("sample photos", args.photos, args.photo_size, args.photo_epochs, ["workload.train.batch_size=16"])):
            if args.skip_recipe:
                break
            if not (data / "meta" / "classes.txt").is_file():
                result.notes.append(f"The recipe on the {name} was not run: no Food-101 subset at {data}.")
                print(result.notes[-1], flush=True)
                continue
            compare_recipe(result, name, food101_subset(data), size, epochs, args.seeds,
                           scratch / name.replace(" ", "-"), extra)
        if not args.skip_recipe:
            result.notes.append("Recipe: specs/food101.yaml, 2 workers × 1 CPU, `train.amp: true` against `false`; "
                                "images/s of epochs 2 onwards, evaluation included.")
    finally:
        torch.set_num_threads(previous_threads)
        shutil.rmtree(scratch, ignore_errors=True)
    result.save(args.json)


if __name__ == "__main__":
    main()
