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
                     "(default: every queue), or `set NAME` with --max-running N, a quota (--max-cpus, --max-gpus, --max) "
                     "or --no-limit.",
                     show_default=False)] = None,
    max_running: Annotated[Optional[int], typer.Option("--max-running", min=1, metavar="N", help="With set: how "
                           "many of the queue's jobs run at once.", show_default=False)] = None,
    max_cpus: Annotated[Optional[float], typer.Option("--max-cpus", metavar="N", help="With set: the most CPUs "
                        "the queue's running jobs hold together (an `auto` layout counts the CPUs it is given).",
                        show_default=False)] = None,
    max_gpus: Annotated[Optional[float], typer.Option("--max-gpus", metavar="N", help="With set: the most GPUs "
                        "the queue's running jobs hold together.", show_default=False)] = None,
    max_resource: Annotated[Optional[list[str]], typer.Option("--max", metavar="RESOURCE=N", help="With set: the "
                            "most of any resource (memory, a custom one) the queue's running jobs hold together; "
                            "repeat for several.", show_default=False)] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="With set: remove every limit and quota (its jobs then "
                        "wait only for the cluster to have free what they need).")] = False,
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
    quota = _quota(max_cpus, max_gpus, max_resource or [])
    limited = max_running is not None or bool(quota)
    if (setting and (len(words) != 2 or limited == no_limit)) \
            or (not setting and (len(words) > 1 or limited or no_limit or max_resource)):
        raise BadInput("usage: rayjobs queue [NAME]; to change a limit: rayjobs queue set NAME --max-running N, "
                       "--max-cpus N, --max-gpus N, --max RESOURCE=N (or --no-limit)")
    try:
        name = checked_queue_name(names[0]) if names else None
    except QueueNameError as exc:
        raise BadInput(str(exc)) from None
    cluster_queue = ClusterQueue(jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S))
    if setting:
        queues = cluster_queue.set_limit(str(name), None if no_limit else max_running, None if no_limit else quota)
    else:
        queues = cluster_queue.describe(name)
        if name is not None and not queues:
            queues = [{"queue": name, "max_running": None, "running": [], "waiting": []}]
    typer.echo(json.dumps(queues, indent=2) if output == "json" else queues_text(queues))


def _quota(cpus: float | None, gpus: float | None, others: list[str]) -> dict[str, float]:
    """The quota the options give (resource name -> most), checked by the rule the cluster applies."""
    from rayjobs_agent.queueing import quota_problem

    quota: dict[str, float] = {}
    for text in others:
        name, equals, amount = text.partition("=")
        if not equals:
            raise BadInput(f"--max {text!r}: write RESOURCE=N, e.g. --max memory=64e9")
        try:
            quota[name.strip()] = float(amount)
        except ValueError:
            raise BadInput(f"--max {text!r}: {amount!r} is not a number") from None
    quota.update({name: value for name, value in (("CPU", cpus), ("GPU", gpus)) if value is not None})
    if (problem := quota_problem(quota)) is not None:
        raise BadInput(problem)
    return quota


def queues_text(queues: list[dict[str, Any]]) -> str:
    """The queues as a person reads them: one line per queue, then one per job running or waiting."""
    if not queues:
        return "no queues on this cluster (a spec joins one with `queue: NAME`)"
    lines = []
    for queue in queues:
        limit = queue.get("max_running")
        running, waiting = queue.get("running") or [], queue.get("waiting") or []
        held = queue.get("used") or {}
        quota = "".join(f"; {held.get(name, 0):g} of {most:g} {name} held"
                        for name, most in sorted((queue.get("quota") or {}).items()))
        lines.append(f"queue {queue['queue']}: {len(running)} of {limit if limit is not None else 'unlimited'} "
                     f"running, {len(waiting)} waiting{quota}")
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
