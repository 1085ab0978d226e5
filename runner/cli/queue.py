"""``rayjobs queue``: a cluster's queues, and their limits (``rayjobs queue set NAME --max-running N``).

Reading shows what the queue's keeper last published (one request); a limit is set through a helper job
on the cluster (a few seconds): see ``runner/client/queue.py``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from runner.cli.options import (ConnectionOptions, OutputOption, check_output, handles_errors,
                                with_connection_options)
from runner.errors import BadInput


@handles_errors
@with_connection_options
def queue(
    words: Annotated[Optional[list[str]], typer.Argument(metavar="[NAME] | set NAME", help="A queue to list "
                     "(default: every queue), or `set NAME` with --max-running N or --no-limit.",
                     show_default=False)] = None,
    max_running: Annotated[Optional[int], typer.Option("--max-running", min=1, metavar="N", help="With set: how "
                           "many of the queue's jobs run at once.", show_default=False)] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="With set: remove the limit (its jobs then wait "
                        "only for the cluster to have free what they need).")] = False,
    connection: ConnectionOptions = ConnectionOptions(),
    output: OutputOption = "text",
) -> None:
    """List the cluster's queues (running jobs, then waiting ones in the order they go), or set a queue's limit.

    `rayjobs queue`, `rayjobs queue team-a`, `rayjobs queue set team-a --max-running 2`. Limits live on the
    cluster, so every spec of a queue finds the same one.
    """
    from rayjobs_agent.queueing import QueueNameError, checked_queue_name
    from runner.client import jobs_api
    from runner.client.queue import ClusterQueue

    check_output(output)
    words = list(words or [])
    setting = words[:1] == ["set"]
    names = words[1:] if setting else words
    if (setting and (len(words) != 2 or (max_running is None) == (not no_limit))) \
            or (not setting and (len(words) > 1 or max_running is not None or no_limit)):
        raise BadInput("usage: rayjobs queue [NAME]; to change a limit: rayjobs queue set NAME --max-running N "
                       "(or --no-limit)")
    try:
        name = checked_queue_name(names[0]) if names else None
    except QueueNameError as exc:
        raise BadInput(str(exc)) from None
    cluster_queue = ClusterQueue(jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S))
    if setting:
        queues = cluster_queue.set_limit(str(name), None if no_limit else max_running)
    else:
        queues = cluster_queue.describe(name)
        if name is not None and not queues:
            queues = [{"queue": name, "max_running": None, "running": [], "waiting": []}]
    typer.echo(json.dumps(queues, indent=2) if output == "json" else queues_text(queues))


def queues_text(queues: list[dict[str, Any]]) -> str:
    """The queues as a person reads them: one line per queue, then one per job running or waiting."""
    if not queues:
        return "no queues on this cluster (a spec joins one with `queue: NAME`)"
    lines = []
    for queue in queues:
        limit = queue.get("max_running")
        running, waiting = queue.get("running") or [], queue.get("waiting") or []
        lines.append(f"queue {queue['queue']}: {len(running)} of {limit if limit is not None else 'unlimited'} "
                     f"running, {len(waiting)} waiting")
        lines += [f"  running  {job['id']}  needs {_needs(job.get('needs'))}" for job in running]
        lines += [f"  waiting  {job['position']}. {job['id']}  priority {job.get('priority', 0)}  "
                  f"needs {_needs(job.get('needs'))}" + (f"  ({job['reason']})" if job.get("reason") else "")
                  for job in waiting]
    return "\n".join(lines)


def _needs(needs: dict[str, float] | None) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in sorted((needs or {}).items())) or "nothing declared"


def register(app: typer.Typer) -> None:
    """Add ``rayjobs queue`` to the ``rayjobs`` command."""
    app.command("queue")(queue)
