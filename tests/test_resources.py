"""What a job uses, sampled by the agent beside it (rayjobs_agent/resources.py): the job's own processes (its
entrypoint's tree and the Ray workers marked with its job id, read off each of its drivers), the CPU time they use
added up exactly as a counter, their memory, GPUs through a fake NVML over this machine's real /proc, the totals
that the record, ``rayjobs show`` and ``rayjobs ui`` read, and the live view's line. The real sampler in a real
job on the session cluster: tests/test_resources_cluster.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from rayjobs_agent.job_processes import JobProcesses, job_id_of_driver
from rayjobs_agent.usage import ResourceUsage, prices_from, resource_totals
from rayjobs_agent.resources import (UNATTRIBUTED_GPUS, Gpus, ResourceSampler,
                                     sampling_every_s)
from rayjobs_agent.wording import totals_lines, usage_line
from rayjobs_agent.retries import RetryPolicy
from rayjobs_agent.vocabulary import decode
from rayjobs_agent.wire import RETRY_ENV_VAR
from runner.follow.progress import RunProgress, event_line
from runner.records.report import run_resource_totals
from runner.records.store import Folder, read_run
from tests.support.waiting import HANG_GUARD_S, wait_for_condition
from tests.test_record import config_for, keeper_env, run_keeper

REPO = Path(__file__).resolve().parents[1]
BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: pass\n"
IDLE = "import time; time.sleep(60)"
# Burns argv[1] CPU-seconds in itself and as much in each of argv[2] children, then prints what it and the children
# it waited for used, by its own count (getrusage).
BURN = """
import resource, subprocess, sys, time
seconds, children = float(sys.argv[1]), int(sys.argv[2])
kids = [subprocess.Popen([sys.executable, __file__, sys.argv[1], "0"]) for _ in range(children)]
started = time.process_time()
while time.process_time() - started < seconds:
    pass
for kid in kids:
    kid.wait()
mine, theirs = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
if children:
    print("used", mine.ru_utime + mine.ru_stime + theirs.ru_utime + theirs.ru_stime, flush=True)
