"""What a running job tells ``rayjobs`` about its progress: one event per line of its log.

This package runs on the cluster, inside the job, and needs nothing but the standard library and
Ray. ``rayjobs submit`` ships it with every job that uploads code (as a ``py_modules`` entry, so a
user's own working_dir needs no copy of it), and :class:`train_callback.ProgressCallback` is named in
the entrypoint's ``RAY_TRAIN_CALLBACKS``: by the run record's keeper (``record.py``), after checking
that the cluster's Ray is one the callback is tested on (``train_setup.py``), or by the client for a
job that keeps no record. Ray Train then builds the callback inside any ``TorchTrainer`` the job
creates, and every ``ray.train.report`` of the user's script becomes a progress event without a
line of the script changing. Whatever goes wrong in it turns it off with one line in the log
(``guard.py``); it never fails or slows the training.

Events travel in the job's own log, as lines ``rayjobs-event {json}``. The log is what rayjobs
already follows, resumes after a dropped connection and keeps; an event needs no second channel,
arrives in order with the output around it, and is still there when the log is read later. The
Ray Train controller's lines reach the driver's log through Ray's log forwarding, prefixed with
``(TrainController pid=…)``, which readers skip.
"""

from .events import EVENT_MARKER, emit
from .vocabulary import EventKind

__all__ = ["EVENT_MARKER", "EventKind", "emit"]
