"""What a job uses, sampled by the agent beside it (rayjobs_agent/resources.py): the job's own processes found in
/proc (its entrypoint's tree and the Ray workers marked with its job id), their CPU and memory, the totals that
the record, ``rayjobs show`` and ``rayjobs ui`` read, and the live view's line. The real sampler in a real job on
the session cluster: tests/test_resources_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayjobs_agent.resources import (JobProcesses, ProcessTable, ResourceSampler, ResourceUsage, descendants,
                                     prices_from, resource_totals, sampling_every_s, totals_lines, usage_line)
from rayjobs_agent.vocabulary import decode
from runner.follow.progress import RunProgress, event_line
from runner.records.report import run_resource_totals
from tests.support.waiting import wait_for_condition

BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: pass\n"
IDLE = "import time; time.sleep(60)"


def _start(code: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env})


def test_the_job_is_its_entrypoints_tree_and_the_ray_workers_marked_with_its_id_and_nothing_else():
    # The root's tree: a shell whose child spins. Beside it, a "Ray worker" of this job (RAY_JOB_ID), one of
    # another job, and an unrelated process: only the first two families count.
    tree = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c '{BUSY}'; true"])
    ours = _start(IDLE, RAY_JOB_ID="0a000000")
    theirs = _start(BUSY, RAY_JOB_ID="0b000000")
    stranger = _start(BUSY)
    try:
        wait_for_condition(lambda: len(descendants(ProcessTable().read()[0], tree.pid)) == 1)
        job = JobProcesses(tree.pid, lambda: "0a000000")
        assert job.sample()["cpu"] is None, "the first sample only sets the baseline"
        time.sleep(1.5)
        sample = job.sample()
        (spinner,) = descendants(ProcessTable().read()[0], tree.pid)
        assert sample["pids"] == {spinner, ours.pid}
        assert sample["processes"] == 2
        # One spinning process of the job's, beside two others that spin: some of a core, never the others' too.
        assert 0 < sample["cpu"] < 1.3, sample
        assert sample["rss_bytes"] > 5 * 1024 * 1024
    finally:
        for process in (tree, ours, theirs, stranger):
            process.kill()
        for process in (ours, theirs, stranger):
            process.wait()
        subprocess.run(["pkill", "-P", str(tree.pid)], check=False)
        tree.wait()


def test_a_process_started_between_samples_counts_all_its_time_and_a_reused_pid_is_not_mixed_up():
    job = JobProcesses(os.getpid(), lambda: None)
    job.sample()
    # A process's start is read in clock ticks and the sample's time from /proc/uptime: one started within a tick
    # or two of a sample is taken for one that was already there, and its first interval is not counted.
    time.sleep(0.1)
    child = _start(BUSY)
    try:
        time.sleep(1.2)
        sample = job.sample()
        assert child.pid in sample["pids"]
        assert sample["cpu"] > 0.1, "its CPU since it started is new, though it had no baseline"
    finally:
        child.kill()
        child.wait()
    assert child.pid not in job.sample()["pids"]


def test_the_jobs_id_is_read_off_the_log_its_ray_driver_keeps_open(tmp_path):
    from rayjobs_agent.resources import job_id_of_driver

    log = tmp_path / f"python-core-driver-0d000000{'f' * 48}_4242.log"
    opener = tmp_path / "driver.py"
    opener.write_text(f"import time\nhandle = open({str(log)!r}, 'w')\ntime.sleep(60)\n")
    # The entrypoint's shell, and under it a "driver" holding its core worker's log open; beside them, outside the
    # tree, a "Ray worker" of the same job.
    shell = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} {opener}; true"])
    worker = _start(IDLE, RAY_JOB_ID="0d000000")
    try:
        job = JobProcesses(shell.pid)
        wait_for_condition(lambda: job.sample()["processes"] == 2)  # the driver (the root is not its own job), the worker
        assert job.job_id() == "0d000000"
        assert worker.pid in job.sample()["pids"]
        (driver,) = descendants(ProcessTable().read()[0], shell.pid)
        assert job_id_of_driver(driver) == "0d000000"
        assert job_id_of_driver(worker.pid) is None, "a process that keeps no driver's log open is no driver"
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()
        worker.kill()
        worker.wait()


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
                              timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    text = log.read_bytes().decode()
    assert text.startswith("progress 10%\rprogress 100%\n"), "nothing came between the job's bytes of one line"
    assert text.count('"event":"resources"') >= 2, "once the line ended, samples were said in the log again"
    assert int(done.stderr.split("kept ")[1]) >= 2, "the samples the log could not take went to the record"
    assert LogEnd().at_line_start() in (True, False)


def test_a_job_id_not_yet_known_counts_the_entrypoints_tree_alone():
    worker = _start(IDLE, RAY_JOB_ID="0c000000")
    try:
        sample = JobProcesses(os.getpid(), lambda: None).sample()
        assert worker.pid in sample["pids"], "a child of the root is in its tree, marked or not"
        elsewhere = _start(IDLE)
        try:
            assert JobProcesses(elsewhere.pid, lambda: None).sample()["pids"] == set(), \
                "a marked process outside the tree waits for the job's id"
            assert JobProcesses(elsewhere.pid, lambda: "0c000000").sample()["pids"] == {worker.pid}
        finally:
            elsewhere.kill()
            elsewhere.wait()
    finally:
        worker.kill()
        worker.wait()


def test_the_sampler_writes_resources_events_and_a_broken_read_is_said_once_and_never_reaches_the_job(capfd):
    sampler = ResourceSampler(0.2, lambda: None)
    sampler.start()
    wait_for_condition(lambda: "rayjobs-event" in capfd.readouterr().out or sampler.sample() is not None)
    sampler.stop()

    broken = ResourceSampler(0.05, lambda: None)

    def refuse():
        raise PermissionError("/proc is not ours to read")

    broken.processes.table.read = refuse  # type: ignore[method-assign]
    broken.start()
    broken._thread.join(5)
    assert not broken._thread.is_alive()
    out = capfd.readouterr().out
    assert out.count("resource sampling stopped (PermissionError: /proc is not ours to read); the job goes on") == 1


def test_a_sample_is_a_resources_event_line_the_client_decodes(capfd):
    sampler = ResourceSampler(0.1, lambda: None, cpus=2)
    sampler.sample()
    time.sleep(0.2)
    fields = sampler.sample()
    assert fields is not None and set(fields) >= {"cpu", "cpus", "rss_bytes", "processes", "every_s"}
    from rayjobs_agent.events import emit

    emit("resources", **fields)
    event = decode(capfd.readouterr().out.strip())
    assert event is not None and event["event"] == "resources" and event["cpus"] == 2


def test_sampling_a_job_never_imports_ray_into_the_agent():
    # Importing Ray costs the agent a CPU-second and 150 MiB in every job; the sampler reads /proc alone (and NVML
    # only where its library loads, which a machine without an NVIDIA driver has not).
    code = ("import sys, time\nfrom rayjobs_agent.resources import ResourceSampler\n"
            "sampler = ResourceSampler(0.1, other_hosts=lambda: 0)\nsampler.start()\ntime.sleep(0.5)\n"
            "sampler.stop()\nprint(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert done.stdout.count('"event":"resources"') >= 2


@pytest.mark.parametrize(("value", "every_s"), [(None, 10.0), ("", 10.0), ("2.5", 2.5), ("0", None), ("often", None)])
def test_sampling_is_every_ten_seconds_unless_the_job_says_otherwise(value, every_s):
    environ = {} if value is None else {"RAYJOBS_RESOURCES_EVERY_S": value}
    assert sampling_every_s(environ) == every_s
    if every_s is None:
        assert ResourceSampler.for_job(environ) is None


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


def test_prices_come_from_the_environment_and_a_price_that_is_no_number_is_refused():
    assert prices_from({"RAYJOBS_PRICE_CPU_HOUR": "0.04"}) == {"cpu_hour": 0.04, "gpu_hour": None}
    with pytest.raises(ValueError, match="RAYJOBS_PRICE_GPU_HOUR must be a number"):
        prices_from({"RAYJOBS_PRICE_GPU_HOUR": "$3"})


def test_the_live_views_line_and_the_plain_report_line_show_the_last_sample():
    assert usage_line(SAMPLES[0]) == "CPU 1.5/2 · RSS 2.0 GiB"
    assert usage_line(SAMPLES[2]) == "CPU 1.9/2 · RSS 3.0 GiB · GPU 64 % · 4.0/160 GiB"
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


def test_a_process_whose_name_holds_spaces_and_parentheses_is_read_right():
    # /proc/PID/stat puts the command's name in parentheses, and a process may name itself anything: the fields are
    # read after the last ")", or this process's CPU ticks and start would be read from the wrong columns.
    hostile = _start("open('/proc/self/comm', 'w').write('a) 1 2 (b')\n" + BUSY)
    try:
        job = JobProcesses(os.getpid(), lambda: None)
        wait_for_condition(lambda: open(f"/proc/{hostile.pid}/comm").read().strip() == "a) 1 2 (b")
        job.sample()
        time.sleep(1.0)
        sample = job.sample()
        assert hostile.pid in sample["pids"]
        assert 0 < sample["cpu"] < 2.5, sample
        assert ProcessTable().read()[0][hostile.pid] == os.getpid(), "its parent, read from the right column"
    finally:
        hostile.kill()
        hostile.wait()