"""


def _start(code: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env})


def _end(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        for child in psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []:
            child.kill()
        process.kill()
        process.wait()


def _tree_of(root: int) -> set[int]:
    return {process.pid for process in psutil.Process(root).children(recursive=True)}


@pytest.mark.processes
def test_the_job_is_its_entrypoints_tree_and_the_ray_workers_marked_with_its_id_and_nothing_else():
    # The root's tree: a shell whose child spins. Beside it, a "Ray worker" of this job (RAY_JOB_ID), one of
    # another job, and an unrelated process: only the first two families count.
    tree = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c '{BUSY}'; true"])
    wait_for_condition(lambda: len(_tree_of(tree.pid)) == 1)
    job = JobProcesses(tree.pid, lambda: "0a000000")
    ours = _start(IDLE, RAY_JOB_ID="0a000000")
    theirs = _start(BUSY, RAY_JOB_ID="0b000000")
    stranger = _start(BUSY)
    try:
        time.sleep(1.5)
        sample = job.sample()
        (spinner,) = _tree_of(tree.pid)
        assert sample["pids"] == {spinner, ours.pid}
        assert sample["processes"] == 2
        # One spinning process of the job's, beside two others that spin: some of a core, never the others' too.
        assert 0 < sample["cpu"] < 1.3, sample
        assert sample["cpu_s"] == pytest.approx(sample["cpu"] * sample["interval_s"])
        assert sample["rss_bytes"] > 5 * 1024 * 1024
    finally:
        _end(tree, ours, theirs, stranger)


@pytest.mark.processes
def test_a_process_started_between_samples_counts_all_its_time():
    job = JobProcesses(os.getpid(), lambda: None)
    child = _start(BUSY)
    try:
        time.sleep(1.2)
        sample = job.sample()
        assert child.pid in sample["pids"]
        assert sample["cpu_s"] > 0.1, "its CPU since it started is new, though it had no baseline"
    finally:
        _end(child)
    assert child.pid not in job.sample()["pids"]


def _driver(tmp_path: Path, job: str, flag: Path) -> str:
    """A "driver" of Ray job ``job``: it holds its core worker's log open until ``flag`` exists."""
    log = tmp_path / f"python-core-driver-{job}{'f' * 48}_4242.log"
    script = tmp_path / f"driver-{job}.py"
    script.write_text(f"import os, time\nhandle = open({str(log)!r}, 'w')\n"
                      f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n")
    return f"{sys.executable} {script}"


def test_the_jobs_id_is_read_off_the_log_its_ray_driver_keeps_open(tmp_path):
    # The entrypoint's shell, and under it a "driver" holding its core worker's log open; beside them, outside the
    # tree, a "Ray worker" of the same job.
    shell = subprocess.Popen(["/bin/sh", "-c", f"{_driver(tmp_path, '0d000000', tmp_path / 'never')}; true"])
    job = JobProcesses(shell.pid)
    worker = _start(IDLE, RAY_JOB_ID="0d000000")
    try:
        wait_for_condition(lambda: job.sample(pss=False)["processes"] == 2)  # the driver, the worker
        assert job.job_id() == "0d000000"
        assert worker.pid in job.sample()["pids"]
        (driver,) = _tree_of(shell.pid)
        assert job_id_of_driver(driver) == "0d000000"
        assert job_id_of_driver(worker.pid) is None, "a process that keeps no driver's log open is no driver"
    finally:
        _end(shell, worker)


@pytest.mark.processes
def test_each_attempts_driver_is_its_own_ray_job_and_its_workers_count(tmp_path):
    # A retry in place runs the entrypoint again: a new driver, so a new Ray job whose workers carry its new id.
    first_done = tmp_path / "first-done"
    shell = subprocess.Popen(["/bin/sh", "-c", f"{_driver(tmp_path, '0e000000', first_done)}; "
                                               f"{_driver(tmp_path, '0f000000', tmp_path / 'never')}"])
    job = JobProcesses(shell.pid)
    first_worker = _start(IDLE, RAY_JOB_ID="0e000000")
    try:
        wait_for_condition(lambda: first_worker.pid in job.sample(pss=False)["pids"])
        first_done.write_text("")
        second_worker = _start(IDLE, RAY_JOB_ID="0f000000")
        try:
            wait_for_condition(lambda: second_worker.pid in job.sample(pss=False)["pids"])
            assert job.job_id() == "0f000000"
            assert first_worker.pid in job.sample(pss=False)["pids"], "the first attempt's workers still count"
        finally:
            _end(second_worker)
    finally:
        _end(shell, first_worker)


def test_a_job_id_not_yet_known_counts_the_entrypoints_tree_alone():
    elsewhere = _start(IDLE)
    unknown, known = JobProcesses(elsewhere.pid, lambda: None), JobProcesses(elsewhere.pid, lambda: "0c000000")
    root_tree = JobProcesses(os.getpid(), lambda: None)
    worker = _start(IDLE, RAY_JOB_ID="0c000000")
    try:
        assert worker.pid in root_tree.sample()["pids"], "a child of the root is in its tree, marked or not"
        assert unknown.sample()["pids"] == set(), "a marked process outside the tree waits for the job's id"
        assert known.sample()["pids"] == {worker.pid}
    finally:
        _end(worker, elsewhere)


@pytest.mark.processes
def test_a_sample_never_breaks_an_unfinished_line_of_the_job_it_goes_to_the_record_instead(tmp_path):
    from rayjobs_agent.resources import LogEnd

    log = tmp_path / "driver.log"
    code = ("import os, sys, time\nfrom rayjobs_agent.resources import ResourceSampler\nkept = []\n"
            "sampler = ResourceSampler(0.05, other_hosts=lambda: 0, unsaid=kept.append)\n"
            "sys.stdout.write('progress 10%\\r'); sys.stdout.flush()\nsampler.start()\ntime.sleep(0.5)\n"
            "sys.stdout.write('progress 100%\\n'); sys.stdout.flush()\ntime.sleep(0.5)\nsampler.stop()\n"
            "sys.stderr.write(f'kept {len(kept)}\\n')\n")
    with open(log, "wb") as out:
        done = subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    text = log.read_bytes().decode()
    assert text.startswith("progress 10%\rprogress 100%\n"), "nothing came between the job's bytes of one line"
    assert text.count('"event":"resources"') >= 2, "once the line ended, samples were said in the log again"
    assert int(done.stderr.split("kept ")[1]) >= 2, "the samples the log could not take went to the record"
    assert LogEnd().at_line_start() in (True, False)


def test_the_sampler_writes_resources_events_and_a_broken_read_is_said_once_and_never_reaches_the_job(capfd):
    sampler = ResourceSampler(0.2, lambda: None)
    sampler.start()
    wait_for_condition(lambda: "rayjobs-event" in capfd.readouterr().out)
    sampler.stop()
    sampler._thread.join(5)
    capfd.readouterr()  # a sample it said between the look above and its stop belongs to it, not to the next

    broken = ResourceSampler(0.05, lambda: None)

    def refuse():
        raise PermissionError("/proc is not ours to read")

    broken.processes.refresh = refuse  # type: ignore[method-assign]
    broken.start()
    broken._thread.join(5)
    assert not broken._thread.is_alive()
    broken.sample_now()  # the attempt's end: a sampler that stopped stays stopped, and says nothing more
    out = capfd.readouterr().out
    assert out.count("resource sampling stopped (PermissionError: /proc is not ours to read); the job goes on") == 1
    assert "rayjobs-event" not in out


def test_a_sample_is_a_resources_event_line_the_client_decodes(capfd):
    sampler = ResourceSampler(0.1, lambda: None, cpus=2)
    time.sleep(0.2)
    fields = sampler.sample()
    assert set(fields) >= {"cpu", "cpu_s", "interval_s", "cpus", "rss_bytes", "processes", "every_s"}
    assert fields["interval_s"] > 0, "the first sample covers the time since the sampler was made"
    from rayjobs_agent.events import emit

    emit("resources", **fields)
    event = decode(capfd.readouterr().out.strip())
    assert event is not None and event["event"] == "resources" and event["cpus"] == 2


@pytest.mark.processes
def test_sampling_a_job_never_imports_ray_into_the_agent():
    # Importing Ray costs the agent a CPU-second and 150 MiB in every job; the sampler reads processes through
    # psutil alone (and NVML only where its library loads, which a machine without an NVIDIA driver has not).
    code = ("import sys, time\nfrom rayjobs_agent.resources import ResourceSampler\n"
            "sampler = ResourceSampler(0.1, other_hosts=lambda: 0)\nsampler.start()\ntime.sleep(0.5)\n"
            "sampler.stop()\nprint(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert done.stdout.count('"event":"resources"') >= 2


@pytest.mark.parametrize(("value", "every_s"), [(None, 10.0), ("", 10.0), ("2.5", 2.5), ("0", None), ("often", None)])
def test_sampling_is_every_ten_seconds_unless_the_job_says_otherwise(value, every_s):
    environ = {} if value is None else {"RAYJOBS_RESOURCES_EVERY_S": value}
    assert sampling_every_s(environ) == every_s
    if every_s is None:
        assert ResourceSampler.for_job(environ) is None


# --------------------------------------------------------------------------- CPU totals, against what the job counted


def _run_job(tmp_path: Path, entrypoint: str, every_s: str, **env: str) -> tuple[str, dict]:
    log = tmp_path / "log"
    environ = keeper_env(config_for(tmp_path / "run"))
    environ.update({"RAYJOBS_RESOURCES_EVERY_S": every_s, **env})
    keeper = run_keeper(entrypoint, log, environ)
    keeper.wait(timeout=HANG_GUARD_S)
    return log.read_text(), read_run(Folder(str(tmp_path / "run")))


def _used(text: str) -> list[float]:
    return [float(line.split()[1]) for line in text.splitlines() if line.startswith("used ")]


@pytest.mark.processes
@pytest.mark.parametrize("every_s", ["60", "0.2"])
def test_a_jobs_cpu_total_is_the_cpu_time_its_processes_used_however_long_the_interval(tmp_path, every_s):
    # The entrypoint burns 0.4 CPU-s and so does each of its two children, which end long before a 60 s interval
    # does: what they used reaches the entrypoint's counter, and the entrypoint's the agent's, when each is waited for.
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    text, document = _run_job(tmp_path, f"{sys.executable} {burn} 0.4 2", every_s)
    (used,) = _used(text)
    (attempt,) = document["attempts"]
    resources = attempt["resources"]
    assert resources["cpu_core_s"] == pytest.approx(used, abs=0.15), (resources, used)
    assert resources["samples"] >= 1, "the sample taken when the entrypoint ended"
    if every_s == "0.2":
        assert resources["peak_rss_bytes"] > 5 * 1024 * 1024


@pytest.mark.processes
def test_each_attempt_of_a_retry_in_place_keeps_what_it_used(tmp_path):
    # Attempt 1 burns 0.3 CPU-s in itself and one child and fails with exit code 3 (retried); attempt 2 burns 0.6
    # in each and succeeds. Each attempt's sample at its end is its own, in its own record.
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    marker = tmp_path / "failed-once"
    entrypoint = (f"if [ -e {marker} ]; then {sys.executable} {burn} 0.6 1; "
                  f"else touch {marker}; {sys.executable} {burn} 0.3 1; exit 3; fi")
    policy = RetryPolicy(1, ("exit_code:3",), 0.0, 1.0).to_variable()
    text, document = _run_job(tmp_path, entrypoint, "60", **{RETRY_ENV_VAR: policy})
    first_used, second_used = _used(text)
    first, second = document["attempts"]
    assert (first["status"], second["status"]) == ("FAILED", "SUCCEEDED"), text
    assert first["resources"]["cpu_core_s"] == pytest.approx(first_used, abs=0.15), (first, first_used)
    assert second["resources"]["cpu_core_s"] == pytest.approx(second_used, abs=0.15), (second, second_used)


@pytest.mark.processes
def test_a_process_reaped_by_a_parent_that_is_not_the_jobs_keeps_its_last_reading_and_is_never_counted_twice():
    # A Ray worker's parent is Ray's raylet (here: this test), so its time reaches no counter of the job's when it
    # ends: the sampler keeps its last reading, here taken when it had ended and not yet been waited for.
    root = _start(IDLE)
    job = JobProcesses(root.pid, lambda: "0a000000")
    worker = _start("import time\nstarted = time.process_time()\nwhile time.process_time() - started < 0.5: pass\n",
                    RAY_JOB_ID="0a000000")
    try:
        def ended() -> bool:
            job.refresh()
            return psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE
        wait_for_condition(ended, interval_s=0.05)
        times = psutil.Process(worker.pid).cpu_times()
        counted = job.sample()["cpu_s"]
        assert counted == pytest.approx(times.user + times.system, abs=0.03)
        worker.wait()
        assert job.sample()["cpu_s"] < 0.02, "reaped by a parent of no concern to the job: nothing more, nothing twice"
    finally:
        _end(worker, root)


@pytest.mark.processes
def test_a_child_its_parent_never_waits_for_keeps_its_last_reading():
    # A parent that ignores SIGCHLD lets its children go unwaited: their time reaches no counter, so the sampler
    # keeps what it last read of them rather than counting on the parent.
    code = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time\\nstarted = time.process_time()\\n"
            "while time.process_time() - started < 0.6: pass'])\ntime.sleep(60)\n")
    parent = _start(code)
    try:
        wait_for_condition(lambda: len(_tree_of(parent.pid)) == 1)
        job = JobProcesses(parent.pid, lambda: None)
        wait_for_condition(lambda: (job.refresh(), not _tree_of(parent.pid))[1], interval_s=0.05)
        counted = job.sample()["cpu_s"]
        assert 0.25 < counted < 0.65, counted
    finally:
        _end(parent)


def test_pss_is_read_every_fifth_sample_at_an_attempts_end_and_where_rss_moved_by_a_quarter(monkeypatch):
    reads: list[int] = []
    full_info = psutil.Process.memory_full_info
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda process: reads.append(process.pid) or
                        full_info(process))
    # A process that holds 96 MiB of its own, and more each time it is asked to.
    grow = ("import sys\nheld = []\nfor line in sys.stdin:\n    held.append(bytearray(int(line)))\n"
            "    for at in range(0, len(held[-1]), 4096): held[-1][at] = 1\n    print('held', flush=True)\n")
    shell = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c \"{grow}\"; true"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert shell.stdin is not None and shell.stdout is not None

    def hold(size: int) -> None:
        shell.stdin.write(f"{size}\n")  # type: ignore[union-attr]
        shell.stdin.flush()  # type: ignore[union-attr]
        assert shell.stdout.readline() == "held\n"  # type: ignore[union-attr]

    try:
        hold(96 << 20)
        (grower,) = _tree_of(shell.pid)
        sampler = ResourceSampler(10.0, lambda: None, root=shell.pid)
        samples = [sampler.sample()]
        assert reads.count(grower) == 1, "the first sample reads PSS"
        samples.append(sampler.sample())
        hold(16 << 20)
        samples += [sampler.sample() for _ in range(3)]
        assert reads.count(grower) == 1, "RSS alone between, while it moves by less than a quarter"
        # Its last PSS plus what its RSS grew since: what it holds of its own now (a sum of RSS over the job would
        # count the libraries its processes share once per process).
        assert samples[2]["rss_bytes"] - samples[1]["rss_bytes"] == pytest.approx(16 << 20, rel=0.1)
        samples.append(sampler.sample())
        assert reads.count(grower) == 2, "the fifth sample after the first reads PSS again"
        assert samples[5]["rss_bytes"] == pytest.approx(samples[4]["rss_bytes"], rel=0.05)
        hold(64 << 20)
        sampler.sample()
        assert reads.count(grower) == 3, "RSS that moved by more than a quarter: PSS again"
        sampler.sample_now()
        assert reads.count(grower) == 4, "and an attempt's last sample"
    finally:
        _end(shell)


