"""Reading progress out of a job's log: events found and taken out, Ray's chatter hidden, the job's lines kept."""

from __future__ import annotations

import io
import json

import pytest

from runner.follow.display import PlainProgress
from runner.follow.log_view import LogView, is_ray_chatter
from rayjobs_agent.causes import short_reason
from rayjobs_agent.vocabulary import decode as parse_event
from runner.follow.progress import RunProgress, event_line

# Lines as Ray wrote them into a quickstart job's driver log, forwarded prefixes and colour included.
CHATTER = [
    "\x1b[36m(RayTrainWorker pid=4242)\x1b[0m Reporting training result 1: TrainingReport(checkpoint=None, "
    "metrics={'epoch': 1}, validation_spec=None)",
    "[2026-11-24 14:49:10,611 I 4242 4300] core_worker.cc:512: PreemptionWatcher started",
    "2026-11-24 14:49:10,611\tINFO worker.py:1778 -- Connecting to existing Ray cluster at address: 127.0.0.1:6379...",
    "(TrainController pid=77) Attempting to start training worker group of size 2 with the following resources: "
    "[{'CPU': 1}] * 2",
    "(RayTrainWorker pid=1, ip=127.0.0.1) Setting up process group for: env:// [rank=0, world_size=2]",
    "(TrainController pid=12038) Requesting resources: {'CPU': 1.0} * 2",
    "(TrainController pid=12038) - (ip=127.0.0.1, pid=12152) world_rank=0, local_rank=0, node_rank=0",
    "(RayTrainWorker pid=12152) Checkpoint successfully created at: Checkpoint(filesystem=local, path=/tmp/x)",
    "/venv/lib/python3.11/site-packages/ray/data/_internal/execution/operators/task_pool_map_operator.py:319: "
    "UserWarning: The maximum number of concurrent tasks for 'ReadParquet' is set to 2",
    "  warnings.warn(",
]
OWN_LINES = [
    "epoch 1/4: train_loss 2.3 val_loss 2.2 val_accuracy 0.1",
    "(RayTrainWorker pid=4242) my own print from rank 1",
    "[step 10] loss 0.5",
    "2026 was a good year",
    "Stage 2/3: Train",
    # A line of the job's own that Ray folded with its twins from other workers is still the job's.
    "(RayTrainWorker pid=9) loss went down [repeated 2x across cluster]",
    "/home/me/train.py:12: UserWarning: my own warning",
]


def event_text(**fields) -> str:
    return "rayjobs-event " + json.dumps(fields)


def view_of(*, raw: bool = False, strip_ansi: bool = True):
    out, events = io.StringIO(), []
    return out, events, LogView(out, events.append, raw=raw, strip_ansi=strip_ansi)


@pytest.mark.parametrize("line", CHATTER)
def test_ray_chatter_is_recognised(line):
    from runner.follow.log_view import ANSI_ESCAPE

    assert is_ray_chatter(ANSI_ESCAPE.sub("", line))


@pytest.mark.parametrize("line", OWN_LINES)
def test_a_jobs_own_lines_are_not_chatter(line):
    assert not is_ray_chatter(line)


def test_events_and_chatter_leave_the_view_and_the_jobs_lines_stay_in_order():
    out, events, view = view_of()
    report = event_text(event="report", time=1.0, iteration=1, metrics={"epoch": 1, "val_loss": 2.0})
    log = "\n".join([OWN_LINES[0], CHATTER[0], f"\x1b[36m(TrainController pid=77)\x1b[0m {report}", OWN_LINES[1],
                     CHATTER[1], OWN_LINES[2]]) + "\n"
    # Delivered in pieces of every size, cut anywhere, as a log stream delivers it.
    for start in range(0, len(log), 7):
        view.write(log[start:start + 7])
    view.close()
    assert out.getvalue() == "\n".join([OWN_LINES[0], OWN_LINES[1], OWN_LINES[2]]) + "\n"
    assert [event["event"] for event in events] == ["report"] and events[0]["metrics"]["val_loss"] == 2.0
    assert view.hidden_lines == 3


