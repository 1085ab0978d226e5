"""What a job uses while it runs, sampled beside it: CPU, memory and GPUs of the job's own processes.

Every ``every_s`` seconds (``RAYJOBS_RESOURCES_EVERY_S``, default 10; 0 turns sampling off) the agent
writes a ``resources`` event: CPU cores in use, resident memory, and where the job's processes hold GPUs,
each GPU's utilisation and the memory the job holds on it. The event lands in the log and so in the
record, append-only like every event, and the live view shows the last one.

*Which processes.* The job's own, not the machine's: the entrypoint's process tree (the driver and what it
starts), and every Ray worker process Ray started for this job, which Ray marks with the job's id in its
environment (``RAY_JOB_ID``; the job's id is read off its driver, whose open core-worker log is named after
it, so no sample asks the cluster anything). Whole-machine figures would count other jobs on a shared cluster and Ray's
own daemons, and say nothing about this run. They are read from ``/proc`` on the agent's node: cheap (a
few milliseconds per sample), with no process of its own and no cluster call per sample. Every node of a
local cluster shares that ``/proc``; on a cluster whose nodes are other machines, the processes there are
not seen, which one line says once Ray Train places workers there. GPUs are read through NVML (the binding Ray ships): per
device utilisation and, per process, the memory it holds.

Ray's dashboard agent also samples worker processes, but it lists only the raylet's direct children as it
last saw them (seconds stale, and in this Ray often only its own agents), not the driver: it was tried
and measured less of the job than ``/proc`` does.

What a process used after the last sample before it ended is gone with it from ``/proc`` (its parent, often
Ray's raylet, is charged with it), so CPU totals are a lower bound: short by up to one interval per process
that ends.

Sampling is a courtesy: whatever fails is said once and sampling stops; the job never notices.
The totals (:class:`ResourceUsage`) are one rule for the record keeper, ``rayjobs show`` and ``rayjobs ui``.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import emit
from .vocabulary import EventKind, kind_of
from .wire import OWN_LINE_PREFIX

EVERY_S_ENV_VAR = "RAYJOBS_RESOURCES_EVERY_S"
DEFAULT_EVERY_S = 10.0
# The first sample comes sooner, so that a short job and the live view have one early.
FIRST_SAMPLE_S = 3.0
# Prices for ``rayjobs show``'s cost (per CPU core·hour and per GPU·hour, in the user's currency).
CPU_PRICE_ENV_VAR = "RAYJOBS_PRICE_CPU_HOUR"
GPU_PRICE_ENV_VAR = "RAYJOBS_PRICE_GPU_HOUR"
_JOB_ID_VARIABLE = b"RAY_JOB_ID="
_GIB = 1024 ** 3


def sampling_every_s(environ: Mapping[str, str]) -> float | None:
    """Seconds between samples for this job; None when sampling is off (0, or a value that is no number)."""
    text = environ.get(EVERY_S_ENV_VAR)
    if text is None or not text.strip():
        return DEFAULT_EVERY_S
    try:
        every_s = float(text)
    except ValueError:
        return None
    return every_s if every_s > 0 else None


# --------------------------------------------------------------------------- reading /proc


@dataclass
class _Process:
    started: int  # ticks after boot: a pid reused by another process is another process
    cpu_ticks: int


class ProcessTable:
    """The processes of this machine as ``/proc`` shows them: parents, CPU ticks, memory, Ray job ids."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.page_bytes = os.sysconf("SC_PAGE_SIZE")
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._job_of: dict[tuple[int, int], str | None] = {}  # (pid, started) -> RAY_JOB_ID, read once per process

    def read(self) -> tuple[dict[int, int], dict[int, _Process]]:
        """Every process's parent, and its start and CPU ticks."""
        parents: dict[int, int] = {}
        processes: dict[int, _Process] = {}
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                with open(f"{self.proc}/{pid}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue  # it ended while the table was read
            # The command name may hold spaces and parentheses: the fields start after its last ")".
            fields = stat[stat.rfind(b")") + 2:].split()
            try:
                parents[pid] = int(fields[1])
                processes[pid] = _Process(int(fields[19]), int(fields[11]) + int(fields[12]))
            except (IndexError, ValueError):
                continue
        return parents, processes

    def memory_bytes(self, pid: int) -> int:
        """The resident memory of ``pid`` with each page it shares counted in part (Linux's PSS): summed over a job's
        processes, the pages they share (Ray's object store, mapped into every worker; the libraries they all
        load) count once, where RSS would count them in every process. RSS where PSS cannot be read; 0 once gone."""
        try:
            with open(f"{self.proc}/{pid}/smaps_rollup", "rb") as handle:
                for line in handle:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"{self.proc}/{pid}/statm", "rb") as handle:
                return int(handle.read().split()[1]) * self.page_bytes
        except (OSError, ValueError, IndexError):
            return 0

    def job_of(self, pid: int, started: int) -> str | None:
        """The Ray job a worker process was started for (its ``RAY_JOB_ID``), or None for any other process."""
        key = (pid, started)
        if key not in self._job_of:
            try:
                with open(f"{self.proc}/{pid}/environ", "rb") as handle:
                    environ = handle.read()
            except OSError:
                return None  # gone, or not ours to read: asked again next time
            job = None
            for entry in environ.split(b"\0"):
                if entry.startswith(_JOB_ID_VARIABLE):
                    job = entry[len(_JOB_ID_VARIABLE):].decode(errors="replace")
                    break
            self._job_of[key] = job
        return self._job_of[key]

    def forget_except(self, alive: Iterable[tuple[int, int]]) -> None:
        """Drop what is known of processes that have ended."""
        keep = set(alive)
        for key in [key for key in self._job_of if key not in keep]:
            del self._job_of[key]


