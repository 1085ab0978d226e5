"""How recorded runs read: the ``runs`` table, ``show``, and ``compare`` (a table and a PNG of the curves)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jobs.secrets import SecretMask, job_mask, mask_url_userinfo, masked_runtime_env, masked_strings
from rayjobs_agent.record_layout import PIPELINE_FIELD
from rayjobs_agent.usage import ResourceUsage
from rayjobs_agent.vocabulary import EventKind, kind_of
from rayjobs_agent.wording import (cluster_text, format_duration, format_value, local_time, plain_table,
                                   totals_lines)
from runner.follow.progress import shown_metrics
from runner.records.model import name_problem
from runner.records.store import UNREADABLE, Folder

LOST = "LOST"
# A record is uploaded every `upload_every_s`; one that missed this many uploads has lost its writer.
_MISSED_UPLOADS = 3
_LOST_FLOOR_S = 120


def run_status(document: dict[str, Any], now: float | None = None) -> str:
    """The run's status as its record tells it; ``LOST`` for a RUNNING record that stopped being updated
    (its node or cluster went away without the job saying how it ended)."""
    status = document.get("status") or "?"
    if status != "RUNNING":
        return status
    attempts = document.get("attempts") or [{}]
    updated = attempts[-1].get("updated")
    every = float(document.get("upload_every_s") or 30)
    if updated is not None and (now or time.time()) - updated > max(_MISSED_UPLOADS * every, _LOST_FLOOR_S):
        return LOST
    return status


def run_duration_s(document: dict[str, Any], now: float | None = None) -> float | None:
    """From the first attempt's start to the last one's end (or its last upload, while it runs)."""
    started = document.get("started")
    attempts = document.get("attempts") or [{}]
    ended = document.get("ended") or attempts[-1].get("updated")
    if started is None or ended is None:
        return None
    return max(0.0, float(ended) - float(started))


def metrics_text(metrics: dict[str, Any] | None) -> str:
    """The few final metrics worth a glance: ``val_loss 0.31  val_accuracy 0.967``."""
    return "  ".join(f"{name} {format_value(value)}" for name, value in shown_metrics(metrics or {})) or "-"


def listed_run(folder: Folder, document: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """One run as ``rayjobs runs --output json`` lists it."""
    return {"run": folder.name, "location": folder.location, "status": run_status(document, now),
            "name": document.get("name"), "started": document.get("started"), "ended": document.get("ended"),
            "duration_s": run_duration_s(document, now), "attempts": len(document.get("attempts") or []),
            "iterations": document.get("iterations"), "metrics": document.get("metrics"),
            "error": document.get("error"), "pipeline": pipeline_of(document)}


def masked_record(document: dict[str, Any]) -> dict[str, Any]:
    """A run's record as printed: its spec's secrets masked and every URL's password, whatever wrote it.

    The job masks its record as it writes it; a record written before it did, or by hand, is masked here.
    """
    spec = document.get("spec")
    mask = SecretMask(())
    if isinstance(spec, dict):
        marked = list(spec.get("secret_env_vars") or [])
        # The spec's secret values, wherever else in the record they appear (a cause's evidence, a metric's name).
        mask = job_mask(spec, marked)
        document = {**document, "spec": masked_runtime_env(spec, marked)}
    return masked_strings(document, mask)


def masked_values(value: Any) -> Any:
    """Any part of a record or an event as printed: every URL's password in every string of it masked."""
    return masked_strings(value, SecretMask(()))


def masked_log(text: str) -> str:
    """A saved log as printed: URL passwords masked (the job masked its secrets' values as it saved it)."""
    return mask_url_userinfo(text)


def pipeline_of(document: dict[str, Any]) -> dict[str, Any] | None:
    """What a run's record says of the pipeline run it is a job of (``run``, ``job``, ``after``), as printed (a URL's
    password in a folder masked); None for a run of no pipeline, or a record that cannot be read."""
    if document.get("status") == UNREADABLE:
        return None
    link = document.get(PIPELINE_FIELD)
    if not isinstance(link, dict) or not all(isinstance(link.get(field), str) and name_problem(link[field]) is None
                                             for field in ("run", "job")):
        return None  # a link written by hand, or by other code: the run reads as one of no pipeline
    after = link.get("after") or {}
    if not isinstance(after, dict) or not all(
            isinstance(name, str) and name_problem(name) is None and isinstance(folder, str) and folder.isprintable()
            for name, folder in after.items()):
        return None
    return masked_values({**link, "after": after})


