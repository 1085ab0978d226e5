"""Which processes are one job's on this machine, and the CPU time they have used: one counter, added up exactly.

*Which processes.* The job's own, not the machine's: the process tree of a root (the agent, which runs the
entrypoint; not counted itself), and every Ray worker process Ray started for this job, which Ray marks with the
job's id in its environment (``RAY_JOB_ID``). The job's id is read off each driver in the tree, whose open
core-worker log is named after it, so a retry in place, which starts a new driver and so a new Ray job, is followed
to its own workers, and nothing asks the cluster. Every process that runs when the counting begins is no process of
the job's, but for the root's tree.

*CPU time is a counter.* A process's counter holds its own CPU time and that of the children it waited for. The
members' counters are read every tick (parents before their children), and when a member ends, its parent, when it
is the job's (or the root), takes its time into its own counter: nothing is lost, however short the process's life,
even one that started and ended between two ticks. That is checked: a parent whose children's counter did not grow
by as much (one that lets its children go unwaited) leaves the member its last reading. What cannot be known is
what a process whose parent is not the job's (a Ray worker, whose parent is Ray's raylet) used after its last
reading, at most one tick before it ended, and the whole of such a process that started and ended within one tick.

Processes are read through psutil, or the copy of it every Ray install ships, so that the agent needs nothing
the cluster does not have.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_JOB_ID_VARIABLE = "RAY_JOB_ID"
# Clock ticks are 10 ms: a counter read again may differ by one in how it was rounded.
_COUNTER_SLACK_S = 0.02
# Between PSS readings a process's memory is its last PSS plus what its RSS grew since, while that is within this
# share of its RSS then; beyond it, PSS is read again.
_RSS_DRIFT = 0.25


def load_psutil() -> Any:
    """psutil: the one installed, else the copy every Ray install ships in ``ray/thirdparty_files`` (found where the
    ray package lies, without importing Ray: that alone costs a CPU-second). Raises ImportError when neither is."""
    try:
        import psutil

        return psutil
    except ImportError:
        pass
    ray = importlib.util.find_spec("ray")
    for folder in (ray.submodule_search_locations or []) if ray is not None else []:
        vendored = os.path.join(folder, "thirdparty_files")
        if os.path.isdir(os.path.join(vendored, "psutil")):
            if vendored not in sys.path:
                sys.path.append(vendored)
            import psutil

            return psutil
    raise ImportError("psutil is not installed here, nor Ray's copy of it (ray/thirdparty_files)")


@dataclass
class _Member:
    """A process of the job, as last read."""

    process: Any  # psutil.Process
    parent: int
    started: float
    in_tree: bool
    cpu_s: float = 0.0  # its CPU time and its waited-for children's, at the last reading
    children_s: float = 0.0  # the children's part of it
    before_s: float = 0.0  # what of cpu_s it had used before sampling began (0 for a process born since)
    parent_mark: float | None = None  # its parent's children's part, read just before its own last reading
    read_tick: int = -1  # the tick of its last reading
    pss: int | None = None  # its PSS at the last reading of it, and its RSS then
    rss_at_pss: int = 0
    next_driver_look: int = 0  # the tick at which it is next looked at for a Ray driver's log
    driver_looks: int = 0


class JobProcesses:
    """One job's processes on this machine, followed from tick to tick, and what they use.

    ``root`` is the process whose descendants are the job's tree (the agent, which is not counted itself);
    ``job_id``, where given, names the job's Ray id instead of reading it off the tree's drivers.
    """

    def __init__(self, root: int, job_id: Callable[[], str | None] | None = None, psutil: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.psutil = psutil or load_psutil()
        self.clock = clock
        self.root = self.psutil.Process(root)
        self._given_job_id = job_id
        self.job_ids: set[str] = set()
        self._last_job_id: str | None = None
        self._driver: int | None = None  # the member the last job id was read from, while it runs
        self.members: dict[int, _Member] = {}
        # Processes not (yet) the job's: each one's RAY_JOB_ID (None for none), whether it was looked at twice (a
        # process read between its fork and its exec still shows its parent's environment), and the process.
        self._others: dict[int, tuple[str | None, bool, Any]] = {}
        self._pending: dict[int, _Member] = {}  # members that ended, settled once their parent is read again
        self._ticks = 0
        self._ended_s = 0.0  # CPU·s of members that ended with nobody of the job taking their time on
        self._counted_s = 0.0  # what the samples so far have said
        self._root_children = self._root_children_before = self._read_root()
        # The baseline: every process running now is no process of the job's, except the root's tree, whose
        # time so far is not counted. Listed first: a process that starts meanwhile is found in the tree, or later.
        listed = self.psutil.pids()
        tree = sorted(self.root.children(recursive=True), key=lambda process: process.create_time())
        for process in tree:
            try:
                member = self._add(process, process.ppid(), in_tree=True)
                self._read(member)
                member.before_s = member.cpu_s
            except self.psutil.Error:
                self.members.pop(process.pid, None)
        for pid in listed:
            if pid not in self.members:
                self._others[pid] = (None, True, None)
        self._sampled_at = self.clock()

    # ----------------------------------------------------------------- ticks

    def refresh(self) -> None:
        """Read the job's CPU counters now: what ended, what started, and each running member's time."""
        psutil = self.psutil
        self._ticks += 1
        listed = set(psutil.pids())
        # Gone from the listing: reaped before anything of this tick is read, so a parent that waited for it has
        # its time in the counter read below.
        ended = self._pending
        ended.update({pid: self.members.pop(pid) for pid in [pid for pid in self.members if pid not in listed]})
        self._pending = {}
        for pid in [pid for pid in self._others if pid not in listed]:
            del self._others[pid]
        self._find_new(listed)
        self._find_job_ids()
        self._root_children = self._read_root(self._root_children)
        # Parents before their children: a child read after its parent was still running when the parent was
        # read, so the parent's counter did not hold its time yet; what ends meanwhile is in neither, never in both.
        for member in sorted(self.members.values(), key=lambda member: member.started):
            try:
                self._read(member)
            except psutil.ZombieProcess:
                continue
            except psutil.NoSuchProcess:
                # Gone between the listing and its reading: its parent may hold its time already, so it counts
                # nothing until the next tick settles it.
                if self.members.pop(member.process.pid, None) is not None:
                    self._pending[member.process.pid] = member
            except psutil.Error:
                continue
        self._settle(ended)

    def _read_root(self, otherwise: float = 0.0) -> float:
        try:
            times = self.root.cpu_times()
        except self.psutil.Error:
            return otherwise
        return times.children_user + times.children_system

    def _read(self, member: _Member) -> None:
        parent = self.members.get(member.parent)
        mark = self._root_children if member.parent == self.root.pid else parent.children_s if parent else None
        times = member.process.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        if total + _COUNTER_SLACK_S < member.cpu_s:
            # A counter never goes back: the pid is another process's now. The one that ended keeps its reading.
            self.members.pop(member.process.pid, None)
            self._ended_s += member.cpu_s - member.before_s
            raise self.psutil.NoSuchProcess(member.process.pid)
        member.cpu_s = total
        member.children_s = times.children_user + times.children_system
        member.parent_mark = mark
        member.read_tick = self._ticks

    def _settle(self, ended: dict[int, _Member]) -> None:
        """Count what the members that ended used: taken on by the nearest running process of the job above them
        (or the root) where its children's counter grew by at least their last readings since, else those
        readings (a parent that is no process of the job's, or one that let them go unwaited)."""
        taker_of: dict[int, int | None] = {}

        def taker(pid: int) -> int | None:
            if pid not in taker_of:
                parent = ended[pid].parent
                taker_of[pid] = None  # also for a loop of reused pids
                if parent == self.root.pid or parent in self.members:
                    taker_of[pid] = parent
                elif parent in ended:
                    taker_of[pid] = taker(parent)
            return taker_of[pid]

        groups: dict[int | None, list[_Member]] = {}
        for pid in ended:
            groups.setdefault(taker(pid), []).append(ended[pid])
        for parent, members in groups.items():
            marks = [member.parent_mark for member in members
                     if member.parent == parent and member.parent_mark is not None]
            if parent == self.root.pid:
                grown = self._root_children - min(marks) if marks else -1.0
            elif parent is not None and self.members[parent].read_tick != self._ticks:
                # Its parent could not be read this time (it is ending too): settled with it.
                self._pending.update({member.process.pid: member for member in members})
                continue
            else:
                grown = self.members[parent].children_s - min(marks) if parent is not None and marks else -1.0
            taken = grown + _COUNTER_SLACK_S * len(members) >= sum(member.cpu_s for member in members)
            for member in members:
                self._ended_s += -member.before_s if taken else member.cpu_s - member.before_s

    def _find_new(self, listed: set[int]) -> None:
        psutil = self.psutil
        for pid, (job, twice, process) in list(self._others.items()):
            if not twice:  # first seen at the last tick: looked at once more, now that it has surely exec'd
                self._others[pid] = (job or _ray_job_of(process, psutil), True, process)
        found = []
        for pid in listed - self.members.keys() - self._others.keys():
            try:
                process = psutil.Process(pid)
                found.append((process.create_time(), pid, process))
            except psutil.Error:
                continue
        for _started, pid, process in sorted(found, key=lambda entry: entry[:2]):  # parents before their children
            try:
                parent = process.ppid()
            except psutil.Error:
                continue
            if parent == self.root.pid or parent in self.members:
                self._add(process, parent, in_tree=parent == self.root.pid or self.members[parent].in_tree)
            else:
                self._others[pid] = (_ray_job_of(process, psutil), False, process)

    def _find_job_ids(self) -> None:
        if self._given_job_id is not None:
            self._found(self._given_job_id())
        elif self._driver not in self.members:
            self._driver = None
            for pid, member in list(self.members.items()):
                if not member.in_tree or member.next_driver_look > self._ticks:
                    continue
                # A driver connects to Ray a few seconds after it starts, or much later: looked for at once, then
                # ever less often (1, 2, 4 … 16 ticks apart), which keeps a tree of many processes cheap.
                member.driver_looks += 1
                member.next_driver_look = self._ticks + min(16, 2 ** (member.driver_looks - 1))
                if self._found(job_id_of_driver(pid)):
                    self._driver = pid
                    break
        for pid, (job, _twice, process) in list(self._others.items()):
            if job is not None and job in self.job_ids and process is not None:
                del self._others[pid]
                try:
                    self._add(process, process.ppid(), in_tree=False)
                except self.psutil.Error:
                    continue

    def _found(self, job: str | None) -> bool:
        if job:
            self.job_ids.add(job)
            self._last_job_id = job
        return bool(job)

    def _add(self, process: Any, parent: int, in_tree: bool) -> _Member:
        member = _Member(process, parent, process.create_time(), in_tree)
        self.members[process.pid] = member
        return member

    def job_id(self) -> str | None:
        """The Ray id of the job's last driver found (None before one has connected)."""
        return self._last_job_id

    # ----------------------------------------------------------------- samples

    def used_s(self) -> float:
        """The CPU·s the job's processes have used since sampling began, as of the last tick."""
        running = sum(member.cpu_s - member.before_s for member in self.members.values())
        return running + self._ended_s + self._root_children - self._root_children_before

    def sample(self, pss: bool = True) -> dict[str, Any]:
        """A tick, and what the job used since the last sample: ``cpu_s`` (CPU·s), ``interval_s`` (the seconds it
        covers), ``cpu`` (cores, their ratio), and now: ``rss_bytes``, ``processes`` and ``pids``.

        ``rss_bytes`` sums each process's PSS (a page shared by several counted in part, so once in all) when
        ``pss`` asks for it, the process has none yet or its RSS moved by more than a quarter since; otherwise its
        last PSS plus what its RSS grew since."""
        self.refresh()
        now = self.clock()
        interval = now - self._sampled_at
        self._sampled_at = now
        # The job's counter only grows, but for a moment it may read low (a member that ended, until its parent
        # is read again): what was said is never said twice.
        used = max(0.0, self.used_s() - self._counted_s)
        self._counted_s += used
        return {"cpu_s": used, "interval_s": interval, "cpu": used / interval if interval > 0 else 0.0,
                "rss_bytes": sum(self._memory(member, pss) for member in list(self.members.values())),
                "processes": len(self.members), "pids": set(self.members)}

    def _memory(self, member: _Member, pss: bool) -> int:
        try:
            if not pss and member.pss is not None:
                rss = int(member.process.memory_info().rss)
                # A process whose RSS moved by a quarter since (one starting, loading libraries its siblings share
                # too) is read again: the estimate is off by no more than what its RSS moved.
                if abs(rss - member.rss_at_pss) <= member.rss_at_pss * _RSS_DRIFT:
                    return max(0, member.pss + rss - member.rss_at_pss)
            full = member.process.memory_full_info()
            member.pss, member.rss_at_pss = int(full.pss), int(full.rss)
            return member.pss
        except self.psutil.AccessDenied:
            try:
                return int(member.process.memory_info().rss)
            except self.psutil.Error:
                return 0
        except self.psutil.Error:
            return 0


def _ray_job_of(process: Any, psutil: Any) -> str | None:
    """The Ray job a worker process was started for (its ``RAY_JOB_ID``); None for any other, or one not ours to
    read."""
    try:
        return process.environ().get(_JOB_ID_VARIABLE) or None
    except (psutil.Error, OSError):
        return None


# A Ray driver keeps its core worker's log open under its worker id, which begins with its job's id (4 bytes). Read
# from /proc, so that the agent never imports Ray for it (that alone is a CPU-second and 150 MiB in every job).
_DRIVER_LOG = re.compile(r"python-core-driver-([0-9a-f]{8})[0-9a-f]*_\d+\.log$")


def job_id_of_driver(pid: int) -> str | None:
    """The Ray job id (hex, as Ray's workers carry it in ``RAY_JOB_ID``) of the driver process ``pid``, read off the
    log it keeps open; None for a process that is no connected Ray driver."""
    for target in open_files(pid) or ():
        found = _DRIVER_LOG.search(target)
        if found:
            return found[1]
    return None


def open_files(pid: int) -> list[str] | None:
    """What process ``pid`` holds open (devices too, which psutil's ``open_files`` leaves out); [] for a process
    that is gone, None for one not ours to look into."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError):
        return []
    except OSError:
        return None
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue
    return targets


__all__ = ["JobProcesses", "job_id_of_driver", "load_psutil", "open_files"]
