"""A Ctrl-C during a submission is never lost, even when Python drops its KeyboardInterrupt.

Python drops an exception raised inside a callback it runs for itself: a Ctrl-C that lands in importlib's module-lock
callback, while Ray's SDK imports as it packages a working_dir, was printed as "Exception ignored" and the command
went on (and, in tests/test_submit_interrupt_cluster.py, waited for good on the pipe that holds the packaging). The
cluster test is the whole path; this one drops the first KeyboardInterrupt on purpose.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from runner.client.submission import _interrupts_noted, _JobRequestWatch

pytestmark = pytest.mark.processes  # waits out the product's real interval before the interrupt comes again


def test_a_ctrl_c_python_drops_comes_again_until_the_submission_ends_and_nothing_more_is_sent():
    watch, dropped = _JobRequestWatch(), []
    handler_before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _interrupts_noted(watch):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                dropped.append("as importlib's callback drops it")
            time.sleep(60)  # held, as packaging is at a named pipe: only the interrupt sent again ends this
    assert dropped and watch.interrupted
    with pytest.raises(KeyboardInterrupt):
        watch.refuse_if_interrupted()  # the job request is never sent after it
    assert signal.getsignal(signal.SIGINT) is handler_before


def test_a_submission_without_a_ctrl_c_leaves_the_handler_as_it_found_it_and_sends_on():
    watch = _JobRequestWatch()
    handler_before = signal.getsignal(signal.SIGINT)
    with _interrupts_noted(watch):
        assert signal.getsignal(signal.SIGINT) is not handler_before
    assert signal.getsignal(signal.SIGINT) is handler_before and not watch.interrupted
    watch.refuse_if_interrupted()
