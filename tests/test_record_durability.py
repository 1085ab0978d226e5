"""The run record's keeper against storage that fails: nothing of the record is dropped without being counted.

The recorder (rayjobs_agent/recorder.py) runs here in this process, on a log file the test
writes, against stores that refuse writes or reads for a while, count the bytes written, or are real
(a local folder; moto's S3 behind the fault proxy). Time is the test's own clock where backoff matters.
"""

from __future__ import annotations

import pytest

import json
import time
from pathlib import Path
from typing import Any


from runner.records.store import Folder, attempt_events, attempt_log, read_run
from rayjobs_agent import record_store
from rayjobs_agent.record_store import Store, Uploader
from rayjobs_agent.recorder import RUN_FILE, Recorder

SUBMISSION = "raysubmit_dur"


class MemoryStore:
    """A store in a dict that refuses the next ``fail_writes`` writes (and ``fail_reads`` reads), counting bytes."""

    def __init__(self, fail_writes: int = 0, fail_reads: int = 0) -> None:
        self.location = "memory://run"
        self.files: dict[str, bytes] = {}
        self.fail_writes = fail_writes
        self.fail_reads = fail_reads
        self.bytes_written: dict[str, int] = {}

    def write(self, name: str, data: bytes) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise OSError("503 Slow Down")
        self.files[name] = bytes(data)
        self.bytes_written[name] = self.bytes_written.get(name, 0) + len(data)

    def read(self, name: str) -> bytes | None:
        if self.fail_reads > 0:
            self.fail_reads -= 1
            raise OSError("connection reset by peer")
        return self.files.get(name)

    def joined(self, folder: str) -> bytes:
        return b"".join(data for name, data in sorted(self.files.items()) if name.startswith(folder + "/"))

    def written_under(self, folder: str) -> int:
        return sum(size for name, size in self.bytes_written.items() if name.startswith(folder + "/"))


