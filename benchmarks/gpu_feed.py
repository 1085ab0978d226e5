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
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from workloads.vision.images import ImageLayout, augment_batch, decode_batch, normalize, square_jpeg_from_bytes  # noqa: E402

DEFAULT_PHOTOS = REPO_ROOT.parent / "shared" / "data" / "food101-sample" / "images"


def load_resnet_module():
    """``resnet.py`` by its path: the training package's ``__init__`` chain would import Ray."""
    spec = importlib.util.spec_from_file_location("workload_resnet", REPO_ROOT / "workloads/vision/training/resnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GpuSampler:
    """``nvidia-smi``'s utilisation and memory in use, sampled every 200 ms while the block runs."""

    def __enter__(self) -> "GpuSampler":
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, text=True)
        self.samples: list[tuple[float, float]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                utilisation, memory = (float(value) for value in line.split(","))
            except ValueError:
                continue
            self.samples.append((utilisation, memory))

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait()
        steady = self.samples[len(self.samples) // 4:] or self.samples
        self.utilisation = float(np.mean([sample[0] for sample in steady])) if steady else float("nan")
        self.memory_mib = max((sample[1] for sample in steady), default=float("nan"))


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


def training_step(resnet, batch: int):
    """One bf16 training step of a fresh ResNet-18 with the workload's loop settings."""
    model = resnet.ResNet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    labels = torch.randint(0, 10, (batch,), device="cuda")

    def step(images: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def timed(step, next_images, warmup: int, steps: int, batch: int) -> dict:
    """Images per second over ``steps`` after ``warmup`` steps, with the GPU's utilisation meanwhile."""
    for _ in range(warmup):
        step(next_images())
    torch.cuda.synchronize()
    with GpuSampler() as gpu:
        start = time.perf_counter()
        for _ in range(steps):
            step(next_images())
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {"images_s": batch * steps / seconds, "utilisation": gpu.utilisation, "memory_mib": gpu.memory_mib}


def gpu_crop_flip(images: torch.Tensor) -> torch.Tensor:
    """The workload's ``crop_flip`` with its random boxes drawn on the device, so nothing waits on the CPU."""
    from torchvision.ops import roi_align

    n, _, height, width = images.shape
    device = images.device
    area = torch.empty(n, device=device).uniform_(0.6, 1.0) * height * width
    aspect = torch.exp(torch.empty(n, device=device).uniform_(float(np.log(3 / 4)), float(np.log(4 / 3))))
    crop_w = torch.sqrt(area * aspect).clamp(1, width)
    crop_h = torch.sqrt(area / aspect).clamp(1, height)
    x0 = torch.rand(n, device=device) * (width - crop_w)
    y0 = torch.rand(n, device=device) * (height - crop_h)
    boxes = torch.stack([torch.arange(n, device=device, dtype=torch.float32), x0, y0, x0 + crop_w, y0 + crop_h], dim=1)
    crops = roi_align(images.float(), boxes, output_size=(height, width), spatial_scale=1.0, sampling_ratio=1,
                      aligned=True)
    flip = torch.rand(n, device=device) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(3), crops)


def measure(jpegs: list[bytes], layout: ImageLayout, batch: int, loader_workers: list[int], warmup: int,
            steps: int) -> list[dict]:
    """The rows of one global batch: the bare step, each CPU loader, and decoding on the GPU."""
    from torchvision.io import decode_jpeg

    resnet = load_resnet_module()
    rows = []
    resident = torch.randn(batch, 3, layout.height, layout.width, device="cuda").contiguous(
        memory_format=torch.channels_last)
    rows.append({"feed": "bare step, tensors already on the GPU",
                 **timed(training_step(resnet, batch), lambda: resident, warmup, steps, batch)})
    for workers in loader_workers:
        loader = torch.utils.data.DataLoader(CpuBatches(jpegs, layout, batch, warmup + steps), batch_size=None,
                                             num_workers=workers, pin_memory=True, prefetch_factor=4)
        batches = iter(loader)
        rows.append({"feed": f"CPU decode and augment, {workers} loader processes",
                     **timed(training_step(resnet, batch), lambda: next(batches).cuda(non_blocking=True),
                             warmup, steps, batch)})
    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in jpegs]
    mean = torch.tensor(layout.mean, device="cuda").view(1, -1, 1, 1) * 255
    std = torch.tensor(layout.std, device="cuda").view(1, -1, 1, 1) * 255
    counter = iter(range(10 ** 9))

    def decoded_on_gpu() -> torch.Tensor:
        index = next(counter)
        column = [encoded[(index * batch + k) % len(encoded)] for k in range(batch)]
        images = gpu_crop_flip(torch.stack(decode_jpeg(column, device="cuda")))
        return ((images - mean) / std).contiguous(memory_format=torch.channels_last)

    rows.append({"feed": "nvJPEG decode, crop, flip and normalize on the GPU",
                 **timed(training_step(resnet, batch), decoded_on_gpu, warmup, steps, batch)})
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
