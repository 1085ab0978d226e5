"""A pipeline run as its jobs' records tell it: each job, the jobs it ran after, its status and its run's folder.

A job of a pipeline keeps an ordinary run record, with ``pipeline`` naming the run, the job's name in it, and the run
folder of each job it ran after (``runner/run/pipeline.py`` writes it into the job's record settings). So the graph
is drawn from the records alone, whether the cluster is still there or not: ``rayjobs runs LOCATION --pipeline RUN``
prints it, and the history page draws it. A job named as run after but with no record in the location (it kept its
record elsewhere, or none) is still a node, ``UNRECORDED``, with the folder the job after it was told.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs.pipeline import topological_layers
from rayjobs_agent.record_layout import PIPELINE_FIELD
from rayjobs_agent.wording import plain_table
from runner.errors import BadInput, JobNotFound
from runner.records.model import name_problem
from runner.records.report import pipeline_of, run_status
from runner.records.store import Folder

# The status of a job ran after that has no record in the location read.
UNRECORDED = "UNRECORDED"


def pipeline_graph(runs: Iterable[tuple[Folder, dict[str, Any]]], run_id: str) -> dict[str, Any]:
    """Pipeline run ``run_id`` from the records of ``runs``: its jobs in layers (each layer runs after the ones
    before it), each with what it ran after, its status, and its run's folder.

    ``{"pipeline": RUN, "layers": [[NAME, ...], ...], "jobs": [{"job", "after", "status", "run", "location",
    "layer"}, ...], "problem": why the layers are not the graph's (None)}``; ``run`` is the folder's name (the page's
    run), None for a job with no record here. When a job has more than one record of the run (copied folders), the one
    that started last is its record.

    Raises:
        BadInput: ``run_id`` is no run id's name (a path, a control character) (exit code 2; a 400 to a browser).
        JobNotFound: no record in ``runs`` is a job of ``run_id`` (exit code 6; a 404 to a browser).
    """
    if (problem := name_problem(run_id)) is not None:
        raise BadInput(f"{run_id!r} is no pipeline run's id: {problem}")
    recorded: dict[str, tuple[Folder, dict[str, Any]]] = {}
    for folder, document in runs:
        link = pipeline_of(document)
        if link is None or link["run"] != run_id:
            continue
        known = recorded.get(link["job"])
        if known is None or (document.get("started") or 0) > (known[1].get("started") or 0):
            recorded[link["job"]] = (folder, document)
    if not recorded:
        raise JobNotFound(f"no record of pipeline run {run_id!r} here: its jobs' records name it in "
                          f"{PIPELINE_FIELD}.run (list them with `rayjobs runs LOCATION`)")
    after = {name: sorted((pipeline_of(document) or {}).get("after") or {}) for name, (_, document) in recorded.items()}
    told = {other: folder for _, document in recorded.values()
            for other, folder in ((pipeline_of(document) or {}).get("after") or {}).items()}
    for other in told:
        after.setdefault(other, [])  # a job ran after with no record here: a node all the same
    problem = None
    try:
        layers = topological_layers(after)
    except ValueError as exc:  # records written by hand, or copied from two runs: shown, not refused
        layers, problem = [sorted(after)], f"the records do not make a graph ({exc})"
    jobs = []
    for number, layer in enumerate(layers, start=1):
        for name in layer:
            folder, document = recorded.get(name, (None, None))
            jobs.append({"job": name, "after": after[name], "layer": number,
                         "status": run_status(document) if document is not None else UNRECORDED,
                         "run": folder.name if folder is not None else None,
                         "location": folder.location if folder is not None else told.get(name)})
    return {"pipeline": run_id, "layers": layers, "jobs": jobs, "problem": problem}


def graph_text(graph: dict[str, Any]) -> str:
    """What ``rayjobs runs LOCATION --pipeline RUN`` prints: a line for the run, then its jobs layer by layer, each
    with what it ran after, its status and its run's folder."""
    counts: dict[str, int] = {}
    for job in graph["jobs"]:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    said = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    lines = [f"pipeline run {graph['pipeline']}: {len(graph['jobs'])} jobs in {len(graph['layers'])} layers ({said})"]
    if graph["problem"]:
        lines.append(f"warning: {graph['problem']}")
    rows = [("LAYER", "JOB", "AFTER", "STATUS", "RUN")]
    rows += [(str(job["layer"]), job["job"], ", ".join(job["after"]) or "-", job["status"], job["location"] or "-")
             for job in graph["jobs"]]
    return "\n".join(lines) + "\n" + plain_table(rows)


__all__ = ["UNRECORDED", "graph_text", "pipeline_graph"]
