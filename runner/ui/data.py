"""What the pages show, from the records: the runs' table, one run whole, and runs side by side.

Everything here is read with ``runner.records`` (the same reading ``rayjobs runs``, ``show`` and ``compare`` do)
and masked as they print it; the pages only lay it out.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rayjobs_agent.record_layout import RUN_FILE, SCHEMA_VERSION_FIELD
from rayjobs_agent.usage import prices_from, resource_totals
from rayjobs_agent.vocabulary import EventKind, kind_of
from rayjobs_agent.wording import cluster_text, format_bytes, format_duration, format_value, local_time
from runner.errors import BadInput, JobNotFound
from runner.follow.progress import shown_metrics
from runner.records.model import name_problem
from runner.records.pipeline import pipeline_graph
from runner.records.report import (LOST, NO_CLUSTER_REPORTED, counted_events, listed_run, masked_record, masked_values,
                                   run_status)
from runner.records.store import UNREADABLE, Folder, attempt_events, list_runs, read_run
from runner.ui.log_pages import log_parts, page_count, search_log

# The statuses after which a record no longer changes: a page showing one stops asking for it again.
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED", LOST, UNREADABLE})
# The resource sampler's event kind; records written before it existed have none, and show no plot.
RESOURCES = EventKind.RESOURCES
_RESOURCE_FIELDS = ("time", "cpu", "cpus", "rss_bytes", "processes", "nodes", "gpus", "gpu_util", "gpu_mem_bytes",
                    "gpu_mem_total_bytes")
# A sweep's trials are drawn from their `running` events; a long sweep keeps this many points per trial.
_TRIAL_POINTS = 500


class Records:
    """The run records under one location, by the name the pages use for each: its folder's name.

    ``location`` may also be a single run's folder; it is then the one run listed.
    """

    def __init__(self, location: Folder) -> None:
        self.location = location

    def runs(self) -> list[tuple[Folder, dict[str, Any]]]:
        """Every run, newest first (an unreadable one with its reason)."""
        found = list_runs(self.location)
        if not found:
            try:
                found = [(self.location, read_run(self.location))]
            except JobNotFound:
                return []
            except BadInput as exc:
                found = [(self.location, {"status": UNREADABLE, "error": str(exc)})]
        return found

    def folder(self, name: str) -> Folder:
        """The folder of the run called ``name``.

        Raises:
            BadInput: ``name`` is no folder's name (``..``, a ``/`` or ``\\``, a NUL): it could lead out of the
                location (exit code 2; a 400 to a browser).
            JobNotFound: no run of that name here (exit code 6; a 404 to a browser).
        """
        if (problem := name_problem(name)) is not None:
            raise BadInput(f"{name!r} is no run's name: {problem}")
        if name == self.location.name and self.location.read(RUN_FILE) is not None:
            return self.location
        child = self.location.inside(name)  # a run folder that is a link out of the records is refused
        if child.read(RUN_FILE) is not None:
            return child
        raise JobNotFound(f"no run {name!r} in {self.location.location}")


def runs_table(records: Records, now: float | None = None) -> dict[str, Any]:
    """The runs page's data: one row per run, and whether any of them is still running."""
    now = now or time.time()
    rows = [run_row(folder, document, now) for folder, document in records.runs()]
    return {"location": records.location.location, "runs": rows,
            "live": any(row["status"] not in TERMINAL for row in rows)}


