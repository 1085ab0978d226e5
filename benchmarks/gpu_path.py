"""The GPU path on one card: the food101 spec trained both ways of decoding, the record's GPU use, and the feed.

    PYTHONPATH=. python benchmarks/gpu_path.py --data DIR --photos DIR --out DIR [--epochs 12]

By hand, on a machine with a CUDA GPU (``run_all.py`` runs on CPUs). In order, each part in its own process so
that one that fails leaves the others their say, everything it prints kept under ``--out``:

1. ``pixels``: a batch's JPEG files as the loader hands them over (views into one tensor) decode on the card to
   the pixels of the same files as tensors of their own, to the bit; and how far nvJPEG's pixels lie from
   libjpeg-turbo's on the CPU;
2. ``decode``: ``rayjobs submit --local specs/food101.yaml`` on the 64 px development set, preprocessed once
   first, then trained twice with one GPU worker and the same recipe and seed, once with ``decode: device``
   (nvJPEG, crops and flips on the card) and once with ``decode: loader`` (DataLoader processes). Both must
   succeed with every epoch, and learn alike: each at least 2.5× chance after the last epoch, within 5 points of
   each other on the 500 held-out photos (one seed a side: a coarse check, not a measure of a small loss).
   Each run's record must hold the job's GPU use, sampled through NVML by the agent (``rayjobs show RUN -o
   json``: two samples or more, GPU hours and peak GPU memory above zero); ``rayjobs compare`` draws both runs'
   curves into ``compare.png``;
3. ``throughput``: ``gpu_throughput.py --batch 256``, the workload's training pass against the bare bf16 step;
4. ``feed``: ``gpu_feed.py``, the bare step against a CPU DataLoader and nvJPEG on the card, on real photos.

It exits 1 when a check fails (``summary.json`` names each, ``checks``). ``--cpu-check`` runs the second and
third on the CPU with two epochs, to check the harness on a machine without a GPU; its figures prove nothing
about a GPU.
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

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# One seed a side: the two must each learn (well above chance) and end within a few photos' worth of each other
# (a point is 5 of the 500 held-out photos).
CHANCE_TIMES = 2.5
ALIKE_POINTS = 0.05


def run_part(name: str, command: list[str], out: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Run one part, its output both printed and kept in ``out/NAME.log``; its exit code, output and seconds."""
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    with subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as process:
        kept = []
        for line in process.stdout:
            sys.stdout.write(line)
            kept.append(line)
        code = process.wait()
    seconds = time.monotonic() - started
    text = "".join(kept)
    (out / f"{name}.log").write_text(text, encoding="utf-8")
    print(f"=== {name}: exit {code} after {seconds:.0f} s", flush=True)
    return code, text, seconds


def rayjobs(*arguments: str) -> list[str]:
    """The CLI as a module, so that no installed entry point is needed."""
    return [sys.executable, "-m", "runner.cli", *arguments]


def spec_settings(data: Path, scratch: Path, decode: str, epochs: int, use_gpu: bool, run_name: str = "") -> list[str]:
    """The food101 spec on the development set, one worker with the GPU, the recipe otherwise as shipped."""
    classes = (data / "meta" / "classes.txt").read_text(encoding="utf-8").split()
    cpus = os.cpu_count() or 2
    settings = {
        "workload.data.root": str(data), "workload.data.classes": f"[{', '.join(classes)}]",
        "workload.data.image_size": "64", "workload.data.output_dir": str(scratch / "data"),
        "workload.storage_path": str(scratch / "results"), "workload.run_name": run_name or f"gpu-path-{decode}",
        "workload.train.epochs": str(epochs), "workload.train.batch_size": "64",
        "workload.train.num_workers": "1", "workload.train.cpus_per_worker": str(max(1, min(8, cpus - 2))),
        "workload.train.loader_workers": str(max(1, min(4, cpus - 3))),
        "workload.train.use_gpu": str(use_gpu).lower(), "workload.train.decode": decode,
        "workload.infer.use_gpu": str(use_gpu).lower(), "workload.infer.num_actors": "1",
        "workload.infer.cpus_per_actor": "1",
    }
    return [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]


