"""A Ray Train run on the session cluster whose progress callback fails: the training still succeeds.

The job names two callbacks of its own in ``RAY_TRAIN_CALLBACKS`` (the record keeper adds rayjobs' own
after them): one that counts reports, and one built on rayjobs' ``ProgressCallback`` whose report hook
raises, as a hook of ours would meet a Ray that changed under it. Ray turns an exception in a callback
into a failed run; the guard turns it into one line in the log and a note in the run record.
"""

from __future__ import annotations

import shutil

from runner.runs.store import Folder, attempt_events, read_run
from tests.support.cli import REPO_ROOT

SCRIPT = REPO_ROOT / "tests" / "data" / "scripts" / "plain_ray_train.py"
EPOCHS = 3

USER_CALLBACKS = '''
from ray.train.v2._internal.execution.callback import ReportCallback

from rayjobs_observe.guard import guarded
from rayjobs_observe.train_callback import ProgressCallback


class CountingCallback(ReportCallback):
    def after_report(self, training_report, metrics):
        print(f"user callback: report at epoch {metrics[0]['epoch']}", flush=True)


class BrokenProgress(ProgressCallback):
    @guarded
    def after_report(self, training_report, metrics):
        raise RuntimeError("simulated failure of a progress hook")
'''


def test_a_failing_progress_hook_beside_the_jobs_own_callback_leaves_the_training_successful(rayjobs_cli, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train.py")
    (code / "user_callbacks.py").write_text(USER_CALLBACKS)
    spec = tmp_path / "guarded.yaml"
    # One training worker: the callbacks run in the Train controller, whatever the number of workers.
    spec.write_text(f"name: guarded-train\nentrypoint: python train.py --storage {tmp_path / 'runs'} "
                    f"--epochs {EPOCHS} --epoch-s 0.1 --workers 1\n"
                    f"record_path: {tmp_path / 'records'}\nrecord_every_s: 1\n"
                    f"runtime_env:\n  working_dir: {code}\n  env_vars:\n"
                    "    RAY_TRAIN_CALLBACKS: user_callbacks.CountingCallback,user_callbacks.BrokenProgress\n")
    submitted = rayjobs_cli("submit", str(spec), timeout=300)
    assert submitted.returncode == 0, submitted.stderr[-4000:]

    (run,) = [name for name in Folder(str(tmp_path / "records")).subfolders()]
    folder = Folder(str(tmp_path / "records" / run))
    document = read_run(folder)
    assert document["status"] == "SUCCEEDED"
    log = rayjobs_cli("logs", str(folder.location)).stdout
    assert [line.split("user callback: ", 1)[1] for line in log.splitlines() if "user callback: " in line] == [
        f"report at epoch {epoch}" for epoch in range(1, EPOCHS + 1)], "the job's own callback ran"
    said = [line for line in log.splitlines() if "rayjobs: progress unavailable" in line]
    assert len(said) == 1 and "simulated failure of a progress hook" in said[0], log[-4000:]
    assert said[0].endswith("; the run goes on")
    # rayjobs' own callback, after the job's, went on reporting every epoch.
    (attempt,) = document["attempts"]
    reports = [event for event in attempt_events(folder, attempt["submission_id"]) if event["event"] == "report"]
    assert [event["iteration"] for event in reports] == list(range(1, EPOCHS + 1))
    assert document["iterations"] == EPOCHS and document["cluster"]["nodes"] == 1
    assert any("simulated failure of a progress hook" in note for note in document["notes"]), document["notes"]