@pytest.mark.processes
def test_a_process_whose_name_holds_spaces_and_parentheses_is_read_right():
    # /proc/PID/stat puts the command's name in parentheses, and a process may name itself anything: its fields must
    # be read after the last ")", or its CPU time and parent would come from the wrong columns.
    job = JobProcesses(os.getpid(), lambda: None)
    hostile = _start("open('/proc/self/comm', 'w').write('a) 1 2 (b')\n" + BUSY)
    try:
        wait_for_condition(lambda: open(f"/proc/{hostile.pid}/comm").read().strip() == "a) 1 2 (b")
        job.sample()
        time.sleep(1.0)
        sample = job.sample()
        assert hostile.pid in sample["pids"]
        assert 0 < sample["cpu"] < 2.5, sample
        assert job.members[hostile.pid].parent == os.getpid(), "its parent, read from the right column"
    finally:
        _end(hostile)


# --------------------------------------------------------------------------- psutil, installed or Ray's copy


def _run_bare(code: str, *path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python without site-packages (no psutil), with ``path`` and this checkout importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)])}
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_without_psutil_the_agent_takes_the_copy_ray_ships_without_importing_ray(tmp_path):
    import importlib.util

    (installed,) = importlib.util.find_spec("ray").submodule_search_locations  # type: ignore[union-attr]
    site = tmp_path / "site"
    (site / "ray" / "thirdparty_files").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text("raise ImportError('Ray itself was imported')\n")
    (site / "ray" / "thirdparty_files" / "psutil").symlink_to(Path(installed) / "thirdparty_files" / "psutil")
    done = _run_bare("import sys\nfrom rayjobs_agent.resources import ResourceSampler\n"
                     "sampler = ResourceSampler(0.1, lambda: None)\nprint(sampler.sample()['processes'] >= 0)\n"
                     "print(sys.modules['psutil'].__file__)\nprint('ray' in sys.modules)\n", site)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(site / "ray" / "thirdparty_files" / "psutil" / "__init__.py"), "False"]


