"""A sweep's failed trials are counted one by one: each trial is a training run with its own max_failures."""

from __future__ import annotations

from rayjobs_agent.causes import FailureReader

BATCH_NORM = "ValueError: Expected more than 1 value per channel when training"


def _trial_failing(reader: FailureReader, trial: str, max_failures: int) -> None:
    for attempt in range(1, max_failures + 2):
        reader.event({"event": "attempt", "run": trial, "attempt": attempt})
        if attempt <= max_failures:
            reader.event({"event": "restart", "run": trial, "attempt": attempt, "reason": BATCH_NORM})
    reader.event({"event": "train_end", "run": trial, "state": "ERRORED", "reason": BATCH_NORM})


def test_four_trials_that_each_used_up_two_restarts_are_counted_per_trial():
    reader = FailureReader()
    trials = [f"trial-{number:04d}" for number in range(4)]
    for trial in trials:
        _trial_failing(reader, trial, max_failures=2)
    text = reader.diagnose().text
    assert text.startswith("Training failed in 4 runs, each with its own max_failures (2): "
                           + ", ".join(f"{trial} 3 times" for trial in trials)), text
    assert "max_failures (8)" not in text and BATCH_NORM in text


def test_one_run_keeps_its_single_run_wording():
    reader = FailureReader()
    _trial_failing(reader, "quickstart", max_failures=2)
    assert reader.diagnose().text.startswith(
        "Training failed 3 times and used up its max_failures (2)")
