"""The CLI's face of pipelines: ``rayjobs submit PIPELINE.yaml``, and ``status`` / ``stop`` of a pipeline run's id."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from runner.cli.options import say as _say
from runner.errors import BadInput

if TYPE_CHECKING:
    from runner.cli.options import ConnectionOptions, SubmitFlags
    from runner.client.jobs_api import JobsApi


def is_pipeline_path(path: Path) -> bool:
    """Whether the file ``rayjobs submit`` was given is a pipeline (it names ``pipeline`` and ``jobs``); a file that
    cannot be read is left to the spec's loader to say why."""
    from jobs.errors import SpecError
    from jobs.pipeline import is_pipeline_file
    from jobs.yaml_reader import read_yaml_mapping

    try:
        data, _ = read_yaml_mapping(path)
    except SpecError:
        return False
    return is_pipeline_file(data)


def submit_pipeline_file(path: Path, overrides: list[str], connection: ConnectionOptions, flags: SubmitFlags) -> None:
    """``rayjobs submit PIPELINE.yaml``: check it whole, send its jobs as one run, and follow the run to its end unless
    ``--no-wait``; ends the command with the run's exit code."""
    from jobs.pipeline import load_pipeline
    from runner.cli.cluster import ensure_local_cluster
    from runner.client import jobs_api
    from runner.run.pipeline import follow_pipeline, submit_pipeline

    if overrides:
        raise BadInput("--set applies to one spec; a pipeline's jobs take their overrides from its file "
                       "(`set:` under each job)")
    loaded = load_pipeline(path)
    if flags.dry_run:
        plan = {name: {"spec": str(loaded.jobs[name].path), "after": loaded.after[name],
                       "queue": loaded.jobs[name].spec.queue or loaded.name} for name in loaded.order}
        typer.echo(json.dumps({"pipeline": loaded.name, "jobs": plan}, indent=2) if flags.output == "json" else
                   "\n".join(f"{name}: {job['spec']} in queue {job['queue']}"
                             + (f", after {', '.join(job['after'])}" if job["after"] else "")
                             for name, job in plan.items()))
        return
    target = connection.target(None, "")
    if flags.local and target.address is None:
        ensure_local_cluster(target.cluster_name)
    client = jobs_api.open_client(connection.resolve(None, ""))
    submitted = submit_pipeline(client, loaded, _say)
    if flags.no_wait:
        typer.echo(json.dumps({"pipeline": submitted.run_id, "jobs": submitted.jobs}) if flags.output == "json"
                   else submitted.run_id)
        _say(f"`rayjobs status {submitted.run_id}` shows each job's state; `rayjobs stop {submitted.run_id}` stops "
             "what runs and withdraws what waits")
        return
    code = follow_pipeline(client, submitted, _say)
    if flags.output == "json":
        from runner.run.pipeline import job_states

        typer.echo(json.dumps({"pipeline": submitted.run_id, "jobs": submitted.jobs,
                               "states": job_states(client, submitted), "exit_code": int(code)}))
    raise typer.Exit(int(code))


def pipeline_of(client: JobsApi, run_id: str):  # noqa: ANN201 - SubmittedPipeline, imported lazily
    """Pipeline run ``run_id`` as the keeper last published it, or None."""
    from runner.client.queue import ClusterQueue
    from runner.run.pipeline import SubmittedPipeline

    run = ClusterQueue(client).pipeline(run_id)
    if run is None:
        return None
    return SubmittedPipeline(run_id, dict(run.get("jobs") or {}), dict(run.get("after") or {}))


def show_pipeline(client: JobsApi, run_id: str, output: str) -> bool:
    """``rayjobs status RUN``: each job of pipeline run ``run_id`` and its state; False when there is no such run.
    Ends the command with the run's exit code (0 while it runs)."""
    from runner.run.pipeline import job_states, run_exit_code

    submitted = pipeline_of(client, run_id)
    if submitted is None:
        return False
    states = job_states(client, submitted)
    if output == "json":
        typer.echo(json.dumps({"pipeline": run_id, "jobs": submitted.jobs, "after": submitted.after,
                               "states": states}, indent=2))
    else:
        width = max(len(name) for name in submitted.jobs)
        typer.echo(f"pipeline run {run_id}")
        for name, job_id in submitted.jobs.items():
            after = submitted.after.get(name) or []
            typer.echo(f"  {name:<{width}}  {states[name]}  ({job_id}" + (f"; after {', '.join(after)})" if after
                                                                         else ")"))
    sys.stdout.flush()
    raise typer.Exit(int(run_exit_code(states)))


def stop_pipeline(client: JobsApi, run_id: str) -> bool:
    """``rayjobs stop RUN``: stop each job of pipeline run ``run_id`` that runs, withdraw each that waits (its
    dependants then end without running); False when there is no such run."""
    from runner.client.queue import stop_job
    from runner.errors import JobNotFound

    submitted = pipeline_of(client, run_id)
    if submitted is None:
        return False
    for name, job_id in submitted.jobs.items():
        try:
            stopped = stop_job(client, job_id)
        except JobNotFound:
            continue
        if stopped.found != "ended":
            _say(f"{run_id}: stop requested for {name} ({stopped.attempt or job_id})")
    return True


__all__ = ["is_pipeline_path", "show_pipeline", "stop_pipeline", "submit_pipeline_file"]