def test_without_psutil_or_ray_the_job_runs_unsampled_and_says_so_once(tmp_path):
    done = _run_bare("from types import SimpleNamespace\nfrom rayjobs_agent.supervisor import resource_sampler\n"
                     "keeping = SimpleNamespace(recorder=None, add_event=None)\n"
                     "print(resource_sampler({}, SimpleNamespace(), keeping))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["None"]
    assert done.stderr.splitlines() == [
        "rayjobs: resource use is not sampled (psutil is not installed here, nor Ray's copy of it "
        "(ray/thirdparty_files)); the job goes on"]


# --------------------------------------------------------------------------- GPUs: a fake NVML over a real /proc


class FakeNvml:
    """The calls of NVML the sampler makes, over GPUs each running the processes given as ``(pid, bytes)``."""

    def __init__(self, *devices: list[tuple[int, int]]) -> None:
        self.devices = devices

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=held) for pid, held in self.devices[handle]]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 << 30)


def _holding(device: Path) -> subprocess.Popen[bytes]:
    """A process with a "GPU context": it holds the GPU's device file open."""
    return _start(f"handle = open({str(device)!r})\nimport time\ntime.sleep(60)\n")


def _open_targets(pid: int) -> set[str]:
    return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


def _ended_pid() -> int:
    process = _start("pass")
    process.wait()
    return process.pid


