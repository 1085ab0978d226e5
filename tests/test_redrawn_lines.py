"""A line the job never ends (a progress bar redrawn with carriage returns for hours, binary output) costs the
wrapper bounded memory: the record's keeper (``rayjobs_agent/recorder.py``) and the judge's own reading of the log
(``rayjobs_agent/judge.py``'s ``OwnLog``) keep only the line's last drawing, and at most its latest 1 MiB, while
the record still keeps every byte of the log, masked, and every event the log holds.

The keeper and the judge run here in this process, on a real log file the test writes and a record in a local
folder; what is measured is what they hold between reads, never time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayjobs_agent.judge import OwnLog
from rayjobs_agent.record_parts import MAX_UNFINISHED_LINE_BYTES, LineBuffer
from rayjobs_agent.record_store import Store
from rayjobs_agent.recorder import Recorder
from runner.records.store import Folder, attempt_events, attempt_log

TOKEN = "tok-5fff17c6ae3f4c64"
SUBMISSION = "raysubmit_bar"
ENVIRON = {"API_TOKEN": TOKEN}
# What the wrapper may hold of one line at any time: the bound, and the read it is trimmed after.
HELD_AT_MOST = 2 * MAX_UNFINISHED_LINE_BYTES


def report_line(iteration: int) -> str:
    event = {"event": "report", "time": 1.0, "iteration": iteration, "metrics": {"loss": 0.5}}
    return f"rayjobs-event {json.dumps(event)}\n"


def keeper(tmp_path: Path, log: Path) -> Recorder:
    log.touch()
    return Recorder(Store.at(str(tmp_path / "run")), {"name": "bar", "every_s": 1}, {"metadata": {
        "job_submission_id": SUBMISSION}}, open(log, "rb"), environ=ENVIRON)


def test_fifty_megabytes_of_a_redrawn_progress_bar_keep_the_wrapper_bounded_and_the_record_whole(tmp_path):
    log = tmp_path / "driver.log"
    recorder = keeper(tmp_path, log)
    judge = OwnLog(open(log, "rb"))
    redraws = "".join(f"\rstep {step:>7}/9999999 [{'#' * (step % 60):<60}] token {TOKEN}" for step in range(1000))
    written = bytearray()
    held = []
    with open(log, "ab") as out:
        while len(written) <= 50 * 1024 * 1024:  # 50 MB, and never a line end
            out.write(redraws.encode())
            out.flush()
            written += redraws.encode()
            recorder.read_log()
            assert judge.read() == []
            held.append((len(recorder.event_lines.unfinished), recorder.log.masking.held,
                         len(judge._lines.unfinished)))
        last = f"\rValueError: token {TOKEN} refused\n" + report_line(1)
        out.write(last.encode())
        written += last.encode()
    assert len(written) > 50 * 1024 * 1024
    most_kept, most_held_for_secrets, most_judged = map(max, zip(*held))
    assert most_kept <= HELD_AT_MOST and most_judged <= HELD_AT_MOST, (most_kept, most_judged)
    assert most_held_for_secrets < len(TOKEN), "only what may begin a secret waits for the next read"

    # The judge reads the line as it was last drawn, a redrawn line still (so that it is no sign of life).
    assert judge.read() == [f"\rValueError: token {TOKEN} refused", report_line(1).rstrip("\n")]
    recorder.finish("FAILED", 1, within_s=1)
    record = Folder(str(tmp_path / "run"))
    assert attempt_log(record, SUBMISSION) == bytes(written).replace(TOKEN.encode(), b"***"), \
        "the record keeps every byte of the log, masked"
    assert [event["event"] for event in attempt_events(record, SUBMISSION)] == ["report"]
    assert json.loads(record.read("run.json"))["iterations"] == 1


@pytest.mark.parametrize("redrawn", ["\r", "\r\r", "\r\n\r"])
def test_a_secret_cut_into_two_reads_beside_a_carriage_return_is_kept_masked(tmp_path, redrawn):
    text = f"progress 10%{redrawn}token {TOKEN}{redrawn}progress 20%\n{report_line(2)}"
    masked = text.replace(TOKEN, "***").encode()
    data = text.encode()
    secret_at = data.index(TOKEN.encode())
    for cut in range(secret_at - 4 - len(redrawn), secret_at + len(TOKEN) + 3 + len(redrawn)):
        log = tmp_path / f"driver-{cut}.log"
        recorder = keeper(tmp_path / str(cut), log)
        with open(log, "ab") as out:
            for piece in (data[:cut], data[cut:]):
                out.write(piece)
                out.flush()
                recorder.read_log()
        recorder.read_log(ended=True)
        assert recorder.part == masked, cut
        assert recorder.event_summary.count == 1, cut


@pytest.mark.parametrize("chunking", [1, 2, 3, 7, 1000])
def test_a_line_buffer_reads_the_same_lines_however_the_log_is_cut(chunking):
    data = (b"plain\nbar 1%\rbar 2%\rbar 3%\nrayjobs-event {}\r\nbar\r\r" + b"x" * 50 + b"\rlast\r\nend\n"
            + b"\r\r\rtail\n")
    buffer = LineBuffer(max_bytes=16)
    lines = []
    for start in range(0, len(data), chunking):
        lines += buffer.feed(data[start:start + chunking])
    assert lines == [b"plain", b"\rbar 3%", b"rayjobs-event {}\r", b"\rlast\r", b"end", b"\rtail"]
    assert buffer.unfinished == b""


def test_a_line_that_never_ends_keeps_its_latest_bytes():
    buffer = LineBuffer(max_bytes=1000)
    for number in range(10_000):
        assert buffer.feed(f"{number:05d} ".encode()) == []
        assert len(buffer.unfinished) <= 2000
    (line,) = buffer.feed(b"Error: the end\n")
    assert line.endswith(b"09999 Error: the end") and 1000 <= len(line) <= 2000 + len(b"Error: the end")
