"""The Python stacks of a running job's driver and training workers, as py-spy sees them.

Ray's dashboard runs py-spy on the node of a process it is asked about (``/worker/traceback``);
py-spy comes with ``ray[default]``. The driver is found in Ray's job record; the training workers
in the job's last ``attempt`` event (rank, node, pid), so any Ray Train script that ships the
progress channel has its workers found without asking Ray Train.

A whole dump is some sixty lines per process, most of them Ray's idle threads; what a person
needs first is where each process is in its own code: :meth:`ProcessStack.where`, one line each.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.infra.address import is_loopback_host
from jobs.secrets import job_mask
from runner.errors import ProfilingDisabled, RayJobsError

_PY_SPY_TIMEOUT_S = 30

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi
    from runner.follow.progress import RunProgress


@dataclass
class ProcessStack:
    """One process's stack, or why it could not be read."""

    label: str
    text: str
    error: str | None = None
    who: str = ""  # ``driver``, ``rank 1``: the label without pid and node

    def as_dict(self) -> dict[str, Any]:
        return {"process": self.label, "stack": self.text, "error": self.error}

    def render(self) -> str:
        body = self.text.rstrip() if self.error is None else f"(could not read it: {self.error})"
        return f"--- {self.label} ---\n{body}"

    def where(self) -> str:
        """``rank 1: wait_forever (deadlock.py:8) ← loop (deadlock.py:15)``: one line, in the job's own code."""
        if self.error is not None:
            return f"{self.who or self.label}: its stack could not be read ({self.error})"
        return f"{self.who or self.label}: {where_in_own_code(self.text)}"


# py-spy's lines: ``Thread 4711 (idle): "MainThread"`` and ``    wait_forever (deadlock.py:8)``.
_THREAD = re.compile(r'^Thread \S+ \([^)]*\)(?:: "(?P<name>.*)")?')
_FRAME = re.compile(r"^\s+(?P<function>.+?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)\s*$")
# Libraries a training job spends its time in, beyond the standard library and what this machine has.
_LIBRARIES = frozenset({"ray", "torch", "torchvision", "numpy", "pyarrow", "pandas", "tqdm", "rich", "grpc", "aiohttp",
                        "urllib3", "requests", "fsspec", "s3fs", "boto3", "botocore", "mlflow", "transformers",
                        "accelerate", "datasets", "huggingface_hub", "timm", "lightning", "pytorch_lightning",
                        "tensorboard", "setproctitle", "rayjobs_agent", "site-packages", "dist-packages"})
# A wrapper's frame says nothing of what is called: the call named is the one it wraps
# (``requires_train_worker.<locals>._wrap.<locals>._wrapped_fn`` around ``ray.train.report``).
_WRAPPER = re.compile(r"^_*(wrap\w*|\w*_?wrapper|inner|decorated|fn|__call__|<lambda>)$")
_PRIVATE_PACKAGE = re.compile(r"^(_.*|v\d+|api|internal|impl|execution)$")
_OWN_FRAMES_SHOWN = 3


def where_in_own_code(dump: str) -> str:
    """Where a process is in the job's own code, from py-spy's dump of it.

    The thread chosen is the main thread if the job's code is on it, else the first that has it. The
    job's innermost frames are named (``wait_forever (deadlock.py:8) ← loop (deadlock.py:15)``), or,
    when the process is inside a library, the call it made into it (``waiting in ray.train.report
    (deadlock.py:17)``).
    """
    threads = _threads(dump)
    if not threads:
        return "no Python stack in the dump"
    with_own = [(name, frames) for name, frames in threads if any(not _is_library(file) for _, file, _ in frames)]
    if not with_own:
        name, frames = next(((name, frames) for name, frames in threads if name == "MainThread"), threads[0])
        inner = f"{frames[0][0]} ({_place(frames[0][1], frames[0][2])})" if frames else "no frame"
        return f"no frame of the job's own code (its {name or 'thread'} is in {inner})"
    name, frames = next(((name, frames) for name, frames in with_own if name == "MainThread"), with_own[0])
    first_own = next(index for index, (_, file, _) in enumerate(frames) if not _is_library(file))
    own = frames[first_own:]
    if first_own == 0:
        chain = []
        for function, file, line in own:
            if _is_library(file) or len(chain) == _OWN_FRAMES_SHOWN:
                break
            chain.append(f"{function} ({_place(file, line)})")
        return " ← ".join(chain)
    called = next((frame for frame in reversed(frames[:first_own])
                   if not _WRAPPER.match(frame[0].rsplit(".", 1)[-1])), frames[first_own - 1])
    return f"waiting in {_library_call(*called[:2])} ({_place(own[0][1], own[0][2])})"