def test_gpu_use_is_the_jobs_where_nvml_names_its_processes_and_said_not_counted_where_it_names_none_here(tmp_path):
    device = tmp_path / "nvidia0"
    device.write_text("")
    devices = str(tmp_path / "nvidia")
    holder, idle = _holding(device), _start(IDLE)
    try:
        wait_for_condition(lambda: str(device) in _open_targets(holder.pid))
        gpus = Gpus(FakeNvml([(holder.pid, 2 << 30)], []), devices)
        assert gpus.sample({holder.pid}) == {"gpus": 1, "gpu_util": 50.0, "gpu_mem_bytes": 2 << 30,
                                             "gpu_mem_total_bytes": 80 << 30}
        assert not gpus.unattributed
        assert gpus.sample({idle.pid}) == {} and not gpus.unattributed, \
            "another job's process here holds the GPU: this job uses none"
        cases = {"an id no process here has": _ended_pid(), "an id here of a process holding no GPU": idle.pid}
        for why, pid in cases.items():
            gpus = Gpus(FakeNvml([(pid, 1 << 30)]), devices)
            assert gpus.sample({holder.pid}) == {} and gpus.unattributed, why
        idle_gpus = Gpus(FakeNvml([]), devices)
        assert idle_gpus.sample({holder.pid}) == {} and not idle_gpus.unattributed, "a GPU that runs nothing"
    finally:
        _end(holder, idle)


