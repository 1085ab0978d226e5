"""What is done when a followed job that runs but says nothing is stalled.

The agent's judge decides that a job stalled (``rayjobs_agent.watch``): beside the job, said as a ``stall`` event;
for a job submitted without the agent, run by the follower on the log it streams (``runner.follow.watching``). The answer: one warning per hang, one line per process saying where it is in its own code, and the
whole stacks kept in the run record. A stalled job is always left running: it may be slow, not stuck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.secrets import job_mask
from runner.follow.stacks import job_stacks
from runner.reporter import Reporter

if TYPE_CHECKING:
    from runner.client.jobs_api import JobsApi
    from runner.follow.watching import FollowedJob



class StallRule:
    """What is done when a followed job stalls: ``on_stall``, once per stall its watch judged.

    Args:
        client: the cluster client (for the stacks of a stalled job).
        job_id: the job followed.
        watch: what its log feeds (its progress, the judge of its waits and stalls, rayjobs' own lines).
    """

    def __init__(self, client: JobsApi, job_id: str, watch: FollowedJob) -> None:
        self.client = client
        self.job_id = job_id
        self.watch = watch

    def on_stall(self, silent_s: float, info: dict[str, Any]) -> None:
        """Say once per hang that the job stalled, with one line per process: where it is in its own code.

        The whole stacks go to the run record (and ``rayjobs stack`` shows them); a job that waits for
        resources is not stalled, and is said to wait instead.
        """
        waiting = self.watch.waiting_text()
        if waiting is not None:
            self._say(f"warning: job {self.job_id} is RUNNING but has made no progress for {silent_s:.0f}s: "
                      f"{waiting}; it is left running")
            return
        self._say(f"warning: job {self.job_id} is RUNNING but has printed nothing of its own and reported "
                  f"no progress for {silent_s:.0f}s (stall_after_s {self.watch.stall_limit_s():g}); it is left running. "
                  f"Where each process is (the whole stacks: `rayjobs stack {self.job_id}`):")
        stacks = job_stacks(self.client, info, self.watch.progress)
        # py-spy names each process by its command line, which holds the entrypoint's arguments.
        mask = job_mask(info)
        for stack in stacks:
            self._say(mask.mask_text(f"  {stack.where()}"))
        if not stacks:
            self._say("  no process of the job to read yet: its driver has not connected to Ray")
            return
        self._keep_in_record(info, "\n".join(mask.mask_text(stack.render()) for stack in stacks))

    def _keep_in_record(self, info: dict[str, Any], text: str) -> None:
        """The stacks go into the job's run record too, where they outlive this terminal."""
        from runner.errors import RayJobsError
        from runner.records.store import save_stacks

        try:
            where = save_stacks(info, text, cluster_is_local=self.client.connection.local_cluster is not None)
        except (RayJobsError, OSError) as exc:
            self._say(f"the stacks could not be kept in the run record: {exc}")
            return
        if where is not None:
            self._say(f"stacks kept in the run record: {where}")

    def _say(self, text: str) -> None:
        Reporter(self.watch.notes).say(text)