def test_raw_shows_every_line_as_written_and_still_reads_the_events():
    out, events, view = view_of(raw=True, strip_ansi=False)
    log = f"{CHATTER[0]}\n{event_text(event='stage', name='train', state='start')}\nlast line without end"
    view.write(log)
    view.close()
    assert out.getvalue() == log
    assert events == [{"event": "stage", "name": "train", "state": "start"}]


def test_a_progress_bar_redrawn_with_carriage_returns_is_shown_at_once():
    out, _, view = view_of()
    view.write("10%|#    |\r")
    assert out.getvalue() == "10%|#    |\r"  # not held back although it has no end yet
    view.write("20%|##   |\r100%|#####|\n")
    view.close()
    assert out.getvalue() == "10%|#    |\r20%|##   |\r100%|#####|\n"


def test_a_line_that_may_be_an_event_waits_for_its_end():
    out, events, view = view_of()
    view.write("(TrainController pid=7) rayjobs-event {\"event\": \"rep")
    assert out.getvalue() == ""
    view.write("ort\", \"iteration\": 3, \"metrics\": {}}\n")
    assert out.getvalue() == "" and events[0]["iteration"] == 3


@pytest.mark.parametrize("text", ["rayjobs-event {not json}", "rayjobs-event [1, 2]", "rayjobs-event {\"no\": 1}",
                                  "talking about rayjobs-event here"])
def test_malformed_events_are_ordinary_lines(text):
    assert parse_event(text) is None
    out, events, view = view_of()
    view.write(text + "\n")
    assert out.getvalue() == text + "\n" and events == []


def test_progress_pace_eta_and_restarts():
    progress = RunProgress()
    progress.update({"event": "train_start", "time": 0, "epochs": 10, "workers": 2})
    progress.update({"event": "attempt", "time": 1, "attempt": 1, "nodes": 1,
                     "workers": [{"rank": 0, "node_id": "a"}, {"rank": 1, "node_id": "a"}]})
    for epoch, at in ((1, 10.0), (2, 20.0), (3, 30.0)):
        progress.update({"event": "report", "time": at, "iteration": epoch, "metrics": {"epoch": epoch, "loss": 1 / epoch}})
    assert progress.seconds_per_epoch() == pytest.approx(10.0)
    assert progress.eta_s() == pytest.approx(70.0)
    line = event_line({"event": "report", "checkpoint": True}, progress)
    assert line == "epoch 3/10 · loss 0.3333 · 10.0s/epoch · ETA 1m10s · checkpoint saved"

    reason = ("Training failed due to worker errors:\n[Rank 1 Worker]\nTraceback (most recent call last):\n"
              "  File \"loop.py\", line 3, in f\nSystemExit: 1\n")
    progress.update({"event": "restart", "time": 31, "attempt": 1, "reason": reason})
    progress.update({"event": "attempt", "time": 35, "attempt": 2, "nodes": 1, "workers": []})
    assert progress.seconds_per_epoch() is None  # a new attempt: the pace starts again
    assert progress.as_dict()["restarts"] == [{"attempt": 1, "reason": reason, "time": 31.0, "run": None}]
    assert progress.as_dict()["attempts"] == 2
    assert short_reason(reason) == "SystemExit: 1"


def test_a_loop_that_reports_no_epoch_is_counted_in_iterations():
    progress = RunProgress()
    progress.update({"event": "report", "time": 1, "iteration": 1, "metrics": {"loss": 0.5, "note": "x"}})
    assert event_line({"event": "report"}, progress) == "iteration 1 · loss 0.5"


def test_plain_progress_writes_one_line_per_event_without_colour():
    notes = io.StringIO()
    shown = PlainProgress(RunProgress(), notes)
    shown.event({"event": "stage", "name": "train", "state": "start", "index": 2, "count": 3})
    shown.event({"event": "train_start", "epochs": 4, "workers": 2, "max_failures": 1})
    shown.event({"event": "train_end", "state": "FINISHED", "attempts": 1})
    assert notes.getvalue().splitlines() == [
        "rayjobs: stage train (2/3) started",
        "rayjobs: training started: 2 workers, 4 epochs, max_failures 1",
        "rayjobs: training finished after 0 reports",
    ]
    assert "\x1b" not in notes.getvalue()


