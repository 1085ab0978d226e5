"""A job's life, from the client: submit it (or attach to it), follow it to an end, retry it, settle a Ctrl-C.

What lives here is a run's life on this side: ``lifecycle.py`` (the run itself:
``run_with_retries``, ``follow_job``, ``RunOptions``, ``RunResult``), ``submit.py`` (submit, or attach to
the job the same spec already started), ``interrupts.py`` (what Ctrl-C does: detach or stop, and whether
a job was created), ``retry_policy.py`` (which jobs lost whole are submitted again, and when: a failed
entrypoint is retried in place by the agent), ``preflight.py`` (what is refused or warned about before
anything is sent), ``record_note.py`` (the line that says a job keeps no run record) and ``stall.py``
(what is done when a job stalls: its stacks).

Whether a run failed and why, whether it is retried, whether it waits or stalls: those are decided by the
agent beside the job (``rayjobs_agent``), and read here from its events. ``runner.follow`` keeps what reads a
job's log and shows it; ``runner/follow/watching.py`` wires the log's readers to the display, and this
package ties that wiring to a run.
"""
