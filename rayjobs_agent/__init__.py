"""The agent beside every job rayjobs runs: it runs the entrypoint, reads what the job writes, and decides what
happened to the run.

This package runs on the cluster, inside the job, and needs nothing but the standard library and the Ray the
cluster has. ``rayjobs submit`` ships it with every job (as a ``py_modules`` entry under its own name, so a
user's own working_dir needs no copy of it, and the same import name works here and there) and runs the
entrypoint under ``python -m rayjobs_agent.supervisor``. From there the agent:

- decides why an attempt failed (``causes.py``), runs it again in place when the spec's retry rule says so
  (``retries.py``), and names waits for resources and stalls (``judge.py``, ``watch.py``), each said once as
  an event and a ``rayjobs:`` line in the job's log;
- keeps the run record (``recorder.py``), sends the spec's notifications (``notify.py``), and gives a queued
  job's slot back the moment it ends (``queueing.py``; the queue service is ``queue/``);
- installs the Ray Train callback (``train_hooks/progress_callback.py``) on a Ray it is tested on
  (``train_hooks/install.py``), so that every ``ray.train.report`` of the user's script becomes a progress event
  without a line of the script changing. Whatever goes wrong in a hook turns it off with one line in the log (``guard.py``); it never fails
  or slows the training.

Events travel in the job's own log, as lines ``rayjobs-event {json}`` (``vocabulary.py``). The log is what rayjobs
already follows, resumes after a dropped connection and keeps; an event needs no second channel, arrives in order
with the output around it, and is still there when the log is read later. The client imports the rules it shares
with the job from here (``wire.py``, ``vocabulary.py``, ``record_layout.py``, ``masking.py``, ``causes.py``, …)
and never spells them again.
"""

from .events import emit
from .package import AGENT_PACKAGE_DIR
from .vocabulary import EVENT_MARKER, EventKind

__all__ = ["AGENT_PACKAGE_DIR", "EVENT_MARKER", "EventKind", "emit"]