def last_json(text: str) -> dict | list | None:
    """The JSON document a command printed last (its output may hold log lines before it)."""
    start = max(text.rfind("\n{"), text.rfind("\n["))
    for candidate in (text[start + 1:] if start >= 0 else text, text):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def run_summary(document: dict, folder: Path) -> dict:
    """What the checks need from a run: its status, its last epoch's metrics (the record's ``metrics``), the best
    validation accuracy of any epoch (the run's ``metrics.csv``), what inference measured, and the job's GPU use
    as the agent sampled it (``resource_totals`` of ``rayjobs show -o json``)."""
    from workloads.ray_train.metrics import read_metrics_csv

    totals = document.get("resource_totals") or {}
    last = document.get("metrics") or {}
    csv = folder / "metrics.csv"
    epochs = read_metrics_csv(csv) if csv.is_file() else []
    inference = folder / "inference_metrics.json"
    inferred = json.loads(inference.read_text(encoding="utf-8")) if inference.is_file() else {}
    return {"status": document.get("status"), "epochs_trained": last.get("epoch"),
            "last_val_accuracy": last.get("val_accuracy"),
            "best_val_accuracy": max((row["val_accuracy"] for row in epochs), default=None),
            "inference_accuracy": inferred.get("accuracy"), "gpu_hours": totals.get("gpu_hours"),
            "resource_samples": totals.get("samples"), "mean_gpu_util": totals.get("mean_gpu_util"),
            "peak_gpu_mem_bytes": totals.get("peak_gpu_mem_bytes"), "resource_totals": totals}


