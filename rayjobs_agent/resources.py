"""What a job uses while it runs, sampled beside it: CPU, memory and GPUs of the job's own processes.

Every ``every_s`` seconds (``RAYJOBS_RESOURCES_EVERY_S``, default 10; 0 turns sampling off) the agent
writes a ``resources`` event: the CPU·s the job's processes used since the sample before and the seconds that
sample covers, their memory, and where they hold GPUs, each GPU's utilisation and the memory the job holds on
it. One more sample is taken the moment each attempt's entrypoint ends, before its record is kept. The events
land in the log and so in the record, append-only like every event, and the live view shows the last one.

Which processes are the job's, and how their CPU time is added up exactly, is job_processes.py: between
samples their counters are read every :data:`TICK_S`. Whole-machine figures would count other jobs on a shared
cluster and Ray's own daemons, and say nothing about this run. Every node of a local cluster shares the agent's
view; on a cluster whose nodes are other machines, the processes there are not seen, which one line says once
Ray Train places workers there. GPUs are read through NVML (the binding Ray ships): per device utilisation
and, per process, the memory it holds. Ray's dashboard agent also samples worker processes, but it lists only
the raylet's direct children as it last saw them (seconds stale, and in this Ray often only its own agents),
not the driver: it was tried and measured less of the job than the sampler does.

Sampling is a courtesy: whatever fails is said once and sampling stops; the job never notices.
The totals of the samples are ``usage.py``: one rule for the record keeper, ``rayjobs show`` and ``rayjobs ui``.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
import threading
import time
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .events import emit
from .job_processes import JobProcesses, open_files
from .vocabulary import EventKind
from .usage import DEFAULT_EVERY_S
from .wire import say

EVERY_S_ENV_VAR = "RAYJOBS_RESOURCES_EVERY_S"
# The first sample comes sooner, so that a short job and the live view have one early.
FIRST_SAMPLE_S = 3.0
# How often the CPU counters of the job's processes are read, and new processes looked for, between samples: a
# process whose time no process of the job takes on when it ends is counted up to its last reading.
TICK_S = 1.0
# PSS walks a process's whole memory map (most of a sample's cost): read at every PSS_EVERY-th sample, at a
# process's first, at an attempt's last and where RSS moved much (job_processes.py); RSS, a counter, in between.
PSS_EVERY = 5
# How long the sample at an attempt's end waits for one the sampler's thread is taking.
LAST_SAMPLE_WAIT_S = 2.0
# NVIDIA's device files: a process with a GPU context holds them open.
GPU_DEVICE_FILES = "/dev/nvidia"


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


# --------------------------------------------------------------------------- GPUs


class Gpus:
    """Each GPU's utilisation and the memory the job's processes hold on it, through NVML.

    NVML names a GPU's processes by their ids in the machine's first process namespace. Where the agent runs in
    one of its own (a container: a KubeRay pod), its ``/proc`` knows other ids, and none of NVML's matches (the
    ``NSpid`` line of ``/proc/PID/status`` lists a process's ids only from the namespace that mounted that
    ``/proc`` inward, so no file in the container holds the host's). That is told apart from a job that uses no
    GPU: none of the ids NVML gives is a process here that holds a GPU's device file open (:attr:`unattributed`).
    """

    def __init__(self, nvml: Any = None, devices: str = GPU_DEVICE_FILES) -> None:
        self.nvml = nvml if nvml is not None else nvml_binding()
        self.devices = devices
        self.nvml.nvmlInit()
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(index)
                        for index in range(self.nvml.nvmlDeviceGetCount())]
        # Whether, at the last sample, GPUs ran processes that this machine's /proc does not show.
        self.unattributed = False

    def sample(self, pids: set[int]) -> dict[str, Any]:
        """The GPUs any of ``pids`` holds memory on: their count, mean utilisation (%), the job's memory on them
        and their total memory; empty when the job holds none."""
        used = utilisation = held = total = 0
        reported: set[int] = set()
        for handle in self.handles:
            running = list(self.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            reported.update(int(process.pid) for process in running)
            mine = [process for process in running if process.pid in pids]
            if not mine:
                continue
            used += 1
            utilisation += self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            held += sum(int(process.usedGpuMemory or 0) for process in mine)
            total += int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total)
        self.unattributed = not used and bool(reported) and self._foreign(reported)
        if not used:
            return {}
        return {"gpus": used, "gpu_util": round(utilisation / used, 1), "gpu_mem_bytes": held,
                "gpu_mem_total_bytes": total}

    def _foreign(self, reported: set[int]) -> bool:
        """Whether none of the process ids NVML gives is a process here holding a GPU (gone, or another process
        under the same number); False where one cannot be looked into (another user's)."""
        for pid in reported:
            files = open_files(pid)
            if files is None or any(target.startswith(self.devices) for target in files):
                return False
        return True


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


UNATTRIBUTED_GPUS = ("GPU use is not counted: NVML names the GPUs' processes by the host's process ids, and none of "
                     "them is a process this machine's /proc shows holding a GPU (a container with a process "
                     "namespace of its own; hostPID lets it see them)")


# --------------------------------------------------------------------------- the sampler


class ResourceSampler:
    """Writes a ``resources`` event every ``every_s`` seconds while the entrypoint runs, in a thread of its own,
    reading the job's CPU counters every :data:`TICK_S` between; and one at the end of each attempt."""

    def __init__(self, every_s: float, job_id: Callable[[], str | None] | None = None, root: int | None = None,
                 cpus: float | None = None, other_hosts: Callable[[], int] | None = None,
                 unsaid: Callable[[dict[str, Any]], None] | None = None,
                 note: Callable[[str], None] | None = None, gpus: Callable[[], Gpus] | None = None) -> None:
        self.every_s = every_s
        self.tick_s = min(TICK_S, every_s)
        # Where a sample goes that cannot be said in the log now (the job's last line is unfinished): the record.
        self.unsaid = unsaid
        # Where what the record should say of its samples goes (GPUs whose use cannot be counted here).
        self.note = note
        self.log = LogEnd()
        self.processes = JobProcesses(os.getpid() if root is None else root, job_id)
        self.cpus = cpus if cpus is not None else float(len(os.sched_getaffinity(0)))
        self.other_hosts = other_hosts
        self.open_gpus = gpus or Gpus
        self.gpus: Gpus | None = None
        self._samples = 0
        self._next_sample_at = self.processes.clock() + min(FIRST_SAMPLE_S, every_s)
        self._lock = threading.Lock()  # one sample or tick at a time: the thread's, or the one at an attempt's end
        self._off = False
        self._said_unattributed = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayjobs-resources", daemon=True)

    @classmethod
    def for_job(cls, environ: Mapping[str, str], other_hosts: Callable[[], int] | None = None,
                unsaid: Callable[[dict[str, Any]], None] | None = None,
                note: Callable[[str], None] | None = None) -> ResourceSampler | None:
        """The sampler this job's environment asks for (None when sampling is off); ``other_hosts`` says how many
        other machines run its training workers, ``unsaid`` takes the samples the log cannot, ``note`` what the
        record should say of them. Raises ImportError without psutil (nor Ray's copy of it)."""
        every_s = sampling_every_s(environ)
        if every_s is None:
            return None
        return cls(every_s, other_hosts=other_hosts, unsaid=unsaid, note=note)

    def start(self) -> None:
        """Begin sampling (the first sample after :data:`FIRST_SAMPLE_S`, or sooner when samples are more often);
        what the job uses counts from when the sampler was made."""
        self._thread.start()

    def stop(self) -> None:
        """The entrypoint has ended: no more samples."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(1.0)

    def sample(self, pss: bool | None = None) -> dict[str, Any]:
        """One sample as a ``resources`` event's fields: what the job used since the sample before (or since the
        sampler was made). PSS is read at every :data:`PSS_EVERY`-th, and where ``pss`` asks."""
        taken = self.processes.sample(self._samples % PSS_EVERY == 0 if pss is None else pss)
        self._samples += 1
        fields: dict[str, Any] = {"cpu": round(taken["cpu"], 3), "cpu_s": round(taken["cpu_s"], 3),
                                  "interval_s": round(taken["interval_s"], 3), "cpus": self.cpus,
                                  "rss_bytes": taken["rss_bytes"], "processes": taken["processes"],
                                  "every_s": self.every_s}
        if self.gpus is not None:
            fields.update(self.gpus.sample(taken["pids"]))
            if self.gpus.unattributed and not self._said_unattributed:
                self._said_unattributed = True
                _say(UNATTRIBUTED_GPUS)
                if self.note is not None:
                    self.note(UNATTRIBUTED_GPUS)
        return fields

    def sample_now(self) -> None:
        """An attempt's entrypoint has ended: what the job used since the last sample, said now (PSS read), before
        the attempt's record is kept. Waits at most :data:`LAST_SAMPLE_WAIT_S` for a sample under way."""
        if self._off or not self._lock.acquire(timeout=LAST_SAMPLE_WAIT_S):
            return
        try:
            if not self._off:
                self._say_sample(self.sample(pss=True))
                self._next_sample_at = self.processes.clock() + self.every_s
        except Exception as exc:  # noqa: BLE001 - the job must never notice its sampler
            self._turn_off(exc)
        finally:
            self._lock.release()

    def _run(self) -> None:
        try:
            try:
                self.gpus = self.open_gpus()
            except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: nothing to sample there
                self.gpus = None
            said_other_hosts = self.other_hosts is None
            while not self._stopped.wait(self._wait_s()):
                with self._lock:
                    if self._off:
                        return
                    if self.processes.clock() >= self._next_sample_at:
                        self._say_sample(self.sample())
                        self._next_sample_at = self.processes.clock() + self.every_s
                    else:
                        self.processes.refresh()
                others = self.other_hosts() if not said_other_hosts else 0  # type: ignore[misc]
                if others:
                    said_other_hosts = True
                    _say(f"resource use is sampled on this machine only: the job's processes on {others} other "
                         f"machine{'s' if others != 1 else ''} of the cluster are not counted")
        except Exception as exc:  # noqa: BLE001 - the job must never notice its sampler
            self._turn_off(exc)

    def _wait_s(self) -> float:
        return max(0.0, min(self.tick_s, self._next_sample_at - self.processes.clock()))

    def _turn_off(self, exc: BaseException) -> None:
        if not self._off:
            self._off = True
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
    say(text, sys.stdout)


__all__ = ["EVERY_S_ENV_VAR", "UNATTRIBUTED_GPUS", "Gpus", "ResourceSampler", "sampling_every_s"]
