"""A Ctrl-C during a submission is never lost, even when Python drops its KeyboardInterrupt.

Python drops an exception raised inside a callback it runs for itself: a Ctrl-C that landed in importlib's
module-lock callback, while Ray's SDK imported as it packaged a working_dir, was printed as "Exception ignored" and
the submission went on. tests/test_submit_interrupt_cluster.py is the whole path; these drop the KeyboardInterrupt on
purpose.
"""

from __future__ import annotations

import os
import signal
import time
import types

import _frozen_importlib
import pytest

from runner.client import submission
from runner.client.submission import SubmitInterrupted, _interrupts_noted, _JobRequestWatch


@pytest.fixture(autouse=True)
def _pythons_own_ctrl_c_handler() -> None:
    """Each test starts under Python's own handler, as a fresh `rayjobs` process does, whatever an earlier test in
    this test process installed (Ray Train's ``fit()`` installs one in the driver)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ctrl_c_dropped() -> None:
    """A Ctrl-C whose KeyboardInterrupt a callback swallows, as importlib's module-lock callback does."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # Python runs the handler between two of these steps
            pass
    except KeyboardInterrupt:
        return
    pytest.fail("the Ctrl-C raised no KeyboardInterrupt")


def test_a_ctrl_c_python_drops_is_noted_and_no_request_goes_out_after_it():
    watch = _JobRequestWatch()
    with _interrupts_noted(watch):
        _ctrl_c_dropped()
        with pytest.raises(KeyboardInterrupt):
            watch.refuse_if_interrupted()  # before the upload, and before the job request
    assert watch.interrupted and not watch.sent
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _importlib_lock_callback_frame() -> types.SimpleNamespace:
    """A frame of importlib's module-lock callback, as the garbage collector runs it in the middle of an import."""
    lock = _frozen_importlib._get_module_lock("rayjobs_test_interrupt_module")
    callback = _frozen_importlib._module_locks["rayjobs_test_interrupt_module"].__callback__
    del lock
    return types.SimpleNamespace(f_code=callback.__code__)


def test_a_ctrl_c_landing_where_python_would_drop_it_comes_again_a_moment_later_where_it_is_raised():
    watch, frame, came_again = _JobRequestWatch(), _importlib_lock_callback_frame(), []
    assert submission._drops_exceptions(frame)
    with _interrupts_noted(watch):
        signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)  # returns: raised there, it would be lost
        assert watch.interrupted
        try:
            time.sleep(10)  # held, as packaging is at a named pipe: only the interrupt that comes again ends this
        except KeyboardInterrupt:
            came_again.append(True)
    assert came_again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_dropped_after_the_job_request_ends_the_submission_as_interrupted_with_its_job(monkeypatch):
    def submitted_then_dropped(connection, request, warn, progress, watch, deliver):
        watch.sent = True  # the job request went out, and its answer came back
        _ctrl_c_dropped()
        return request["submission_id"]

    monkeypatch.setattr(submission, "_submit", submitted_then_dropped)
    with pytest.raises(SubmitInterrupted) as interrupted:
        submission.submit_job(object(), {"entrypoint": "true", "submission_id": "kept-1"})
    assert (interrupted.value.submission_id, interrupted.value.answered) == ("kept-1", True)


def test_a_program_with_its_own_ctrl_c_handler_keeps_it():
    def own(signum, frame):
        pass

    before = signal.signal(signal.SIGINT, own)
    try:
        with _interrupts_noted(_JobRequestWatch()):
            assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_submission_without_a_ctrl_c_gives_python_its_handler_back_and_sends_on():
    watch = _JobRequestWatch()
    with _interrupts_noted(watch):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not watch.interrupted
    watch.refuse_if_interrupted()