class Clock:
    """A monotonic clock the test moves; sleeping moves it too."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def make_recorder(store: Any, log_path: Path, clock: Clock, *, environ: dict[str, str] | None = None,
                  job_metadata: dict[str, str] | None = None, **config: Any) -> Recorder:
    log_path.touch()
    job_config = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"},
                  "metadata": {"job_submission_id": SUBMISSION, **(job_metadata or {})}}
    return Recorder(store, {"name": "dur", "every_s": 1, **config}, job_config, open(log_path, "rb"),
                    environ=environ or {}, clock=clock, sleep=clock.sleep)


def report_line(iteration: int) -> str:
    event = {"event": "report", "time": 1.0, "iteration": iteration, "epochs": 10 ** 6,
             "metrics": {"loss": 1.0 / iteration}}
    return f"(TrainController pid=7) rayjobs-event {json.dumps(event)}\n"


def test_a_store_that_fails_then_works_ends_with_the_whole_record_and_says_what_was_retried(tmp_path):
    store, clock, log = MemoryStore(fail_writes=3), Clock(), tmp_path / "driver.log"
    recorder = make_recorder(store, log, clock, part_bytes=200)
    recorder.start()
    with open(log, "a") as out:
        for iteration in range(1, 21):
            out.write(f"epoch {iteration} " + "x" * 40 + "\n" + report_line(iteration))
            out.flush()
            recorder.upload("RUNNING")
            clock.sleep(1)
    recorder.finish("SUCCEEDED", 0, within_s=60)

    assert store.joined(f"run-record/logs/{SUBMISSION}") == log.read_bytes(), "every part, in order"
    document = json.loads(store.files[RUN_FILE])
    assert document["status"] == "SUCCEEDED" and document["iterations"] == 20
    health = document["record_health"]
    assert health["failed_uploads"] == 3 and health["retried"] >= 1
    assert health["lost"] == {"writes": 0, "bytes": 0, "names": []} and health["waiting"] == 0
    assert "503 Slow Down" in health["last_error"]
    events = [json.loads(line) for line in store.joined(f"run-record/events/{SUBMISSION}").splitlines()]
    assert [event["iteration"] for event in events] == list(range(1, 21))


def test_writes_wait_for_the_backoff_which_doubles_up_to_its_cap():
    store, clock = MemoryStore(fail_writes=100), Clock()
    uploader = Uploader(store, clock)
    uploader.put("run.json", b"{}")
    delays = []
    for _ in range(10):
        assert uploader.flush() is False
        delays.append(round(uploader.next_try_at - clock.now, 3))
        assert uploader.flush() is False and store.fail_writes == 100 - len(delays), "no write before the backoff"
        clock.now = uploader.next_try_at
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0] and delays[-1] == record_store.RETRY_MAX_S
    store.fail_writes = 0
    assert uploader.flush() is True and uploader.retried == 1 and store.files["run.json"] == b"{}"


def test_storage_down_to_the_end_counts_what_was_lost_and_says_it_once_at_the_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(record_store, "MAX_PENDING_BYTES", 1000)
    store, clock, log = MemoryStore(), Clock(), tmp_path / "driver.log"
    recorder = make_recorder(store, log, clock, part_bytes=300)
    recorder.start()
    recorder.upload("RUNNING")
    store.fail_writes = 10 ** 6
    with open(log, "a") as out:
        out.write("y" * 3000 + "\n")
    recorder.upload("RUNNING")
    recorder.finish("FAILED", 1, within_s=10)
    health = recorder.uploader.health()
    # What waited past the memory bound was dropped as it went; the rest when the job's end gave up on it.
    assert health["lost"]["writes"] >= 10 and health["lost"]["bytes"] >= 3000 and health["waiting"] == 0
    assert health["failed_uploads"] >= 2
    said = capsys.readouterr().err
    assert said.count("rayjobs: the run record at memory://run could not be written") == 1
    assert said.count("rayjobs: run record: ") == 1 and "lost" in said.splitlines()[-1]


def test_storage_that_never_took_a_write_is_not_waited_for_at_the_end(tmp_path):
    store, clock, log = MemoryStore(fail_writes=10 ** 6), Clock(), tmp_path / "driver.log"
    recorder = make_recorder(store, log, clock)
    recorder.start()
    log.write_text("hello\n")
    recorder.finish("SUCCEEDED", 0, within_s=600)
    assert clock.now == 1000.0 and recorder.uploader.health()["lost"]["writes"] >= 1


EARLIER = {"format": 1, "status": "FAILED", "attempts": [
    {"submission_id": "raysubmit_first", "attempt": 1, "status": "FAILED", "started": 5.0}]}


def test_an_earlier_run_json_that_cannot_be_read_at_first_is_read_again_and_its_attempts_kept(tmp_path):
    store, clock, log = MemoryStore(fail_reads=3), Clock(), tmp_path / "driver.log"
    store.files[RUN_FILE] = json.dumps(EARLIER).encode()
    recorder = make_recorder(store, log, clock)
    recorder.start()
    for _ in range(4):
        log.write_text(log.read_text() + "working\n")
        recorder.upload("RUNNING")
        assert json.loads(store.files[RUN_FILE]) == EARLIER or recorder.previous_known, "never overwritten unread"
        clock.sleep(5)
    recorder.finish("SUCCEEDED", 0, within_s=5)
    attempts = json.loads(store.files[RUN_FILE])["attempts"]
    assert [attempt["submission_id"] for attempt in attempts] == ["raysubmit_first", SUBMISSION]


def test_a_run_json_that_can_never_be_read_is_never_overwritten_and_that_is_said(tmp_path, capsys):
    store, clock, log = MemoryStore(fail_reads=10 ** 6), Clock(), tmp_path / "driver.log"
    store.files[RUN_FILE] = json.dumps(EARLIER).encode()
    recorder = make_recorder(store, log, clock)
    recorder.start()
    log.write_text("the log is still kept\n")
    recorder.upload("RUNNING")
    recorder.finish("SUCCEEDED", 0, within_s=5)
    assert json.loads(store.files[RUN_FILE]) == EARLIER
    assert store.joined(f"run-record/logs/{SUBMISSION}") == b"the log is still kept\n"
    said = capsys.readouterr().err
    assert "rayjobs: run.json was not written" in said and "would have lost the attempts" in said


def test_an_earlier_run_json_that_is_no_run_record_is_kept_aside_whole(tmp_path):
    store, clock, log = MemoryStore(), Clock(), tmp_path / "driver.log"
    store.files[RUN_FILE] = b"{not json"
    recorder = make_recorder(store, log, clock)
    recorder.start()
    recorder.finish("SUCCEEDED", 0, within_s=1)
    assert store.files[f"run-record/{RUN_FILE}.unreadable-{SUBMISSION}"] == b"{not json"
    document = json.loads(store.files[RUN_FILE])
    assert [attempt["submission_id"] for attempt in document["attempts"]] == [SUBMISSION]
    assert any("kept as run-record/run.json.unreadable" in note for note in document["notes"])


def _bytes_per_event(tmp_path: Path, events: int) -> float:
    store, clock, log = MemoryStore(), Clock(), tmp_path / f"driver-{events}.log"
    recorder = make_recorder(store, log, clock, event_part_bytes=16 * 1024)
    recorder.start()
    with open(log, "a") as out:
        for iteration in range(1, events + 1):
            out.write(report_line(iteration))
            if iteration % 10 == 0:
                out.flush()
                recorder.upload("RUNNING")
    recorder.finish("SUCCEEDED", 0, within_s=1)
    saved = [json.loads(line) for line in store.joined(f"run-record/events/{SUBMISSION}").splitlines()]
    assert len(saved) == events and saved[-1]["iteration"] == events
    assert recorder.event_summary.count == events and len(recorder.events) == 1, "only the last report is held"
    return store.written_under(f"run-record/events/{SUBMISSION}") / events


def test_events_cost_bytes_in_proportion_to_their_number_not_its_square(tmp_path):
    few, many = _bytes_per_event(tmp_path, 300), _bytes_per_event(tmp_path, 3000)
    # Each upload rewrites only the growing part: ten times the events, about the same bytes for each.
    # (One file rewritten whole at every upload would write about ten times as many bytes per event.)
    assert many < few * 1.5, (few, many)


def test_the_log_and_events_are_masked_even_when_a_secret_arrives_in_two_reads(tmp_path):
    secret = "s3cr3t-v4lue-123"
    store, clock, log = MemoryStore(), Clock(), tmp_path / "driver.log"
    recorder = make_recorder(store, log, clock, environ={"API_TOKEN": secret},
                             job_metadata={"rayjobs.secret_env_vars": "API_TOKEN"})
    recorder.start()
    event = json.dumps({"event": "stage", "name": f"token {secret}", "time": 1.0})
    with open(log, "a") as out:
        out.write(f"connecting with {secret[:7]}")
        out.flush()
        recorder.upload("RUNNING")
        out.write(f"{secret[7:]} to https://user:{secret}@example.com\nrayjobs-event {event}\n")
        out.flush()
        recorder.upload("RUNNING")
        out.write(f"no end of line {secret}")
    recorder.finish("SUCCEEDED", 0, within_s=1)
    saved = store.joined(f"run-record/logs/{SUBMISSION}")
    assert secret.encode() not in saved and saved.count(b"***") == 4, saved
    assert saved.startswith(b"connecting with *** to https://user:***@example.com\n")
    (kept,) = [json.loads(line) for line in store.joined(f"run-record/events/{SUBMISSION}").splitlines()]
    assert kept["name"] == "token ***"


def test_a_record_written_in_parts_and_one_written_before_parts_both_read_back(tmp_path):
    folder = Folder(str(tmp_path / "run"))
    old, new = {"event": "report", "iteration": 1}, {"event": "report", "iteration": 2}
    folder.write("run-record/events/raysubmit_old.jsonl", (json.dumps(old) + "\n").encode())
    store = Store.at(str(tmp_path / "run"))
    recorder = make_recorder(store, tmp_path / "driver.log", Clock(), event_part_bytes=30)
    recorder.start()
    with open(tmp_path / "driver.log", "a") as out:
        for iteration in range(1, 6):
            out.write(f"rayjobs-event {json.dumps({**new, 'iteration': iteration})}\n")
    recorder.finish("SUCCEEDED", 0, within_s=1)
    assert len(folder.files(f"run-record/events/{SUBMISSION}")) == 5
    assert attempt_events(folder, "raysubmit_old") == [old]
    assert [event["iteration"] for event in attempt_events(folder, SUBMISSION)] == [1, 2, 3, 4, 5]
    assert read_run(folder)["attempts"][0]["event_parts"] == 5


@pytest.mark.processes
def test_an_s3_outage_mid_run_ends_with_a_complete_record_that_says_what_was_retried(tmp_path, aws_env, s3_endpoint,
                                                                                        monkeypatch):
    from tests.support.fault_proxy import FaultProxy
    from tests.support.s3_server import create_bucket

    create_bucket(s3_endpoint, "flaky")
    log = tmp_path / "driver.log"
    with FaultProxy(int(s3_endpoint.rsplit(":", 1)[1])) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.address)
        recorder = make_recorder(Store.at("s3://flaky/runs/one"), log, Clock(), part_bytes=256)
        recorder.clock = recorder.uploader.clock = time.monotonic
        recorder.sleep = time.sleep
        recorder.start()
        with open(log, "a") as out:
            for iteration in range(1, 13):
                if iteration == 5:
                    proxy.outage(3.0)
                out.write(f"step {iteration} " + "z" * 100 + "\n" + report_line(iteration))
                out.flush()
                recorder.upload("RUNNING")
                time.sleep(0.3)
        recorder.finish("SUCCEEDED", 0, within_s=30)

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    folder = Folder("s3://flaky/runs/one")
    assert attempt_log(folder, SUBMISSION) == log.read_bytes()
    assert [event["iteration"] for event in attempt_events(folder, SUBMISSION)] == list(range(1, 13))
    health = read_run(folder)["record_health"]
    assert health["failed_uploads"] >= 1 and health["retried"] >= 1 and health["lost"]["writes"] == 0, health
