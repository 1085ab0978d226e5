"""A job's life, from the client: submit it (or attach to it), follow it to an end, retry it, settle a Ctrl-C.

What lives here is policy, the decisions rayjobs makes about a run: ``policy.py`` (the run itself:
``run_with_retries``, ``follow_job``, ``RunOptions``, ``RunResult``), ``submit.py`` (submit, or attach to
the job the same spec already started), ``interrupts.py`` (what Ctrl-C does: detach or stop, and whether
a job was created), ``retry_policy.py`` (which failures are submitted again, and when), ``preflight.py``
(what is refused or warned about before anything is sent), ``record_note.py`` (the line that says a job
keeps no run record) and ``stall.py`` (when a silent job is called stalled, and what is done about it).

``runner.follow`` keeps what reads a job's log and shows it. ``runner/follow/waits.py`` stays there: it
reads Ray's own lines (and the cluster's status report) to name what a job waits for, and decides
nothing. ``runner/follow/watching.py`` stays there too: it wires the log's readers to the display, and
this package ties that wiring to a run.
"""
