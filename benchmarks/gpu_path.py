"""The GPU path, proven in one run: the food101 spec trained on a GPU both ways of decoding, and the feed measured.

    PYTHONPATH=. python benchmarks/gpu_path.py --data DIR --photos DIR --out DIR [--epochs 12]

By hand, on a machine with a CUDA GPU (``run_all.py`` runs on CPUs). In order, each part in its own process so
that one that fails leaves the others their say, everything it prints kept under ``--out``:

1. ``rayjobs submit --local specs/food101.yaml`` twice on the 64 px development set, one GPU worker, the same
   recipe, once with ``decode: device`` (nvJPEG, crops and flips on the card) and once with ``decode: loader``
   (DataLoader processes): both must learn alike (each at least 2.5× chance, within 8 points of each other
   on the 500 held-out photos). Each run's record must hold the job's GPU use sampled through NVML by the
   agent (``rayjobs show RUN -o json``: ``resource_totals`` with GPU hours and peak GPU memory above zero);
   ``rayjobs compare`` draws both runs' curves into ``compare.png``;
2. ``gpu_throughput.py --batch 256``: the workload's training pass against the bare bf16 step on the card;
3. ``gpu_feed.py``: the bare step against a CPU DataLoader and nvJPEG on the card, on real photos.

``--cpu-check`` runs parts 1 and 2 on the CPU with two epochs, to check the harness on a machine without a
GPU; its figures prove nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHANCE_TIMES = 2.5
ALIKE_POINTS = 0.08


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


def spec_settings(data: Path, scratch: Path, decode: str, epochs: int, use_gpu: bool) -> list[str]:
    """The food101 spec on the development set, one worker with the GPU, the recipe otherwise as shipped."""
    classes = (data / "meta" / "classes.txt").read_text(encoding="utf-8").split()
    cpus = os.cpu_count() or 2
    settings = {
        "workload.data.root": str(data), "workload.data.classes": f"[{', '.join(classes)}]",
        "workload.data.image_size": "64", "workload.data.output_dir": str(scratch / "data"),
        "workload.storage_path": str(scratch / "results"), "workload.run_name": f"gpu-path-{decode}",
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


def run_summary(document: dict) -> dict:
    """What the check needs from ``rayjobs show -o json``: status, best held-out accuracy, GPU use."""
    totals = document.get("resource_totals") or {}
    best = None
    for attempt in document.get("attempts") or []:
        for key in ("best_metrics", "final_metrics", "metrics"):
            metrics = attempt.get(key) or {}
            for name in ("val_accuracy", "accuracy", "val_acc"):
                if isinstance(metrics.get(name), (int, float)):
                    best = max(best or 0.0, float(metrics[name]))
    for key in ("best_metrics", "final_metrics", "metrics", "result"):
        metrics = document.get(key) or {}
        if isinstance(metrics, dict):
            for name in ("val_accuracy", "accuracy", "val_acc"):
                if isinstance(metrics.get(name), (int, float)):
                    best = max(best or 0.0, float(metrics[name]))
    return {"status": document.get("status"), "best_val_accuracy": best, "gpu_hours": totals.get("gpu_hours"),
            "mean_gpu_util": totals.get("mean_gpu_util"), "peak_gpu_mem_bytes": totals.get("peak_gpu_mem_bytes"),
            "resource_totals": totals}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the 64 px development set (official layout)")
    parser.add_argument("--photos", type=Path, required=True, help="real photos for gpu_feed.py (512 px sample)")
    parser.add_argument("--out", type=Path, required=True, help="where the logs, JSON and summary go")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--parts", nargs="+", default=["decode", "throughput", "feed"],
                        choices=["feed", "decode", "throughput"])
    parser.add_argument("--decodes", nargs="+", default=["device", "loader"], choices=["device", "loader"],
                        help="the ways of decoding part 1 trains with (both, for the learning check)")
    parser.add_argument("--cpu-check", action="store_true", help="the harness on a CPU; no GPU figure")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu-path-{os.getpid()}"
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1"}
    use_gpu = not args.cpu_check
    summary: dict = {"cpu_check": args.cpu_check}
    started = time.monotonic()

    def save() -> None:
        # After every part: a run cut short by its time limit still leaves what it measured.
        summary["seconds"] = round(time.monotonic() - started)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")

    if "decode" in args.parts:
        runs = {}
        try:
            for decode in args.decodes:
                if args.cpu_check and decode == "device":
                    continue
                code, text, seconds = run_part(
                    f"submit_{decode}", rayjobs("submit", "--local", "specs/food101.yaml", "--raw",
                                                *spec_settings(args.data, scratch, decode,
                                                               2 if args.cpu_check else args.epochs, use_gpu)),
                    args.out, env)
                runs[decode] = {"exit": code, "seconds": round(seconds)}
                folder = scratch / "results" / f"gpu-path-{decode}"
                show_code, shown, _ = run_part(f"show_{decode}", rayjobs("show", str(folder), "-o", "json"), args.out, env)
                document = last_json(shown) if show_code == 0 else None
                if isinstance(document, dict):
                    (args.out / f"record_{decode}.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
                    runs[decode].update(run_summary(document))
                summary["decode"] = runs
                save()
            folders = [str(scratch / "results" / f"gpu-path-{decode}") for decode in runs]
            if len(folders) == 2:
                run_part("compare", rayjobs("compare", *folders, "--plot", str(args.out / "compare.png")), args.out, env)
        finally:
            run_part("cluster_down", rayjobs("cluster", "down"), args.out, env)
        summary["decode"] = runs
        accuracies = [run.get("best_val_accuracy") for run in runs.values()]
        if len(accuracies) == 2 and all(isinstance(value, float) for value in accuracies):
            chance = 1 / len((args.data / "meta" / "classes.txt").read_text(encoding="utf-8").split())
            summary["learn_alike"] = (min(accuracies) >= CHANCE_TIMES * chance
                                      and abs(accuracies[0] - accuracies[1]) <= ALIKE_POINTS)
        summary["gpu_sampled_in_records"] = all((run.get("gpu_hours") or 0) > 0 and (run.get("peak_gpu_mem_bytes") or 0) > 0
                                                for run in runs.values()) and bool(runs)

    if "throughput" in args.parts:
        command = [sys.executable, "benchmarks/gpu_throughput.py", "--data", str(args.data), "--batch",
                   "64" if args.cpu_check else "256", "--epochs", "4", "--json", str(args.out / "gpu_throughput.json")]
        if args.cpu_check:
            command += ["--device", "cpu", "--size", "64", "--steps", "4", "--warmup", "1",
                        "--loader-workers", "1"]
        code, _, seconds = run_part("gpu_throughput", command, args.out, env)
        summary["gpu_throughput"] = {"exit": code, "seconds": round(seconds)}
        save()

    if "feed" in args.parts and use_gpu:
        code, _, seconds = run_part("gpu_feed", [sys.executable, "benchmarks/gpu_feed.py", "--photos", str(args.photos),
                                                 "--json", str(args.out / "gpu_feed.json")], args.out, env)
        summary["gpu_feed"] = {"exit": code, "seconds": round(seconds)}

    save()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