def descendants(parents: Mapping[int, int], root: int) -> set[int]:
    """Every process below ``root`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    waiting = list(children.get(root, []))
    while waiting:
        pid = waiting.pop()
        if pid not in found:
            found.add(pid)
            waiting.extend(children.get(pid, []))
    return found


class JobProcesses:
    """The CPU and memory of one job's processes on this machine, sample after sample."""

    def __init__(self, root: int, job_id: Callable[[], str | None] | None = None, table: ProcessTable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        # The job's Ray id: given, or read off its driver once the driver has connected to Ray.
        self.job_id = job_id or self._driver_job_id
        self._found_job_id: str | None = None
        self._tree: set[int] = set()
        self.table = table or ProcessTable()
        self.clock = clock
        self._last: dict[int, _Process] = {}
        self._last_at: float | None = None
        self._boot_ticks_now: Callable[[], float] = _ticks_since_boot(self.table.ticks_per_s)

    def sample(self) -> dict[str, Any]:
        """``cpu`` (cores in use since the last sample), ``rss_bytes`` and ``processes`` of the job, and ``pids``."""
        now = self.clock()
        ticks_now = self._boot_ticks_now()
        parents, processes = self.table.read()
        mine = self._tree = descendants(parents, self.root)
        job = self.job_id()
        if job:
            mine |= {pid for pid, process in processes.items()
                     if pid not in mine and self.table.job_of(pid, process.started) == job}
        used_ticks = 0
        for pid in mine:
            process = processes[pid]
            before = self._last.get(pid)
            if before is not None and before.started == process.started:
                used_ticks += process.cpu_ticks - before.cpu_ticks
            elif self._last_at is not None and ticks_now - process.started <= (now - self._last_at) * \
                    self.table.ticks_per_s:
                used_ticks += process.cpu_ticks  # it started since the last sample: all its time is new
        interval = None if self._last_at is None else now - self._last_at
        self._last = {pid: processes[pid] for pid in mine}
        self._last_at = now
        self.table.forget_except((pid, process.started) for pid, process in processes.items())
        cpu = used_ticks / self.table.ticks_per_s / interval if interval else None
        return {"cpu": cpu, "rss_bytes": sum(self.table.memory_bytes(pid) for pid in mine), "processes": len(mine),
                "pids": mine}


    def _driver_job_id(self) -> str | None:
        if self._found_job_id is None:
            for pid in self._tree:
                self._found_job_id = job_id_of_driver(pid)
                if self._found_job_id:
                    break
        return self._found_job_id


# A Ray driver keeps its core worker's log open under its worker id, which begins with its job's id (4 bytes). Read
# from /proc, so that the agent never imports Ray for it (that alone is a CPU-second and 150 MiB in every job).
_DRIVER_LOG = re.compile(r"python-core-driver-([0-9a-f]{8})[0-9a-f]*_\d+\.log$")


def job_id_of_driver(pid: int) -> str | None:
    """The Ray job id (hex, as Ray's workers carry it in ``RAY_JOB_ID``) of the driver process ``pid``, read off the
    log it keeps open; None for a process that is no connected Ray driver."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        found = _DRIVER_LOG.search(target)
        if found:
            return found[1]
    return None


def _ticks_since_boot(ticks_per_s: int) -> Callable[[], float]:
    def now() -> float:
        with open("/proc/uptime", "rb") as handle:
            return float(handle.read().split()[0]) * ticks_per_s
    return now


# --------------------------------------------------------------------------- GPUs


class Gpus:
    """Each GPU's utilisation and the memory the job's processes hold on it, through NVML."""

    def __init__(self) -> None:
        self.nvml = nvml_binding()
        self.nvml.nvmlInit()
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(index)
                        for index in range(self.nvml.nvmlDeviceGetCount())]

    def sample(self, pids: set[int]) -> dict[str, Any]:
        """The GPUs any of ``pids`` holds memory on: their count, mean utilisation (%), the job's memory on them
        and their total memory; empty when the job holds none."""
        used = utilisation = held = total = 0
        for handle in self.handles:
            running = list(self.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            mine = [process for process in running if process.pid in pids]
            if not mine:
                continue
            used += 1
            utilisation += self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            held += sum(int(process.usedGpuMemory or 0) for process in mine)
            total += int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total)
        if not used:
            return {}
        return {"gpus": used, "gpu_util": round(utilisation / used, 1), "gpu_mem_bytes": held,
                "gpu_mem_total_bytes": total}


def nvml_binding() -> Any:
    """NVML's Python binding: ``pynvml`` (nvidia-ml-py) where it is installed, else the copy Ray ships. Raises where
    the machine has no NVML library (no NVIDIA driver): then there is no GPU to sample, and nothing was imported."""
    ctypes.CDLL("libnvidia-ml.so.1")  # OSError without the driver: checked first, as importing Ray costs a CPU-second
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        from .ray_internals import ray_nvml

        return ray_nvml()
    return pynvml


# --------------------------------------------------------------------------- the sampler


class ResourceSampler:
    """Writes a ``resources`` event every ``every_s`` seconds while the entrypoint runs, in a thread of its own."""

    def __init__(self, every_s: float, job_id: Callable[[], str | None] | None = None, root: int | None = None,
                 cpus: float | None = None, other_hosts: Callable[[], int] | None = None,
                 unsaid: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.every_s = every_s
        # Where a sample goes that cannot be said in the log now (the job's last line is unfinished): the record.
        self.unsaid = unsaid
        self.log = LogEnd()
        self.processes = JobProcesses(os.getpid() if root is None else root, job_id)
        self.cpus = cpus if cpus is not None else float(len(os.sched_getaffinity(0)))
        self.other_hosts = other_hosts
        self.gpus: Gpus | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayjobs-resources", daemon=True)

    @classmethod
    def for_job(cls, environ: Mapping[str, str], other_hosts: Callable[[], int] | None = None,
                unsaid: Callable[[dict[str, Any]], None] | None = None) -> ResourceSampler | None:
        """The sampler this job's environment asks for (None when sampling is off); ``other_hosts`` says how many
        other machines run its training workers, ``unsaid`` takes the samples the log cannot."""
        every_s = sampling_every_s(environ)
        if every_s is None:
            return None
        return cls(every_s, other_hosts=other_hosts, unsaid=unsaid)

    def start(self) -> None:
        """Begin sampling (the first sample after :data:`FIRST_SAMPLE_S`, or sooner when samples are more often)."""
        self._thread.start()

    def stop(self) -> None:
        """The entrypoint has ended: no more samples."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(1.0)

    def sample(self) -> dict[str, Any] | None:
        """One sample as a ``resources`` event's fields; None for the first call (it only sets the baseline)."""
        taken = self.processes.sample()
        if taken["cpu"] is None:
            return None
        fields: dict[str, Any] = {"cpu": round(taken["cpu"], 3), "cpus": self.cpus, "rss_bytes": taken["rss_bytes"],
                                  "processes": taken["processes"], "every_s": self.every_s}
        if self.gpus is not None:
            fields.update(self.gpus.sample(taken["pids"]))
        return fields

    def _run(self) -> None:
        try:
            self.processes.sample()
            try:
                self.gpus = Gpus()
            except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: nothing to sample there
                self.gpus = None
            wait_s = min(FIRST_SAMPLE_S, self.every_s)
            said_other_hosts = self.other_hosts is None
            while not self._stopped.wait(wait_s):
                wait_s = self.every_s
                fields = self.sample()
                if fields is not None:
                    self._say_sample(fields)
                others = self.other_hosts() if not said_other_hosts else 0  # type: ignore[misc]
                if others:
                    said_other_hosts = True
                    _say(f"resource use is sampled on this machine only: the job's processes on {others} other "
                         f"machine{'s' if others != 1 else ''} of the cluster are not counted")
        except Exception as exc:  # noqa: BLE001 - the job must never notice its sampler
            _say(f"resource sampling stopped ({type(exc).__name__}: {exc}); the job goes on")


    def _say_sample(self, fields: dict[str, Any]) -> None:
        # A sample written into an unfinished line of the job's (a progress bar, a line being printed) would break
        # that line for everyone who reads the log: it waits for the record alone.
        if self.log.at_line_start():
            emit(EventKind.RESOURCES, **fields)
        elif self.unsaid is not None:
            self.unsaid({"event": EventKind.RESOURCES, "time": round(time.time(), 3), **fields})


class LogEnd:
    """Whether the job's log (this process's stdout, a file) ends at the start of a line now."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._file = True

    def at_line_start(self) -> bool:
        """True when the log's last byte ends a line (or it is empty, or stdout is no file to look at)."""
        if not self._file:
            return True
        try:
            if self._handle is None:
                if not stat.S_ISREG(os.fstat(1).st_mode):
                    self._file = False
                    return True
                self._handle = open(f"/proc/{os.getpid()}/fd/1", "rb")
            size = os.fstat(self._handle.fileno()).st_size
            return size == 0 or os.pread(self._handle.fileno(), 1, size - 1) == b"\n"
        except OSError:
            self._file = False
            return True


def local_addresses() -> set[str]:
    """The addresses this machine answers to."""
    here = {"127.0.0.1", "localhost"}
    try:
        here |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return here


def _say(text: str) -> None:
    print(f"{OWN_LINE_PREFIX}{text}", flush=True)


# --------------------------------------------------------------------------- totals and wording


@dataclass
class ResourceUsage:
    """The totals of a run's ``resources`` events (and of its reports' data waits): one rule for every reader."""

    samples: int = 0
    seconds: float = 0.0
    cpu_core_s: float = 0.0
    gpu_s: float = 0.0
    peak_rss_bytes: int = 0
    peak_gpu_mem_bytes: int = 0
    cpu_sum: float = 0.0
    gpu_util_sum: float = 0.0
    gpu_samples: int = 0
    data_wait_s: float = 0.0
    epoch_s: float = 0.0
    last: dict[str, Any] | None = field(default=None)

    def take(self, event: Mapping[str, Any]) -> None:
        """Add one event: a ``resources`` sample, or a ``report`` whose metrics say how long it waited for data."""
        kind = kind_of(dict(event))
        if kind == EventKind.REPORT:
            metrics = event.get("metrics") or {}
            wait, epoch = metrics.get("data_wait_s"), metrics.get("epoch_s")
            if _number(wait) and _number(epoch) and epoch > 0:
                self.data_wait_s += float(wait)
                self.epoch_s += float(epoch)
            return
        if kind != EventKind.RESOURCES or not _number(event.get("cpu")):
            return
        every_s = float(event["every_s"]) if _number(event.get("every_s")) else DEFAULT_EVERY_S
        self.samples += 1
        self.seconds += every_s
        self.cpu_sum += float(event["cpu"])
        self.cpu_core_s += float(event["cpu"]) * every_s
        if _number(event.get("rss_bytes")):
            self.peak_rss_bytes = max(self.peak_rss_bytes, int(event["rss_bytes"]))
        if _number(event.get("gpus")) and event["gpus"] > 0:
            self.gpu_s += float(event["gpus"]) * every_s
            self.gpu_samples += 1
            self.gpu_util_sum += float(event.get("gpu_util") or 0.0)
            self.peak_gpu_mem_bytes = max(self.peak_gpu_mem_bytes, int(event.get("gpu_mem_bytes") or 0))
        self.last = dict(event)

    def as_dict(self) -> dict[str, Any]:
        """What ``run.json`` keeps of an attempt's resource use (``resources``)."""
        return {"samples": self.samples, "seconds": round(self.seconds, 1),
                "cpu_core_s": round(self.cpu_core_s, 1), "gpu_s": round(self.gpu_s, 1),
                "peak_rss_bytes": self.peak_rss_bytes, "peak_gpu_mem_bytes": self.peak_gpu_mem_bytes,
                "cpu_sum": round(self.cpu_sum, 3), "gpu_util_sum": round(self.gpu_util_sum, 1),
                "gpu_samples": self.gpu_samples, "data_wait_s": round(self.data_wait_s, 3),
                "epoch_s": round(self.epoch_s, 3)}

    @classmethod
    def from_dict(cls, kept: Mapping[str, Any] | None) -> ResourceUsage:
        """The totals an attempt's ``resources`` in ``run.json`` kept (empty for a record without them)."""
        usage = cls()
        for name in ("samples", "seconds", "cpu_core_s", "gpu_s", "peak_rss_bytes", "peak_gpu_mem_bytes",
                     "cpu_sum", "gpu_util_sum", "gpu_samples", "data_wait_s", "epoch_s"):
            value = (kept or {}).get(name)
            if _number(value):
                setattr(usage, name, type(getattr(usage, name))(value))
        return usage

    def add(self, other: ResourceUsage) -> ResourceUsage:
        """These totals and ``other``'s together (a run's attempts)."""
        total = ResourceUsage()
        for name in ("samples", "seconds", "cpu_core_s", "gpu_s", "cpu_sum", "gpu_util_sum", "gpu_samples",
                     "data_wait_s", "epoch_s"):
            setattr(total, name, getattr(self, name) + getattr(other, name))
        total.peak_rss_bytes = max(self.peak_rss_bytes, other.peak_rss_bytes)
        total.peak_gpu_mem_bytes = max(self.peak_gpu_mem_bytes, other.peak_gpu_mem_bytes)
        total.last = other.last or self.last
        return total

    def totals(self, prices: Mapping[str, float | None] | None = None) -> dict[str, Any]:
        """CPU·hours, GPU·hours, peak memory, mean use, the share of training spent waiting for data, and the cost
        at ``prices`` (``cpu_hour``, ``gpu_hour``; None where a price is missing)."""
        cpu_hours = self.cpu_core_s / 3600
        gpu_hours = self.gpu_s / 3600
        cost = None
        prices = prices or {}
        cpu_price, gpu_price = prices.get("cpu_hour"), prices.get("gpu_hour")
        if cpu_price is not None and (gpu_price is not None or not self.gpu_s):
            cost = cpu_hours * cpu_price + gpu_hours * (gpu_price or 0.0)
        return {"samples": self.samples, "cpu_hours": cpu_hours, "gpu_hours": gpu_hours,
                "peak_rss_bytes": self.peak_rss_bytes, "peak_gpu_mem_bytes": self.peak_gpu_mem_bytes,
                "mean_cpu": self.cpu_sum / self.samples if self.samples else None,
                "mean_gpu_util": self.gpu_util_sum / self.gpu_samples if self.gpu_samples else None,
                "data_wait_share": self.data_wait_s / self.epoch_s if self.epoch_s else None, "cost": cost}


def resource_totals(events: Iterable[Mapping[str, Any]], prices: Mapping[str, float | None] | None = None
                    ) -> dict[str, Any]:
    """The totals (:meth:`ResourceUsage.totals`) of a run's events."""
    usage = ResourceUsage()
    for event in events:
        usage.take(event)
    return usage.totals(prices)


def prices_from(environ: Mapping[str, str]) -> dict[str, float | None]:
    """The prices per CPU core·hour and per GPU·hour the environment gives (None where it gives none)."""
    prices: dict[str, float | None] = {}
    for key, variable in (("cpu_hour", CPU_PRICE_ENV_VAR), ("gpu_hour", GPU_PRICE_ENV_VAR)):
        try:
            prices[key] = float(environ[variable]) if environ.get(variable) else None
        except ValueError:
            raise ValueError(f"{variable} must be a number (a price per hour), not {environ[variable]!r}") from None
    return prices


def usage_line(event: Mapping[str, Any]) -> str:
    """The live view's line for one sample: ``CPU 1.9/2 · RSS 3.1 GiB · GPU 64 % · 2.0/80 GiB``."""
    parts = [f"CPU {float(event.get('cpu') or 0):.1f}/{float(event.get('cpus') or 0):g}",
             f"RSS {float(event.get('rss_bytes') or 0) / _GIB:.1f} GiB"]
    if _number(event.get("gpus")) and event["gpus"] > 0:
        parts.append(f"GPU {float(event.get('gpu_util') or 0):.0f} %")
        parts.append(f"{float(event.get('gpu_mem_bytes') or 0) / _GIB:.1f}/"
                     f"{float(event.get('gpu_mem_total_bytes') or 0) / _GIB:.0f} GiB")
    return " · ".join(parts)


def totals_lines(totals: Mapping[str, Any]) -> list[str]:
    """``rayjobs show``'s lines for the totals (none when the run has no samples)."""
    if not totals.get("samples"):
        return []
    lines = [f"CPU {totals['cpu_hours']:.3f} core·h (mean {totals['mean_cpu']:.2f} cores) · peak RSS "
             f"{totals['peak_rss_bytes'] / _GIB:.2f} GiB"]
    if totals.get("gpu_hours"):
        lines.append(f"GPU {totals['gpu_hours']:.3f} GPU·h (mean utilisation {totals['mean_gpu_util']:.0f} %) · "
                     f"peak GPU memory {totals['peak_gpu_mem_bytes'] / _GIB:.2f} GiB")
    if totals.get("data_wait_share") is not None:
        lines.append(f"waiting for data: {totals['data_wait_share']:.0%} of training time")
    if totals.get("cost") is not None:
        lines.append(f"cost: {totals['cost']:.4f} (at the prices in {CPU_PRICE_ENV_VAR}/{GPU_PRICE_ENV_VAR})")
    return lines


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["CPU_PRICE_ENV_VAR", "EVERY_S_ENV_VAR", "GPU_PRICE_ENV_VAR", "JobProcesses", "ProcessTable",
           "ResourceSampler", "ResourceUsage", "descendants", "prices_from", "resource_totals", "sampling_every_s",
           "totals_lines", "usage_line"]