def _threads(dump: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    threads: list[tuple[str, list[tuple[str, str, str]]]] = []
    for line in dump.splitlines():
        thread = _THREAD.match(line)
        if thread is not None:
            threads.append((thread["name"] or "", []))
            continue
        frame = _FRAME.match(line)
        if frame is not None and threads:
            threads[-1][1].append((frame["function"], frame["file"], frame["line"] or ""))
    return threads


def _is_library(file: str) -> bool:
    if file.startswith("<") or not file.endswith(".py"):
        return True  # <frozen runpy>, a native frame (libc.so.6)
    if "/site-packages/" in file or "/dist-packages/" in file or re.search(r"/lib/python3[\d.]*/", file):
        return True
    top = file.lstrip("/").split("/", 1)[0].removesuffix(".py")
    return top in _LIBRARIES or top in sys.stdlib_module_names


def _place(file: str, line: str) -> str:
    # An absolute path is Ray's copy of the working_dir: its name is what the user knows.
    name = file.rsplit("/", 1)[-1] if file.startswith("/") else file
    return f"{name}:{line}" if line else name


def _library_call(function: str, file: str) -> str:
    """``ray.train.report`` for ``report (ray/train/v2/_internal/util.py)``: the public package, the function."""
    path = re.split(r"/(?:site|dist)-packages/", file)[-1].lstrip("/")
    *folders, module = path.split("/")
    public = []
    for folder in folders:
        if _PRIVATE_PACKAGE.match(folder):
            break
        public.append(folder)
    function = function.rsplit(".<locals>.", 1)[-1]
    return ".".join((public or [module.removesuffix(".py")]) + [function])


def job_stacks(api: JobsApi, info: dict[str, Any], progress: RunProgress) -> list[ProcessStack]:
    """The stacks of the job's driver and of every training worker of its last attempt."""
    targets: list[tuple[str, dict[str, str], str]] = []
    driver = info.get("driver_info") or {}
    if driver.get("pid") and (driver.get("node_ip_address") or info.get("driver_node_id")):
        where = ({"node_id": info["driver_node_id"]} if info.get("driver_node_id")
                 else {"ip": driver["node_ip_address"]})
        targets.append((f"driver (pid {driver['pid']})", {"pid": str(driver["pid"]), **where}, "driver"))
    for worker in progress.workers:
        if worker.get("pid") and worker.get("node_id"):
            rank = f"rank {worker.get('rank')}"
            targets.append((f"{rank} (pid {worker['pid']} on node {str(worker['node_id'])[:8]})",
                            {"pid": str(worker["pid"]), "node_id": str(worker["node_id"])}, rank))
    stacks = []
    for label, where, who in targets:
        try:
            stacks.append(ProcessStack(label, api.process_traceback(**where), who=who))
        except ProfilingDisabled as exc:
            # A cluster on this machine: its processes are this machine's, and py-spy (from ray[default])
            # can read them without the dashboard.
            local = _local_py_spy(where["pid"]) if _on_this_machine(api) else None
            stacks.append(ProcessStack(label, local, who=who) if local is not None
                          else ProcessStack(label, "", str(exc), who=who))
        except RayJobsError as exc:
            stacks.append(ProcessStack(label, "", str(exc), who=who))
    # py-spy names each process by its command line, which holds the entrypoint's arguments.
    mask = job_mask(info)
    return [replace(stack, text=mask.mask_text(stack.text)) for stack in stacks]


def _on_this_machine(api: JobsApi) -> bool:
    from urllib.parse import urlsplit

    return is_loopback_host(urlsplit(api.connection.address).hostname or "")


def _local_py_spy(pid: str) -> str | None:
    found = Path(sys.executable).with_name("py-spy")
    py_spy = str(found) if found.exists() else shutil.which("py-spy")
    if py_spy is None:
        return None
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=_PY_SPY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