def pipeline_label(document: dict[str, Any]) -> str:
    """``RUN/JOB`` for a job of a pipeline run, ``-`` for any other run: the ``runs`` table's PIPELINE column."""
    link = pipeline_of(document)
    return f"{link['run']}/{link['job']}" if link else "-"


def runs_table(runs: list[tuple[Folder, dict[str, Any]]]) -> str:
    """``RUN STATUS STARTED DURATION ATTEMPTS METRICS``, one row per run, in the order given; with ``PIPELINE``
    (``RUN/JOB``) after ``RUN`` when any of them is a job of a pipeline."""
    now = time.time()
    in_pipelines = any(pipeline_of(document) for _, document in runs)
    rows = [("RUN", *(("PIPELINE",) if in_pipelines else ()), "STATUS", "STARTED", "DURATION", "ATTEMPTS", "METRICS")]
    for folder, document in runs:
        status = run_status(document, now)
        rows.append((folder.name, *((pipeline_label(document),) if in_pipelines else ()), status,
                     local_time(document.get("started")), format_duration(run_duration_s(document, now)),
                     str(len(document.get("attempts") or [])),
                     metrics_text(document.get("metrics")) if status != UNREADABLE else document.get("error", "")))
    return plain_table(rows)


# What a run that reported no cluster (only Ray Train runs do) shows for it.
NO_CLUSTER_REPORTED = "- (reported by Ray Train runs only)"


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number arithmetic can use: not a bool, not NaN or infinite, within a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def numbers_of(values: Any) -> dict[str, Any]:
    """The entries of a mapping that are finite numbers (none when it is no mapping): what totals are made of, so
    that a sample or a record written by hand that holds text, or infinity, where a number goes counts as absent."""
    if not isinstance(values, Mapping):
        return {}
    return {name: value for name, value in values.items() if finite_number(value)}