def test_gpu_use_that_cannot_be_counted_is_said_once_in_the_log_and_noted_in_the_record(tmp_path, capfd):
    notes: list[str] = []
    sampler = ResourceSampler(0.1, lambda: None, note=notes.append,
                              gpus=lambda: Gpus(FakeNvml([(_ended_pid(), 1 << 30)]), str(tmp_path / "nvidia")))
    sampler.gpus = sampler.open_gpus()
    for _ in range(3):
        assert "gpus" not in sampler.sample()
    assert capfd.readouterr().out.count(f"rayjobs: {UNATTRIBUTED_GPUS}") == 1
    assert notes == [UNATTRIBUTED_GPUS]


CONTAINER = """
import json, os, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[3])
from rayjobs_agent.resources import Gpus
from tests.test_resources import FakeNvml
handle = open(sys.argv[1])  # this process holds the GPU
host_pid = int(sys.stdin.readline())  # its id outside, as NVML names it
gpus = Gpus(FakeNvml([(host_pid, 1 << 30)]), sys.argv[2])
print(json.dumps({"pid": os.getpid(), "sample": gpus.sample({os.getpid()}), "unattributed": gpus.unattributed}),
      flush=True)
sys.stdin.readline()
"""


@pytest.mark.processes
def test_in_a_process_namespace_of_its_own_the_hosts_ids_match_nothing_and_that_is_told(tmp_path):
    # A container's view: a process namespace and a /proc of its own (unshare, as a container runtime does). The
    # job's GPU process is pid 1 there; NVML names it by its id outside, which no process inside has.
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-Urpf", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("this machine lets no unprivileged user make a process namespace")
    device = tmp_path / "nvidia0"
    device.write_text("")
    inside = subprocess.Popen([unshare, "-Urpf", "--mount-proc", sys.executable, "-c", CONTAINER, str(device),
                               str(tmp_path / "nvidia"), str(REPO)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        wait_for_condition(lambda: bool(psutil.Process(inside.pid).children()))
        (python,) = psutil.Process(inside.pid).children()
        assert inside.stdin is not None and inside.stdout is not None
        inside.stdin.write(f"{python.pid}\n")
        inside.stdin.flush()
        seen = json.loads(inside.stdout.readline())
        assert seen == {"pid": 1, "sample": {}, "unattributed": True}
        outside = Gpus(FakeNvml([(python.pid, 1 << 30)]), str(tmp_path / "nvidia"))
        assert outside.sample({python.pid})["gpu_mem_bytes"] == 1 << 30, "seen from the host, the same id matches"
        inside.stdin.write("done\n")
        inside.stdin.flush()
        assert inside.wait(timeout=HANG_GUARD_S) == 0
    finally:
        if inside.poll() is None:
            _end(inside)


# --------------------------------------------------------------------------- totals and wording


SAMPLES = [
    {"event": "resources", "time": 1.0, "cpu": 1.5, "cpus": 2, "rss_bytes": 2 * 1024 ** 3, "every_s": 10},
    {"event": "report", "time": 2.0, "metrics": {"data_wait_s": 3.0, "epoch_s": 12.0}},
    {"event": "resources", "time": 11.0, "cpu": 1.9, "cpus": 2, "rss_bytes": 3 * 1024 ** 3, "every_s": 10,
     "gpus": 2, "gpu_util": 64.0, "gpu_mem_bytes": 4 * 1024 ** 3, "gpu_mem_total_bytes": 160 * 1024 ** 3},
    {"event": "report", "time": 12.0, "metrics": {"data_wait_s": 1.0, "epoch_s": 4.0}},
    {"event": "stall", "time": 13.0, "silent_s": 5},
]


def test_totals_are_core_hours_gpu_hours_peaks_means_the_data_wait_and_the_cost():
    totals = resource_totals(SAMPLES, {"cpu_hour": 0.05, "gpu_hour": 2.0})
    assert totals["samples"] == 2
    assert totals["cpu_hours"] == pytest.approx((1.5 + 1.9) * 10 / 3600)
    assert totals["gpu_hours"] == pytest.approx(2 * 10 / 3600)
    assert totals["peak_rss_bytes"] == 3 * 1024 ** 3
    assert totals["mean_cpu"] == pytest.approx(1.7)
    assert totals["mean_gpu_util"] == pytest.approx(64.0)
    assert totals["data_wait_share"] == pytest.approx(4.0 / 16.0)
    assert totals["cost"] == pytest.approx(totals["cpu_hours"] * 0.05 + totals["gpu_hours"] * 2.0)
    assert resource_totals(SAMPLES, {"cpu_hour": 0.05})["cost"] is None, "a GPU run without a GPU price has none"
    lines = totals_lines(totals)
    assert lines[0].startswith("CPU 0.009 core·h (mean 1.70 cores) · peak RSS 3.00 GiB")
    assert "GPU 0.006 GPU·h (mean utilisation 64 %) · peak GPU memory 4.00 GiB" in lines
    assert "waiting for data: 25% of training time" in lines
    assert totals_lines(resource_totals([])) == []


def test_a_runs_attempts_add_up_from_what_run_json_kept_and_an_old_record_has_none():
    first, second = ResourceUsage(), ResourceUsage()
    for event in SAMPLES[:2]:
        first.take(event)
    for event in SAMPLES[2:]:
        second.take(event)
    document = {"attempts": [{"resources": json.loads(json.dumps(first.as_dict()))},
                             {"resources": second.as_dict()}, {"status": "FAILED"}]}
    assert run_resource_totals(document) == pytest.approx(resource_totals(SAMPLES), rel=1e-3)
    assert run_resource_totals({"attempts": [{"status": "SUCCEEDED"}]})["samples"] == 0


def test_a_negative_nan_or_huge_amount_written_by_hand_counts_as_absent_and_no_total_goes_below_zero():
    hostile = [{"event": "resources", "cpu": -50.0, "cpu_s": -500.0, "interval_s": 10.0},
               {"event": "resources", "cpu": 1.0, "cpu_s": float("nan"), "interval_s": -10.0, "rss_bytes": -1,
                "gpus": 1, "gpu_util": float("nan"), "gpu_mem_bytes": "lots"},
               {"event": "report", "metrics": {"data_wait_s": -100.0, "epoch_s": 10.0}}]
    totals = resource_totals(hostile, {"cpu_hour": 1.0, "gpu_hour": 1.0})
    assert totals["samples"] == 1 and totals["cpu_hours"] >= 0 and totals["cost"] >= 0
    assert totals["peak_rss_bytes"] == 0 and totals["peak_gpu_mem_bytes"] == 0
    kept = {"samples": float("nan"), "seconds": -5.0, "cpu_core_s": 10 ** 400, "gpu_s": float("inf"), "epoch_s": 2.0}
    usage = ResourceUsage.from_dict(kept)
    assert (usage.samples, usage.seconds, usage.cpu_core_s, usage.gpu_s, usage.epoch_s) == (0, 0.0, 0.0, 0.0, 2.0)
    overflowing = [{"event": "resources", "cpu": 1e308, "cpu_s": 1e308, "interval_s": 1e308, "gpus": 1e308,
                    "gpu_util": 1e308}] * 2
    json.dumps(resource_totals(overflowing, {"cpu_hour": 1.0, "gpu_hour": 1.0}), allow_nan=False)
    document = {"attempts": [{"resources": {"cpu_core_s": -3600.0, "samples": 1}}, {"resources": first_hour()}]}
    assert run_resource_totals(document, {"cpu_hour": 2.0})["cost"] == pytest.approx(2.0)


def first_hour() -> dict:
    usage = ResourceUsage()
    usage.take({"event": "resources", "cpu": 1.0, "cpu_s": 3600.0, "interval_s": 3600.0})
    return usage.as_dict()


def test_prices_come_from_the_environment_and_a_price_that_is_no_number_is_refused():
    assert prices_from({"RAYJOBS_PRICE_CPU_HOUR": "0.04"}) == {"cpu_hour": 0.04, "gpu_hour": None}
    with pytest.raises(ValueError, match="RAYJOBS_PRICE_GPU_HOUR must be a number"):
        prices_from({"RAYJOBS_PRICE_GPU_HOUR": "$3"})


def test_the_live_views_line_and_the_plain_report_line_show_the_last_sample():
    assert usage_line(SAMPLES[0]) == "CPU 1.5/2 · RSS 2.0 GiB"
    assert usage_line(SAMPLES[2]) == "CPU 1.9/2 · RSS 3.0 GiB · GPU 64 % · 4.0/160 GiB"
    # A sample written by hand: what is no amount reads as none, by the totals' own rule, and nothing raises.
    assert usage_line({"cpu": 10 ** 400, "cpus": "two", "rss_bytes": -1, "gpus": float("inf")}) == "CPU 0.0/0 · RSS 0.0 GiB"
    progress = RunProgress()
    progress.update(SAMPLES[2])
    assert progress.resources == SAMPLES[2]
    assert progress.as_dict()["resources"] == SAMPLES[2]
    report = {"event": "report", "time": 20.0, "iteration": 1, "metrics": {"epoch": 1, "train_loss": 0.5}}
    progress.update(report)
    assert event_line(report, progress).endswith("CPU 1.9/2 · RSS 3.0 GiB · GPU 64 % · 4.0/160 GiB")


def test_the_live_block_has_the_resource_line():
    import io

    from runner.follow.display import LiveProgress

    stream = io.StringIO()
    live = LiveProgress(RunProgress(), "raysubmit_x", stream)
    try:
        live.event(SAMPLES[0])
        from rich.console import Console

        console = Console(file=io.StringIO(), width=120)
        console.print(live)
        assert "CPU 1.5/2 · RSS 2.0 GiB" in console.file.getvalue()
    finally:
        live.close()


@pytest.mark.processes
def test_training_workers_on_other_machines_are_said_once_to_be_left_out(capfd):
    from rayjobs_agent.watch import JobWatch

    watch = JobWatch(60.0, 0.0)
    watch.event({"event": "attempt", "workers": [{"rank": 0, "node_ip": "127.0.0.1"},
                                                 {"rank": 1, "node_ip": "10.1.2.3"}, {"rank": 2}]}, 1.0)
    assert watch.worker_addresses == {"127.0.0.1", "10.1.2.3"}
    sampler = ResourceSampler(0.05, other_hosts=lambda: len(watch.worker_addresses - {"127.0.0.1"}))
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    out = capfd.readouterr().out
    assert out.count("resource use is sampled on this machine only: the job's processes on 1 other machine of the "
                     "cluster are not counted") == 1


def test_totals_of_a_record_written_by_hand_are_numbers_or_none_never_infinite():
    usage = ResourceUsage()
    usage.take({"event": "report", "t": 1, "metrics": [1, 2]})
    usage.take({"event": "report", "t": 1, "metrics": {"data_wait_s": 1e6, "epoch_s": 5e-324}})
    usage.take({"event": "resources", "t": 1, "cpu": 1.0, "cpu_s": 100.0, "cpus": 2, "interval_s": 5e-324})
    totals = usage.totals()
    assert totals["data_wait_share"] is None and totals["mean_cpu"] is None