def decoded_pixels_check(photos: Path, out: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """On the card: a batch's files as views into one tensor decode to the pixels of the files as tensors of
    their own, to the bit; and how far nvJPEG's pixels lie from libjpeg-turbo's on the CPU."""
    program = f"""
import json, pathlib, torch
from workloads.vision.images import ImageLayout, decode_batch, decode_jpegs_on, square_jpeg_from_bytes
from workloads.vision.reading.torch_dataset import EncodedCollate
jpegs = [square_jpeg_from_bytes(path.read_bytes(), 224, 90) for path in sorted(pathlib.Path({str(photos)!r}).rglob("*.jpg"))]
layout, cuda = ImageLayout.photos(224), torch.device("cuda")
files, _ = EncodedCollate()([(data, 0) for data in jpegs])
views = decode_jpegs_on(cuda, files.files(), layout).cpu()
apart = decode_jpegs_on(cuda, [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in jpegs], layout).cpu()
difference = (views.int() - decode_batch(jpegs, layout).int()).abs()
print(json.dumps({{"photos": len(jpegs), "views_equal_apart": torch.equal(views, apart),
                  "mean_levels_from_cpu": difference.float().mean().item(), "max_levels_from_cpu": difference.max().item()}}))
"""
    return run_part("pixels", [sys.executable, "-c", program], out, env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the 64 px development set (official layout)")
    parser.add_argument("--photos", type=Path, required=True, help="real photos for gpu_feed.py (512 px sample)")
    parser.add_argument("--out", type=Path, required=True, help="where the logs, JSON and summary go")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--parts", nargs="+", default=["pixels", "decode", "throughput", "feed"],
                        choices=["pixels", "decode", "throughput", "feed"])
    parser.add_argument("--decodes", nargs="+", default=["device", "loader"], choices=["device", "loader"],
                        help="the ways of decoding part 1 trains with (both, for the learning check)")
    parser.add_argument("--cpu-check", action="store_true", help="the harness on a CPU; no GPU figure")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A folder of its own, and a home and rayjobs state inside it: the `cluster down` at the end stops only the
    # cluster this script started, never one a RAYJOBS_HOME of the caller's names.
    scratch = Path(tempfile.mkdtemp(prefix="gpu-path-"))
    home = scratch / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAYJOBS_HOME": str(scratch / "rayjobs"),
           "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PYTHONUNBUFFERED": "1"}
    try:
        return run_parts(args, scratch, env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_parts(args: argparse.Namespace, scratch: Path, env: dict[str, str]) -> int:
    """The parts ``args`` names, in order, with ``scratch`` for their data, results and cluster; the exit status."""
    use_gpu = not args.cpu_check
    summary: dict = {"cpu_check": args.cpu_check}
    started = time.monotonic()

    def save() -> None:
        # After every part: a run cut short by its time limit still leaves what it measured.
        summary["seconds"] = round(time.monotonic() - started)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")

    checks: dict[str, bool] = {}
    if "pixels" in args.parts and use_gpu:
        code, text, _ = decoded_pixels_check(args.photos, args.out, env)
        pixels = last_json(text) if code == 0 else None
        summary["pixels"] = pixels if isinstance(pixels, dict) else {"exit": code}
        checks["views_decode_as_separate_files"] = bool(isinstance(pixels, dict) and pixels.get("views_equal_apart"))
        save()

    if "decode" in args.parts:
        runs = {}
        epochs = 2 if args.cpu_check else args.epochs
        try:
            # Preprocessed once, first, so that neither timed job carries it.
            run_part("preprocess", rayjobs("submit", "--local", "specs/food101.yaml", "--raw",
                                           *spec_settings(args.data, scratch, "loader", epochs, use_gpu,
                                                          run_name="gpu-path-preprocess"),
                                           "--set", "workload.stages=[preprocess]"), args.out, env)
            for decode in args.decodes:
                if args.cpu_check and decode == "device":
                    continue
                code, text, seconds = run_part(
                    f"submit_{decode}", rayjobs("submit", "--local", "specs/food101.yaml", "--raw",
                                                *spec_settings(args.data, scratch, decode, epochs, use_gpu),
                                                "--set", "workload.stages=[train, infer]"),
                    args.out, env)
                runs[decode] = {"exit": code, "seconds": round(seconds)}
                folder = scratch / "results" / f"gpu-path-{decode}"
                show_code, shown, _ = run_part(f"show_{decode}", rayjobs("show", str(folder), "-o", "json"), args.out, env)
                document = last_json(shown) if show_code == 0 else None
                if isinstance(document, dict):
                    (args.out / f"record_{decode}.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
                    runs[decode].update(run_summary(document, folder))
                summary["decode"] = runs
                save()
            folders = [str(scratch / "results" / f"gpu-path-{decode}") for decode in runs]
            if len(folders) == 2:
                run_part("compare", rayjobs("compare", *folders, "--plot", str(args.out / "compare.png")), args.out, env)
        finally:
            run_part("cluster_down", rayjobs("cluster", "down"), args.out, env)
        summary["decode"] = runs
        checks["every_run_succeeded"] = bool(runs) and all(
            run.get("exit") == 0 and run.get("status") == "SUCCEEDED" and run.get("epochs_trained") == epochs
            for run in runs.values())
        accuracies = [run.get("last_val_accuracy") for run in runs.values()]
        if not args.cpu_check:
            chance = 1 / len((args.data / "meta" / "classes.txt").read_text(encoding="utf-8").split())
            checks["learn_alike"] = (len(accuracies) == 2 and all(isinstance(value, float) for value in accuracies)
                                     and min(accuracies) >= CHANCE_TIMES * chance
                                     and abs(accuracies[0] - accuracies[1]) <= ALIKE_POINTS)
            checks["gpu_use_in_every_record"] = bool(runs) and all(
                (run.get("resource_samples") or 0) >= 2 and (run.get("gpu_hours") or 0) > 0
                and (run.get("peak_gpu_mem_bytes") or 0) > 0 for run in runs.values())

    if "throughput" in args.parts:
        command = [sys.executable, "benchmarks/gpu_throughput.py", "--data", str(args.data), "--batch",
                   "64" if args.cpu_check else "256", "--epochs", "4", "--json", str(args.out / "gpu_throughput.json")]
        if args.cpu_check:
            command += ["--device", "cpu", "--size", "64", "--steps", "4", "--warmup", "1",
                        "--loader-workers", "1"]
        code, _, seconds = run_part("gpu_throughput", command, args.out, env)
        summary["gpu_throughput"] = {"exit": code, "seconds": round(seconds)}
        checks["throughput_ran"] = code == 0
        save()

    if "feed" in args.parts and use_gpu:
        code, _, seconds = run_part("gpu_feed", [sys.executable, "benchmarks/gpu_feed.py", "--photos", str(args.photos),
                                                 "--json", str(args.out / "gpu_feed.json")], args.out, env)
        summary["gpu_feed"] = {"exit": code, "seconds": round(seconds)}
        checks["feed_ran"] = code == 0

    summary["checks"] = checks
    save()
    print(json.dumps(summary, indent=1))
    failed = sorted(name for name, held in checks.items() if not held)
    if failed:
        print(f"gpu_path: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