def counted_events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events resource totals count (samples and reports), each with only the numbers it holds."""
    counted = []
    for event in events:
        kind = kind_of(dict(event))
        if kind == EventKind.RESOURCES:
            counted.append({**numbers_of(event), "event": kind})
        elif kind == EventKind.REPORT:
            counted.append({"event": kind, "metrics": numbers_of(event.get("metrics"))})
    return counted


def run_resource_totals(document: dict[str, Any], prices: dict[str, float | None] | None = None) -> dict[str, Any]:
    """What the run used over all its attempts (:meth:`ResourceUsage.totals`), with its cost at ``prices``."""
    usage = ResourceUsage()
    for attempt in document.get("attempts") or []:
        if isinstance(attempt, dict):
            usage = usage.add(ResourceUsage.from_dict(numbers_of(attempt.get("resources"))))
    return usage.totals(prices)


def show_text(folder: Folder, document: dict[str, Any], prices: dict[str, float | None] | None = None) -> str:
    """What ``rayjobs show RUN`` prints: what ran, where, with which code, and how it went."""
    code = document.get("code") or {}
    git = code.get("git") if isinstance(code.get("git"), dict) else {}
    code_text = str(code.get("working_dir") or "-")
    if git:
        code_text += f" at commit {str(git.get('commit'))[:12]}"
        code_text += (f", with uncommitted changes (hash {git.get('changes_hash')})" if git.get("dirty")
                      else ", no uncommitted changes")
    elif code.get("working_dir"):
        code_text += " (not a git work tree)"
    if code.get("working_dir_package"):
        code_text += f"; package {code['working_dir_package']}"
    versions = ", ".join(f"{name} {version}" for name, version in (document.get("versions") or {}).items() if version)
    cluster = cluster_text(document.get("cluster")) or NO_CLUSTER_REPORTED
    progress = []
    if document.get("iterations") is not None:
        epochs = document.get("epochs")
        progress.append(f"{document['iterations']}" + (f" of {epochs}" if epochs else "") + " reports")
    progress.append(f"{document.get('restarts') or 0} training restarts")
    rows = [
        ("run", folder.location),
        ("name", f"{document.get('name') or '-'} (spec hash {document.get('spec_hash') or '-'})"),
        ("status", f"{run_status(document)} after {format_duration(run_duration_s(document))}"),
        ("started", local_time(document.get("started"))),
        ("ended", local_time(document.get("ended"))),
        ("entrypoint", (document.get("spec") or {}).get("entrypoint") or "-"),
        ("code", code_text),
        ("versions", versions or "-"),
        ("cluster", cluster),
        ("progress", ", ".join(progress)),
        ("metrics", metrics_text(document.get("metrics"))),
    ]
    link = pipeline_of(document)
    if link:
        runs_here = folder.location.rstrip("/").rpartition("/")[0] or folder.location
        rows.append(("pipeline", f"job {link['job']} of run {link['run']}, after "
                                 f"{', '.join(sorted(link.get('after') or {})) or 'no other job'} "
                                 f"(the graph: rayjobs runs {runs_here} --pipeline {link['run']})"))
    width = max(len(label) for label, _ in rows) + 1
    lines = [f"{label + ':':<{width}} {value}" for label, value in rows]
    lines.append("attempts:")
    for attempt in document.get("attempts") or []:
        exit_code = "" if attempt.get("exit_code") is None else f" exit {attempt['exit_code']}"
        lines.append(f"  {attempt.get('attempt', '?')}. {attempt.get('submission_id')}  {attempt.get('status')}"
                     f"{exit_code}  from {local_time(attempt.get('started'))}  on {attempt.get('host')}"
                     f"  log {attempt.get('log_bytes', 0)} bytes")
    used = totals_lines(run_resource_totals(document, prices))
    lines.append(f"resources:{' ' * (width - 10)} " + (used[0] if used else "- (not sampled: a record before 1.2, "
                                                                        "or sampling off)"))
    lines += [" " * (width + 1) + line for line in used[1:]]
    lines.append(f"log:{' ' * (width - 4)} rayjobs logs {folder.location}")
    return "\n".join(lines)


def compare_table(runs: list[tuple[Folder, dict[str, Any]]]) -> str:
    """Final metrics side by side: one row per metric any run reported, one column per run."""
    names: list[str] = []
    for _, document in runs:
        names += [name for name in (document.get("metrics") or {}) if name not in names]
    rows = [("", *(folder.name for folder, _ in runs)),
            ("status", *(run_status(document) for _, document in runs)),
            ("duration", *(format_duration(run_duration_s(document)) for _, document in runs)),
            ("reports", *(str(document.get("iterations") or "-") for _, document in runs))]
    for name in names:
        rows.append((name, *(format_value((document.get("metrics") or {}).get(name, "-")) for _, document in runs)))
    return plain_table(rows)


def compare_plot(curves: dict[str, list[dict[str, Any]]], path: Path, limit: int = 4) -> list[str]:
    """Overlay each run's metric curves (from its report events) in one PNG; returns the metrics drawn.

    ``curves`` maps a run's label to its report events in order. The metrics drawn are the ones most runs
    reported, losses and accuracies first, at most ``limit``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Only numbers draw a curve: a report written by hand may hold anything.
    curves = {label: [{**event, "metrics": numbers_of(event.get("metrics"))} for event in events]
              for label, events in curves.items()}
    counts: dict[str, int] = {}
    last_seen: dict[str, Any] = {}
    for events in curves.values():
        seen = {name for event in events for name in event["metrics"]}
        for name in seen:
            counts[name] = counts.get(name, 0) + 1
        for event in events:
            last_seen.update(event["metrics"])
    ranked = [name for name, _ in shown_metrics(last_seen, limit=len(last_seen))]
    metrics = sorted(ranked, key=lambda name: -counts.get(name, 0))[:limit]
    if not metrics:
        return []
    figure, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.6), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for label, events in curves.items():
            # A resumed run's reports count from 1 again; the epoch it reports (when it does) does not.
            points = [(_report_x(event, index), event["metrics"][metric])
                      for index, event in enumerate(events, start=1) if metric in event["metrics"]]
            if points:
                axis.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3, label=label)
        axis.set_title(metric)
        axis.set_xlabel("epoch (or report)")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return metrics


def _report_x(event: Mapping[str, Any], index: int) -> float:
    """Where a report sits on a curve: its epoch, else its iteration, else its place among the reports."""
    for value in (event["metrics"].get("epoch"), event.get("iteration")):
        if finite_number(value):
            return value
    return index