def test_the_source_line_under_a_hidden_ray_warning_is_hidden_and_the_jobs_own_is_not():
    out = io.StringIO()
    view = LogView(out, raw=False)
    view.write("(TrainController pid=6279) /venv/lib/python3.11/site-packages/ray/data/_internal/execution/"
               "interfaces/execution_options.py:436: RayDeprecationWarning: `exclude_resources` is deprecated.\n"
               "(TrainController pid=6279)   self.exclude_resources = exclude_resources\n"
               "(RayTrainWorker pid=12)   indented output of the job\n"
               "/home/me/train.py:12: UserWarning: my own warning\n"
               "  warn_me()\n")
    view.close()
    assert out.getvalue().splitlines() == ["(RayTrainWorker pid=12)   indented output of the job",
                                           "/home/me/train.py:12: UserWarning: my own warning", "  warn_me()"]


def test_steps_within_an_epoch_move_the_live_bar_and_print_no_plain_line():
    from runner.follow.progress import epochs_done
    from tests.support.live_view import progress_after, rendered_live_view

    notes = io.StringIO()
    plain = PlainProgress(RunProgress(), notes)
    plain.event({"event": "train_start", "epochs": 4, "workers": 2})
    plain.event({"event": "step", "epoch": 1, "step": 10, "steps": 40})
    assert notes.getvalue().count("\n") == 1, "a step is for the live bar only"
    assert epochs_done(plain.progress) == 0.25

    progress = progress_after([{"event": "train_start", "epochs": 4},
                               {"event": "report", "iteration": 1, "metrics": {"epoch": 1}},
                               {"event": "step", "epoch": 2, "step": 20, "steps": 40}])
    screen = rendered_live_view(progress)
    assert "epoch 2/4 · step 20/40" in screen and " 38%" in screen, screen
    progress.update({"event": "report", "iteration": 2, "metrics": {"epoch": 2}})
    assert (progress.step, progress.step_epoch, progress.as_dict()["steps"], epochs_done(progress)) == \
        (None, None, None, 2.0)


RAY_WORKER_GROUP_ERROR = """Training failed due to worker errors:
[Rank 0 Error Snippet]:
Traceback (most recent call last):
  File "train.py", line 36, in train_func
    loss = ((model(inputs) - targets) ** 2).mean()
RuntimeError: [gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:4811: Connection reset by peer.

[Rank 1 Error Snippet]:
A worker health check failed.
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: ...
"""


def test_the_reason_of_a_restart_names_the_rank_that_died_not_the_rank_left_hanging():
    assert short_reason(RAY_WORKER_GROUP_ERROR) == \
        "rank 1's worker process died (Worker unexpectedly exits with a connection error code 2)"
    own_error = RAY_WORKER_GROUP_ERROR.split("[Rank 1")[0] + "[Rank 1 Error Snippet]:\nValueError: bad batch\n"
    assert short_reason(own_error) == "rank 1: ValueError: bad batch"


def test_an_event_is_told_after_the_lines_before_it_and_before_the_lines_after_it():
    out = io.StringIO()
    order = []

    class Recording(io.StringIO):
        def write(self, text):
            order.extend(("line", line) for line in text.splitlines())
            return super().write(text)

    out = Recording()
    view = LogView(out, lambda event: order.append(("event", event["name"])))
    view.write("before\n" + event_text(event="stage", name="train", state="end") + "\nafter\n")
    view.close()
    assert order == [("line", "before"), ("event", "train"), ("line", "after")]


def test_the_client_reads_the_marker_the_cluster_side_writes():
    from rayjobs_agent.vocabulary import EVENT_MARKER
    from rayjobs_agent.vocabulary import EVENT_MARKER as WRITTEN

    assert WRITTEN == EVENT_MARKER
