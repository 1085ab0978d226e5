"""Throughput of the preprocess stage: Ray tasks on N CPUs vs a single-process PIL loop.

Both do the same work on the same inputs: read each JPEG, decode (with draft),
resize + centre-crop, re-encode, and write Parquet parts. The parallel figure is
the whole ``run_preprocess`` call (listing and fingerprinting included); the
serial figure is a plain loop with the same image and Parquet functions. A plain
multiprocessing pool doing the same work is timed as well: on a shared machine it
shows how much parallel speed-up the hardware allows at that moment. Each variant is
warmed up once, then the runs alternate their order; medians are reported with the
lowest and highest run.

    PYTHONPATH=. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python benchmarks/preprocess_throughput.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from benchmarks.common import (Result, Spread, Stamp, add_json_option, alternate, plural,  # noqa: E402
                               start_private_ray)
from tests.support.images import photo_like_jpeg  # noqa: E402
from workloads.vision.preprocess import stage as preprocess  # noqa: E402
from workloads.vision.preprocess import writing as dataset_format  # noqa: E402
from workloads.vision.config import DataConfig  # noqa: E402
from workloads.vision.images import square_jpeg_from_bytes  # noqa: E402
from workloads.vision.sources.photos import list_source  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "food101-sample"
SAMPLE_CLASSES = ["pizza", "hamburger", "sushi", "ramen", "steak", "burrito"]


def make_inputs(root: Path, images: int, classes: int) -> list[str]:
    """Write ``images`` photo-like 512x384 JPEGs in an ImageFolder tree; return the class names."""
    names = [f"class_{i}" for i in range(classes)]
    for index in range(images):
        folder = root / names[index % classes]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:05d}.jpg").write_bytes(photo_like_jpeg((512, 384), seed=index))
    return names


def serial_run(data: DataConfig, out: Path) -> int:
    """Single process: the same decode/resize/crop/encode and Parquet writes, no Ray."""
    listing = list_source(data)
    shutil.rmtree(out, ignore_errors=True)
    written = 0
    for split in ("train", "val"):
        (out / split).mkdir(parents=True)
        columns = {name: [] for name in dataset_format.PARQUET_SCHEMA.names}
        part = 0
        items = [i for i in listing.items if i.split == split]
        for n, item in enumerate(items, 1):
            columns["image"].append(square_jpeg_from_bytes(item.file.read_bytes(), data.image_size, data.jpeg_quality))
            columns["label"].append(item.label)
            columns["class_name"].append(listing.classes[item.label])
            columns["split"].append(split)
            columns["path"].append(item.path)
            if len(columns["image"]) == data.rows_per_file or n == len(items):
                table = pa.table(columns, schema=dataset_format.PARQUET_SCHEMA)
                dataset_format.write_part(out / split / f"part-{part:05d}.parquet", table, data.rows_per_file)
                written += table.num_rows
                part += 1
                columns = {name: [] for name in dataset_format.PARQUET_SCHEMA.names}
    return written


def _encode_files(args: tuple[list[str], int, int]) -> list[bytes]:
    paths, size, quality = args
    return [square_jpeg_from_bytes(Path(p).read_bytes(), size, quality) for p in paths]


def pool_run(data: DataConfig, out: Path, pool) -> int:
    """Plain multiprocessing (no Ray) over the same chunks: the machine's own ceiling for N processes."""
    listing = list_source(data)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    items = listing.items
    chunks = [items[i : i + 25] for i in range(0, len(items), 25)]
    encoded = pool.map(_encode_files, [([i.path for i in c], data.image_size, data.jpeg_quality) for c in chunks])
    images = [jpeg for chunk in encoded for jpeg in chunk]
    for n in range(0, len(images), data.rows_per_file):
        rows = items[n : n + data.rows_per_file]
        table = pa.table(
            {
                "image": images[n : n + data.rows_per_file],
                "label": [i.label for i in rows],
                "class_name": [listing.classes[i.label] for i in rows],
                "split": [i.split for i in rows],
                "path": [i.path for i in rows],
            },
            schema=dataset_format.PARQUET_SCHEMA,
        )
        dataset_format.write_part(out / f"part-{n // data.rows_per_file:05d}.parquet", table, data.rows_per_file)
    return len(images)


def parallel_run(data: DataConfig) -> int:
    """The workload's own ``run_preprocess`` on Ray; the rows it wrote."""
    with contextlib.redirect_stdout(io.StringIO()):
        info = preprocess.run_preprocess(data, progress=False)
    return info.counts["train"] + info.counts["val"]


def _parent_pid() -> int:
    return os.getppid()