def run_row(folder: Folder, document: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """One run as its row shows it: ``rayjobs runs --output json``'s fields and what the page adds."""
    listed = listed_run(folder, document, now)
    if listed["status"] == UNREADABLE:
        return {**listed, "cause": None, "key_metric": None, "queue": None, "host": None, "cluster": None,
                "duration": "-", "metrics_text": listed.get("error") or "", "metric_texts": {},
                "started_text": local_time(listed.get("started"), zone=True), "where": "-"}
    document = masked_record(document)
    attempts = document.get("attempts") or []
    cause = document.get("cause") if listed["status"] != "SUCCEEDED" else None
    metrics = document.get("metrics") or {}
    key = shown_metrics(metrics, limit=1)
    host = attempts[-1].get("host") if attempts else None
    return {**listed, "metrics": metrics,
            "metric_texts": {name: format_value(value) for name, value in metrics.items()
                             if not isinstance(value, (dict, list))},
            "started_text": local_time(listed.get("started"), zone=True),
            "where": "; ".join(part for part in (str(host or ""), cluster_text(document.get("cluster"))) if part) or "-",
            "cause": _cause(cause) if isinstance(cause, dict) else None,
            "key_metric": {"name": key[0][0], "value": key[0][1], "text": format_value(key[0][1])} if key else None,
            "metrics_text": "  ".join(f"{name} {format_value(value)}" for name, value in shown_metrics(metrics)),
            "queue": ((document.get("spec") or {}).get("queue")),
            "host": (attempts[-1].get("host") if attempts else None),
            "cluster": document.get("cluster"),
            "duration": format_duration(listed["duration_s"]),
            "schema_version": document.get(SCHEMA_VERSION_FIELD, "1.0")}


def _cause(cause: dict[str, Any]) -> dict[str, Any]:
    return {name: cause.get(name) for name in ("cause", "text", "advice", "evidence", "retryable")}


def run_detail(records: Records, name: str, now: float | None = None) -> dict[str, Any]:
    """A run's page: its row, attempts with their causes, curves, trials, resources, spec, provenance and how it
    differs from the previous run of the same name.

    Raises:
        JobNotFound: no run of that name (exit code 6).
        BadInput: its record cannot be read (a newer major schema, not JSON).
    """
    folder = records.folder(name)
    document = read_run(folder)
    shown = masked_record(document)
    row = run_row(folder, document, now)
    attempts, reports, trials, resources, decisions, logs, counted = [], [], {}, [], [], [], []
    for attempt in shown.get("attempts") or []:
        cause = attempt.get("cause")
        attempts.append({**{key: attempt.get(key) for key in ("attempt", "submission_id", "status", "exit_code",
                                                              "started", "ended", "updated", "host", "log_bytes")},
                         "duration": format_duration(_span(attempt)),
                         "started_text": local_time(attempt.get("started"), zone=True),
                         "cause": _cause(cause) if isinstance(cause, dict) else None})
    # Attempts retried in place share their Ray job, and so one log and one stream of events.
    for submission in submissions(shown):
        for event in attempt_events(folder, submission):
            kind = kind_of(event)
            if kind in (EventKind.REPORT, RESOURCES):
                counted.append(event)
            if kind == EventKind.REPORT:
                reports.append({"submission_id": submission, "time": event.get("time"),
                                "iteration": event.get("iteration"), "metrics": _metrics(event)})
            elif kind == EventKind.TRIAL:
                _add_trial(trials, masked_values(event))
            elif kind == RESOURCES:
                resources.append({field: event[field] for field in _RESOURCE_FIELDS if field in event})
            elif kind in (EventKind.RETRY, EventKind.WAIT, EventKind.STALL, EventKind.QUEUE):
                decisions.append({"submission_id": submission, **masked_values(event)})
        parts = log_parts(folder, submission)
        logs.append({"submission_id": submission, "pages": page_count(parts),
                     "bytes": sum(part.size for part in parts),
                     "bytes_text": format_bytes(sum(part.size for part in parts)),
                     "attempts": [a["attempt"] for a in attempts if a["submission_id"] == submission]})
    totals = _totals(counted) if resources else None
    return {**row, "live": row["status"] not in TERMINAL, "attempts": attempts, "reports": reports,
            "trials": list(trials.values()), "resources": resources,
            "resource_totals": totals, "resource_facts": _totals_facts(totals) if totals else None,
            "ended_text": local_time(shown.get("ended"), zone=True),
            "cluster_text": cluster_text(shown.get("cluster")) or NO_CLUSTER_REPORTED,
            "decisions": decisions, "logs": logs, "spec": shown.get("spec"), "spec_hash": shown.get("spec_hash"),
            "provenance": _provenance(shown), "notes": shown.get("notes") or [],
            "record_health": shown.get("record_health"), "rerun_of": shown.get("rerun_of"),
            "reruns": shown.get("reruns") or [], "previous": _previous(records, folder, shown)}


def pipeline_detail(records: Records, run_id: str) -> dict[str, Any]:
    """A pipeline run's page: its graph as its jobs' records here draw it (:func:`pipeline_graph`), each job's
    ``run`` the name its own page has, and whether any of them still runs.

    Raises:
        BadInput: ``run_id`` is no run id's name (a 400 to a browser).
        JobNotFound: no record here is a job of that run (a 404 to a browser).
    """
    graph = pipeline_graph(records.runs(), run_id)
    return {**graph, "location": records.location.location,
            "live": any(job["status"] not in TERMINAL and job["run"] is not None for job in graph["jobs"])}


def pipeline_runs(rows: list[dict[str, Any]]) -> list[str]:
    """The pipeline runs the runs table's rows are jobs of, each once, in the rows' order."""
    return list(dict.fromkeys(row["pipeline"]["run"] for row in rows if row.get("pipeline")))


def submissions(document: dict[str, Any]) -> list[str]:
    """The Ray jobs a run's attempts ran in, oldest first, each once: each has a log and events of its own."""
    seen: list[str] = []
    for attempt in document.get("attempts") or []:
        submission = str(attempt.get("submission_id"))
        if submission not in seen:
            seen.append(submission)
    return seen


def _metrics(event: dict[str, Any]) -> dict[str, Any]:
    """A report's metrics as the page draws them: a mapping (a report written by hand may hold anything)."""
    metrics = event.get("metrics")
    return masked_values(metrics) if isinstance(metrics, dict) else {}


def _span(attempt: dict[str, Any]) -> float | None:
    start, end = attempt.get("started"), attempt.get("ended") or attempt.get("updated")
    return None if start is None or end is None else max(0.0, float(end) - float(start))


def _add_trial(trials: dict[str, dict[str, Any]], event: dict[str, Any]) -> None:
    name = str(event.get("trial"))
    trial = trials.setdefault(name, {"trial": name, "state": None, "values": {}, "value_texts": {}, "epoch": None,
                                     "metric": None, "metric_text": "-", "points": []})
    state = event.get("state")
    trial["state"] = state
    if state == "started":
        trial["values"] = event.get("values") if isinstance(event.get("values"), dict) else {}
        trial["value_texts"] = {key: format_value(value) for key, value in trial["values"].items()}
    if event.get("epoch") is not None:
        trial["epoch"] = event["epoch"]
    if isinstance(event.get("metric"), (int, float)):
        trial["metric"] = event["metric"]
        trial["metric_text"] = format_value(event["metric"])
        if len(trial["points"]) < _TRIAL_POINTS:
            trial["points"].append([event.get("epoch"), event["metric"]])


def _totals(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The sampler's own totals of the run's samples (and its reports' data waits), priced as ``rayjobs show``
    prices them."""
    try:
        prices = prices_from(os.environ)
    except ValueError:  # a price that is no number: `rayjobs show` says so; the page shows the totals unpriced
        prices = None
    return resource_totals(counted_events(events), prices)


def _totals_facts(totals: dict[str, Any]) -> list[list[str]]:
    """The page's lines for a run's resource totals, worded here (label, text; those with nothing to say left out)."""
    def value(name: str, suffix: str = "") -> str | None:
        return None if totals.get(name) is None else format_value(totals[name]) + suffix

    share = totals.get("data_wait_share")
    facts = [("samples", str(totals.get("samples", 0))), ("CPU hours", value("cpu_hours")),
             ("GPU hours", value("gpu_hours") if totals.get("gpu_hours") else None),
             ("peak memory", format_bytes(totals.get("peak_rss_bytes"))), ("mean CPU cores", value("mean_cpu")),
             ("mean GPU utilisation", value("mean_gpu_util", " %")),
             ("waiting for data", None if share is None else f"{round(share * 100)} %"), ("cost", value("cost"))]
    return [[label, text] for label, text in facts if text is not None]


def _provenance(document: dict[str, Any]) -> dict[str, Any]:
    return {"code": document.get("code") or {}, "versions": document.get("versions") or {},
            "cluster": document.get("cluster"), "spec_hash": document.get("spec_hash"),
            SCHEMA_VERSION_FIELD: document.get(SCHEMA_VERSION_FIELD, "1.0")}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def _previous(records: Records, folder: Folder, document: dict[str, Any]) -> dict[str, Any] | None:
    """The latest run of the same name that started before this one, and each field of spec and provenance
    that differs between them."""
    name, started = document.get("name"), document.get("started")
    if name is None or started is None:
        return None
    earlier = [(other, other_document) for other, other_document in records.runs()
               if other != folder and other_document.get("name") == name
               and (other_document.get("started") or 0) < started]
    if not earlier:
        return None
    other, other_document = max(earlier, key=lambda run: run[1].get("started") or 0)
    other_document = masked_record(other_document)

    def compared(record: dict[str, Any]) -> dict[str, Any]:
        return _flat({"spec": record.get("spec") or {}, "code": record.get("code") or {},
                      "versions": record.get("versions") or {}, "cluster": record.get("cluster") or {}})

    before, after = compared(other_document), compared(document)
    differences = [{"field": key, "before": before.get(key), "after": after.get(key)}
                   for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    return {"run": other.name, "status": run_status(other_document), "started": other_document.get("started"),
            "differences": differences}


def compare_data(records: Records, names: list[str], now: float | None = None) -> dict[str, Any]:
    """Runs side by side: each run's row and its report curves.

    Raises:
        BadInput: fewer than two runs named (exit code 2).
    """
    if len(names) < 2:
        raise BadInput("compare needs at least two runs")
    runs = []
    for name in names:
        folder = records.folder(name)
        document = read_run(folder)
        reports = [{"submission_id": submission, "iteration": event.get("iteration"),
                    "metrics": _metrics(event)}
                   for submission in submissions(document)
                   for event in attempt_events(folder, submission) if kind_of(event) == EventKind.REPORT]
        runs.append({**run_row(folder, document, now), "reports": reports})
    return {"runs": runs, "live": any(run["status"] not in TERMINAL for run in runs)}


def search_runs(records: Records, query: str, per_run: int = 20, limit: int = 200) -> dict[str, Any]:
    """The lines of every run's saved logs that hold ``query``, masked, at most ``per_run`` a run; a run whose log
    cannot be read is named in ``skipped`` with why, and the others are searched."""
    found: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for folder, document in records.runs():
        for submission in submissions(document):
            if len(found) >= limit:
                break
            try:
                matches = search_log(folder, submission, query, limit=per_run)
            except BadInput as exc:
                skipped.append({"run": folder.name, "submission_id": submission, "error": str(exc)})
                continue
            found += [{"run": folder.name, "submission_id": submission, **match} for match in matches]
    return {"query": query, "matches": found[:limit], "complete": len(found) < limit, "skipped": skipped}
