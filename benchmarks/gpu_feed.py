"""What feeds a GPU fast enough: the bare training step against the two ways of getting photos to it.

    python benchmarks/gpu_feed.py [--photos DIR] [--batches 64 256] [--loader-workers 7 15] [--json PATH]

By hand, on a machine with a CUDA GPU (``run_all.py`` runs on CPUs; without a GPU this exits 0 with
a line saying so). Ray is not needed: it runs the workload's own pixel code
(``workloads/vision/images.py``) and model (``workloads/vision/training/resnet.py``) with the
training loop's settings (bf16 autocast, channels_last, fused AdamW, label smoothing 0.1) on real
photos made into the preprocess stage's square JPEGs. For each global batch, side by side:

- the bare step, on tensors already on the GPU: the baseline;
- a DataLoader whose worker processes decode and augment on the CPU, as the workload does now;
- the JPEGs decoded on the GPU (nvJPEG through ``torchvision.io.decode_jpeg``), cropped, flipped and
  normalized there.

Each rate is over the timed steps after a warm-up; utilisation is ``nvidia-smi`` sampled every
200 ms over the steady three quarters of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from benchmarks.gpu_throughput import GpuSampler, training_step  # noqa: E402
from workloads.vision.images import (ImageLayout, augment_batch, decode_batch, decode_jpegs_on, normalize,  # noqa: E402
                                     square_jpeg_from_bytes)

DEFAULT_PHOTOS = REPO_ROOT.parent / "shared" / "data" / "food101-sample" / "images"


class CpuBatches(torch.utils.data.Dataset):
    """Batch ``i`` decoded, cropped, flipped and normalized on the CPU, one thread per loader process."""

    def __init__(self, jpegs: list[bytes], layout: ImageLayout, batch: int, count: int):
        self.jpegs, self.layout, self.batch, self.count = jpegs, layout, batch, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        torch.set_num_threads(1)
        column = [self.jpegs[(index * self.batch + k) % len(self.jpegs)] for k in range(self.batch)]
        return normalize(augment_batch(decode_batch(column, self.layout), "crop_flip"), self.layout, torch.channels_last)


def timed(step, next_images, warmup: int, steps: int, batch: int) -> dict:
    """Images per second over ``steps`` after ``warmup`` steps, with the GPU's utilisation meanwhile."""
    for _ in range(warmup):
        step(next_images())
    torch.cuda.synchronize()
    with GpuSampler() as gpu:
        start, since = time.perf_counter(), time.monotonic()
        for _ in range(steps):
            step(next_images())
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {"images_s": batch * steps / seconds, **gpu.steady_from(since)}


def measure(jpegs: list[bytes], layout: ImageLayout, batch: int, loader_workers: list[int], warmup: int,
            steps: int) -> list[dict]:
    """The rows of one global batch: the bare step, each CPU loader, and decoding on the GPU."""

    rows = []
    resident = torch.randn(batch, 3, layout.height, layout.width, device="cuda").contiguous(
        memory_format=torch.channels_last)
    rows.append({"feed": "bare step, tensors already on the GPU",
                 **timed(training_step(batch, "cuda"), lambda: resident, warmup, steps, batch)})
    for workers in loader_workers:
        loader = torch.utils.data.DataLoader(CpuBatches(jpegs, layout, batch, warmup + steps), batch_size=None,
                                             num_workers=workers, pin_memory=True, prefetch_factor=4)
        batches = iter(loader)
        rows.append({"feed": f"CPU decode and augment, {workers} loader processes",
                     **timed(training_step(batch, "cuda"), lambda: next(batches).cuda(non_blocking=True),
                             warmup, steps, batch)})
    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in jpegs]
    counter = iter(range(10 ** 9))
    device = torch.device("cuda")

    def decoded_on_gpu() -> torch.Tensor:
        # The workload's own path with decode: device (workloads/vision/reading/batches.py).
        index = next(counter)
        column = [encoded[(index * batch + k) % len(encoded)] for k in range(batch)]
        return normalize(augment_batch(decode_jpegs_on(device, column, layout), "crop_flip"), layout,
                         torch.channels_last)

    rows.append({"feed": "nvJPEG decode, crop, flip and normalize on the GPU",
                 **timed(training_step(batch, "cuda"), decoded_on_gpu, warmup, steps, batch)})
    bare = rows[0]["images_s"]
    for row in rows:
        row["batch"] = batch
        row["vs_bare"] = row["images_s"] / bare
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS, help="a folder of real photos (JPEG), searched whole")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--loader-workers", type=int, nargs="+", default=[7, 15])
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_feed: skipped, no CUDA GPU here")
        return 0
    photos = sorted(path for path in args.photos.rglob("*.jpg"))
    if not photos:
        print(f"gpu_feed: no *.jpg under {args.photos}", file=sys.stderr)
        return 2
    layout = ImageLayout.photos(args.size)
    jpegs = [square_jpeg_from_bytes(path.read_bytes(), args.size, 90) for path in photos]

    torch.set_num_threads(1)
    one_process = CpuBatches(jpegs, layout, 64, 7)
    one_process[0]
    start = time.perf_counter()
    for index in range(1, 7):
        one_process[index]
    cpu_rate = 64 * 6 / (time.perf_counter() - start)
    torch.set_num_threads(os.cpu_count() or 1)

    print(f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs, torch {torch.__version__}; {len(jpegs)} photos "
          f"as {args.size} px JPEGs; one CPU process decodes and augments {cpu_rate:.0f} images/s")
    rows = []
    for batch in args.batches:
        rows += measure(jpegs, layout, batch, args.loader_workers, args.warmup, args.steps)
    print("| global batch | what feeds the step | images/s | × bare step | GPU utilisation | memory in use |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['batch']} | {row['feed']} | {row['images_s']:,.0f} | {row['vs_bare']:.2f} | "
              f"{row['utilisation']:.0f} % | {row['memory_mib']:,.0f} MiB |")
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count(),
                                         "torch": torch.__version__, "photos": len(jpegs),
                                         "cpu_one_process_images_s": cpu_rate, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