def _proc_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of /proc/<pid>/stat (11 and 12 after the name).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ray_cpu_seconds(raylet_pid: int) -> float:
    """CPU seconds used so far by this driver, its raylet and the raylet's workers (Linux /proc)."""
    total = _proc_cpu_seconds(os.getpid()) + _proc_cpu_seconds(raylet_pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == raylet_pid:
                total += _proc_cpu_seconds(int(entry.name))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=600, help="generated 512x384 JPEGs (default 600)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each variant, alternating (default 3)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs given to the local Ray instance (default 2)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--sample", action="store_true", help=f"use the real Food-101 sample at {SAMPLE} (96 images)")
    parser.add_argument("--worker-niceness", type=int, default=0, help="nice level of Ray workers (Ray's default is 15)")
    add_json_option(parser)
    args = parser.parse_args()

    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    stamp = Stamp.begin()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="preprocess-bench-"))
    try:
        if args.sample:
            if not SAMPLE.is_dir():
                sys.exit(f"--sample: no Food-101 sample at {SAMPLE}")
            data = DataConfig(source="food101", root=SAMPLE, classes=SAMPLE_CLASSES, image_size=args.image_size)
            described = f"real Food-101 sample ({SAMPLE})"
        else:
            names = make_inputs(scratch / "images", args.images, classes=6)
            data = DataConfig(source="imagefolder", root=scratch / "images", classes=names, image_size=args.image_size)
            described = f"{args.images} generated 512x384 photo-like JPEGs"
        data = data.model_copy(update={"output_dir": scratch / "parallel", "force": True})
        print(f"inputs: {described}; output {args.image_size}px, JPEG q{data.jpeg_quality}", flush=True)

        # Forked before Ray starts its threads in this process.
        pool = multiprocessing.get_context("fork").Pool(args.cpus)
        start_private_ray(args.cpus)
        raylet_pid = ray.get(ray.remote(_parent_pid).remote())  # workers are children of the raylet

        def cpu_seconds(variant: str) -> float:
            if variant == "serial":
                return time.process_time()
            if variant == "pool":
                return time.process_time() + sum(_proc_cpu_seconds(c.pid) for c in multiprocessing.active_children())
            return ray_cpu_seconds(raylet_pid)

        def timed(variant: str, run) -> tuple[int, float, float]:
            started, cpu_before = time.perf_counter(), cpu_seconds(variant)
            images = run()
            return images, time.perf_counter() - started, cpu_seconds(variant) - cpu_before

        def show(index: int, last: dict) -> None:
            for variant, (images, seconds, cpu) in last.items():
                print(f"run {index + 1} {variant:<9} {images} images in {seconds:6.2f} s  "
                      f"({images / seconds:7.1f} images/s), {cpu:5.2f} CPU-s", flush=True)

        results = alternate({
            "serial": lambda: timed("serial", lambda: serial_run(data, scratch / "serial")),
            "parallel": lambda: timed("parallel", lambda: parallel_run(data)),
            "pool": lambda: timed("pool", lambda: pool_run(data, scratch / "pool", pool)),
        }, args.runs, show=show)
        ray.shutdown()
        pool.close()
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    images = results["serial"][0][0]
    result = Result("preprocess_throughput", "Preprocessing: Ray tasks vs one process",
                    ["inputs", "serial (baseline)", "rayjobs on Ray", "plain process pool", "Ray / serial",
                     "pool / serial", "Ray CPU / serial CPU"], [], stamp)
    seconds = {v: result.figure(f"{v}_s", Spread.of([r[1] for r in runs]), "s") for v, runs in results.items()}
    cpu = {v: result.figure(f"{v}_cpu_s", Spread.of([r[2] for r in runs]), "CPU-s") for v, runs in results.items()}
    rate = {v: Spread.of([images / r[1] for r in runs]) for v, runs in results.items()}
    serial_s = [r[1] for r in results["serial"]]
    speedup = {v: result.figure(f"{v}_speedup", Spread.ratio(serial_s, [r[1] for r in results[v]]), "x")
               for v in ("parallel", "pool")}
    cost = result.figure("cpu_cost", Spread.ratio([r[2] for r in results["parallel"]],
                                                  [r[2] for r in results["serial"]]), "x")
    print(f"\nmedian of {args.runs} runs ({images} images, {args.cpus} CPUs for Ray):")
    for variant in results:
        print(f"  {variant:<9} {seconds[variant].text(2)} s  {rate[variant].text(1)} images/s  "
              f"{cpu[variant].text(2)} CPU-s")
    print(f"  speed-up parallel / serial: {speedup['parallel'].text(2)}x (wall clock)")
    # On a busy machine wall clock measures the neighbours as much as the code;
    # CPU-seconds show what the parallel pipeline costs on top of the real work.
    print(f"  CPU cost parallel / serial: {cost.text(2)}x "
          f"(ideal speed-up on {args.cpus} idle cores ≈ {args.cpus / cost.median:.2f}x)")
    print(f"  speed-up pool / serial: {speedup['pool'].text(2)}x "
          "(plain processes, no Ray: what this machine allows now)")

    def cell(variant: str) -> str:
        return f"{seconds[variant].text(2, ' s')}, {rate[variant].median:.1f} images/s"

    result.rows.append([f"{described}, {plural(args.runs, 'run')}, {args.cpus} CPUs", cell("serial"), cell("parallel"),
                        cell("pool"), speedup["parallel"].times(), speedup["pool"].times(), cost.text(2, "×")])
    result.save(args.json)


if __name__ == "__main__":
    main()
