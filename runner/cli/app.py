"""The ``rayjobs`` command.

Each command parses its arguments, calls the library (``runner.run`` for submitting and
following, the cluster client for the rest), prints, and exits with a code from
``runner.errors``. Errors a user can fix are printed as one paragraph, never as a
traceback. Heavy imports (ray, pydantic specs) happen inside the commands that need them,
so ``status``/``logs``/``list`` start fast.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from rayjobs_agent.wire import METADATA_ATTEMPT, METADATA_NAME, METADATA_QUEUE
from jobs.infra.ray_env import prepare_ray_env
from jobs.infra.status import JobStatus, is_terminal
from runner.cli.cluster import ensure_local_cluster
from runner.cli.cluster import register as register_cluster_commands
from runner.cli.export import register as register_export_commands
from runner.cli.queue import register as register_queue_commands
from runner.cli.records import is_run_location, print_saved_log
from runner.cli.records import register as register_record_commands
from runner.cli.specs import register as register_spec_commands
from runner.cli.options import (ConnectionOptions, GiveUpOption, JobIdArgument, OutputOption, RawOption, SetOption,
                                SubmitFlags, check_output, handles_errors, with_connection_options,
                                with_submit_flags)
from runner.cli.options import fail as _fail, say as _say
from runner.cli.pipelines import is_pipeline_path, show_pipeline, stop_pipeline, submit_pipeline_file
from runner.errors import BadInput, ExitCode, JobNotFound

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec
    from runner.client.jobs_api import JobsApi
    from rayjobs_agent.causes import FailureReader
    from runner.follow.progress import RunProgress

app = typer.Typer(
    name="rayjobs",
    help="Run declarative YAML job specs on a Ray cluster and follow them to the end.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

STOP_WAIT_S = 60.0
# What `rayjobs stop` says after "stop requested for", by where the stop found the job (`StopFound.found`).
_STOP_WORDS = {"queued": " (waiting in its queue: it never starts)",
               "withdrawn": " (it was lost whole and waited for its next attempt: none is submitted)",
               "requested": " (its queue carries it out at its next step)"}
# How much of a job's log `status` reads for its progress and a failure's cause.
STATUS_LOG_LINES = 5000



@app.command()
@handles_errors
@with_connection_options
@with_submit_flags
def submit(
    spec_file: Annotated[str, typer.Argument(metavar="SPEC", help="Spec file (YAML).", show_default=False)],
    set_: SetOption = None,
    connection: ConnectionOptions = ConnectionOptions(),
    flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Validate SPEC, submit it, and follow the job to its end (exit code = outcome)."""
    from pathlib import Path

    from jobs.loader import load_spec

    check_output(flags.output)
    if is_pipeline_path(Path(spec_file)):
        submit_pipeline_file(Path(spec_file), set_ or [], connection, flags)
        return
    try:
        loaded = load_spec(Path(spec_file), set_ or [])
    except KeyboardInterrupt:
        _say("interrupted: nothing was submitted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    submit_loaded(loaded, connection, flags)


def submit_loaded(loaded: LoadedSpec, connection: ConnectionOptions, flags: SubmitFlags) -> None:
    """Submit a validated spec and follow it, as ``submit`` (and ``rerun``) do; ends the command with its exit code."""
    from runner.client import jobs_api
    from jobs.secrets import masked
    from jobs.submission import build_submission
    from jobs.sweep import trial_plan
    from runner.cli.render import dry_run_text, run_summary
    from runner.run.preflight import entrypoint_note, shared_storage_note
    from runner.follow.messages import follow_up_lines
    from runner.run.lifecycle import RunOptions, RunOutcome, run_with_retries

    try:
        submission = build_submission(loaded)
        spec_address_source = loaded.source_of("address")
        if flags.dry_run:
            address = connection.address or loaded.spec.address
            shown = {"address": address, **masked(submission)}
            plan = trial_plan(loaded.spec.sweep, loaded.workload) if loaded.spec.sweep else None
            if plan is not None:
                shown["sweep_plan"] = plan
            typer.echo(json.dumps(shown, indent=2) if flags.output == "json"
                       else dry_run_text(masked(submission), address, plan))
            return
        target = connection.target(loaded.spec.address, spec_address_source)
        if flags.local and target.address is None:
            ensure_local_cluster(target.cluster_name)
        client = jobs_api.open_client(connection.resolve(loaded.spec.address, spec_address_source))
    except KeyboardInterrupt:
        _say("interrupted: nothing was submitted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    if (note := entrypoint_note(loaded)) is not None:
        _say(f"warning: {note}")
    if (note := shared_storage_note(client.connection.local_cluster, loaded.workload)) is not None:
        _say(f"note: {note}")
    json_out = flags.output == "json"
    options = RunOptions(wait=not flags.no_wait, stream_logs=not flags.quiet, give_up_after_s=flags.give_up_after,
                         stop_on_interrupt=flags.stop_on_interrupt, preflight=not flags.no_preflight,
                         summaries=not json_out, raw=flags.raw, live=False if json_out or flags.raw else None)
    result = run_with_retries(client, loaded, options=options, logs_out=sys.stderr if json_out else sys.stdout)
    if result.outcome == RunOutcome.SUBMITTED:
        typer.echo(json.dumps({"submission_id": result.job_id, "address": client.address}) if json_out
                   else result.job_id)
        for line in follow_up_lines(result.job_id, client.connection):
            _say(line)
        return
    if json_out and result.followed is not None:
        typer.echo(json.dumps(run_summary(result.job_id, result.exit_code, result.followed, result.summary,
                                          client.address, result.attempts, result.progress.as_dict(),
                                          result.diagnosis.as_dict() if result.diagnosis else None)))
    raise typer.Exit(int(result.exit_code))




@app.command()
@handles_errors
@with_connection_options
@with_submit_flags
def rerun(
    run: Annotated[str, typer.Argument(metavar="RUN", help="A recorded run's folder, local or s3://.",
                                       show_default=False)],
    set_: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Submit even when the working_dir's or py_modules' code is "
                                        "no longer what the run recorded (with a warning).")] = False,
    continue_run: Annotated[bool, typer.Option("--continue", help="Continue the same run (its folder; a workload "
                                               "resumes from its last checkpoint) instead of a new one.")] = False,
    connection: ConnectionOptions = ConnectionOptions(),
    flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Run a recorded run's spec again as a new run beside it, linked both ways (--continue: the same run)."""
    from runner.cli.records import cluster_ray_version
    from runner.records.rerun import checked_rerun

    check_output(flags.output)
    loaded = checked_rerun(run, set_ or [], force=force, continue_run=continue_run, dry_run=flags.dry_run,
                           cluster_ray_version=lambda spec: cluster_ray_version(connection, spec))
    submit_loaded(loaded, connection, flags)


def _job_and_its_log(connection: ConnectionOptions, job_id: str) \
        -> tuple[JobsApi, dict, RunProgress, FailureReader]:
    """The cluster client, the job's record (a waiting job's place in its queue: ``queue``), and what the end of
    its log says (progress, failure reader)."""
    from runner.client import jobs_api
    from runner.follow.log_view import read_job_log
    from runner.follow.queued import job_or_place

    client = jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S)
    info = job_or_place(client, job_id)
    # The end of the log holds the latest progress: every report names the run's planned length.
    node_id = info.get("driver_node_id")
    text = client.job_log(job_id, STATUS_LOG_LINES, driver_node_id=node_id) if node_id else ""
    progress, failure = read_job_log(info, text)
    return client, info, progress, failure


@app.command()
@handles_errors
@with_connection_options
def status(
    job_id: JobIdArgument,
    connection: ConnectionOptions = ConnectionOptions(),
    output: OutputOption = "text",
) -> None:
    """Show a job's status. Exit code: 0 succeeded or still running, 1 failed, 3 stopped."""
    from jobs.secrets import masked
    from runner.errors import exit_code_for_status
    from runner.cli.render import attempts_report, progress_report, status_report
    from runner.follow.log_view import diagnosis_of
    from runner.follow.queued import queued_text

    check_output(output)
    try:
        client, info, progress, failure = _job_and_its_log(connection, job_id)
    except JobNotFound:
        from runner.client import jobs_api

        if not show_pipeline(jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S), job_id,
                             output):
            raise
        return
    queued = info.get("queue")
    diagnosis = diagnosis_of(progress, failure) if info.get("status") == JobStatus.FAILED else None
    train_runs, train_runs_error = _train_runs(client, info, progress)
    if output == "json":
        typer.echo(json.dumps({**masked(info), "progress": progress.as_dict(),
                               "diagnosis": diagnosis.as_dict() if diagnosis else None,
                               "train_runs": train_runs, "train_runs_error": train_runs_error,
                               "queue": queued}, indent=2))
    else:
        typer.echo(status_report(info))
        if queued is not None:
            typer.echo(queued_text(queued))
        if progress.events or diagnosis is not None:  # the agent's decisions are events too
            typer.echo(progress_report(progress, diagnosis))
        if train_runs:
            from runner.client.train_state import train_runs_text

            typer.echo(train_runs_text(train_runs))
        if METADATA_ATTEMPT in (info.get("metadata") or {}):
            typer.echo(attempts_report(info, client.list_jobs()))
    raise typer.Exit(int(exit_code_for_status(info.get("status", ""))))


def _train_runs(client: JobsApi, info: dict, progress: RunProgress) -> tuple[list | None, str | None]:
    """Ray Train's account of the job's runs, for a job that trained (``None`` and why, when there is none)."""
    from runner.client.train_state import job_train_runs
    from runner.errors import RayJobsError

    if progress.attempts == 0 or not info.get("job_id"):
        return None, "the job reported no Ray Train run"
    try:
        return job_train_runs(client, info["job_id"]), None
    except RayJobsError as exc:
        return None, str(exc)


@app.command()
@handles_errors
@with_connection_options
def logs(
    job_id: Annotated[str, typer.Argument(metavar="ID|RUN", help="Submission id, or a run's folder (local or s3://) "
                                          "to print the log its record saved.", show_default=False)],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends; exit code = "
                      "outcome.")] = False,
    tail: Annotated[Optional[int], typer.Option("--tail", "-n", min=0, metavar="N", help="Print only the last N lines "
                    "(without --follow).", show_default=False)] = None,
    connection: ConnectionOptions = ConnectionOptions(),
    give_up_after: GiveUpOption = 60.0,
    raw: RawOption = False,
) -> None:
    """Print a job's log (--follow: stream it until the job ends, with its progress), or the log a run's record saved."""
    from runner.client import jobs_api
    if is_run_location(job_id):
        if follow:
            raise BadInput("--follow needs a job id: a run's record holds the log as last uploaded")
        print_saved_log(job_id, tail)
        return
    from runner.follow.queued import job_or_place

    client = jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S)
    if follow:
        from runner.run.lifecycle import RunOptions, follow_job

        if tail is not None:
            raise BadInput("--tail and --follow cannot be combined; --follow prints the whole log")
        found = job_or_place(client, job_id)  # unknown id: clear error before streaming (a waiting job is followed)
        options = RunOptions(give_up_after_s=give_up_after, raw=raw, live=False if raw else None)
        result = follow_job(jobs_api.open_client(client.connection), job_id, options=options, log_tail_on_failure=False,
                            queued=found.get("queue") is not None)
        raise typer.Exit(int(result.exit_code))
    from jobs.secrets import job_mask  # Ray returns the job's runtime_env: its secrets' values are known here

    info = job_or_place(client, job_id)
    if info.get("queue") is not None:
        _say(f"job {job_id} waits in queue {info['queue'].get('queue')} (position {info['queue'].get('position')}): "
             "it has no log yet")
        return
    sys.stdout.write(job_mask(info).mask_text(client.job_log(job_id, tail)))
    sys.stdout.flush()


@app.command()
@handles_errors
@with_connection_options
def stack(
    job_id: JobIdArgument,
    connection: ConnectionOptions = ConnectionOptions(),
    output: OutputOption = "text",
) -> None:
    """Print the Python stacks of a running job's driver and training workers (py-spy, run by the dashboard)."""
    from runner.follow.stacks import job_stacks

    check_output(output)
    client, info, progress, _ = _job_and_its_log(connection, job_id)
    if info.get("queue") is not None:
        raise BadInput(f"job {job_id} waits in queue {info['queue'].get('queue')}: it has no process to show yet")
    if is_terminal(info.get("status")):
        raise BadInput(f"job {job_id} is {info.get('status')}: only a running job has stacks to show")
    stacks = job_stacks(client, info, progress)
    if output == "json":
        typer.echo(json.dumps([stack.as_dict() for stack in stacks], indent=2))
    else:
        for stack in stacks:
            typer.echo(stack.render())
    if not stacks or all(stack.error for stack in stacks):
        _fail(f"no stack of job {job_id} could be read" + ("" if stacks else ": its driver has not started"),
              ExitCode.FAILED)


@app.command()
@handles_errors
@with_connection_options
def stop(
    job_id: JobIdArgument,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job has stopped.")] = False,
    connection: ConnectionOptions = ConnectionOptions(),
) -> None:
    """Stop a running job, or take a waiting one out of its queue (it then reads STOPPED)."""
    from runner.client import jobs_api
    from runner.client.queue import stop_job
    from runner.client.jobs_api import wait_until_ended

    client = jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S)
    try:
        stopped = stop_job(client, job_id)
    except JobNotFound:
        if stop_pipeline(client, job_id):
            return
        raise
    # A job lost whole whose next attempt was submitted or entered: the stop acted on that attempt.
    target = stopped.attempt or job_id
    lost = f"job {job_id} was lost whole; " if stopped.attempt else ""
    if stopped.found == "ended":
        info = client.get_job(target)
        _say(f"{lost}job {target} had already ended: {info.get('status')}")
        return
    _say(f"{lost}stop requested for job {target}" + _STOP_WORDS.get(stopped.found, ""))
    if wait:
        status_now, ended = wait_until_ended(client, target, within_s=STOP_WAIT_S)
        if not ended:
            _fail(f"job {target} has not stopped after {STOP_WAIT_S:g}s (still {status_now})", ExitCode.FAILED)
        _say(f"job {target} is {status_now}")


@app.command("list")
@handles_errors
@with_connection_options
def list_jobs(
    status_filter: Annotated[Optional[list[str]], typer.Option("--status", "-s", metavar="STATUS", help="Only jobs in this status "
                             "(repeatable): PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED.", show_default=False)] = None,
    connection: ConnectionOptions = ConnectionOptions(),
    output: OutputOption = "text",
) -> None:
    """List the jobs on the cluster, newest first."""
    from runner.client import jobs_api
    from jobs.secrets import masked
    from runner.cli.render import jobs_table

    check_output(output)
    wanted = {s.upper() for s in status_filter or []}
    unknown = wanted - {status.value for status in JobStatus} - {"QUEUED"}
    if unknown:
        raise BadInput(f"unknown status {', '.join(sorted(unknown))}; use QUEUED, PENDING, RUNNING, SUCCEEDED, "
                       "FAILED or STOPPED")
    from runner.client.queue import ClusterQueue
    from runner.follow.queued import QUEUED, queued_info

    client = jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S)
    from rayjobs_agent.queueing import HELPER_NAME

    # A queue's helper jobs are the queue's own business (its keeper deletes them soon after they end).
    jobs = [job for job in client.list_jobs() if (not wanted or job.get("status") in wanted)
            and (job.get("metadata") or {}).get(METADATA_NAME) != HELPER_NAME]
    if not wanted or QUEUED in wanted:
        jobs += [queued_info(place) for place in ClusterQueue(client).waiting_jobs()]
    typer.echo(json.dumps([masked(job) for job in jobs], indent=2) if output == "json" else jobs_table(jobs))


@app.command()
@handles_errors
@with_connection_options
def delete(
    job_id: JobIdArgument,
    connection: ConnectionOptions = ConnectionOptions(),
) -> None:
    """Delete a finished job and its record from the cluster."""
    from runner.client import jobs_api
    from runner.follow.queued import job_or_place

    client = jobs_api.open_client(connection.resolve(), retry_for_s=jobs_api.ONE_SHOT_RETRY_S)
    info = job_or_place(client, job_id)  # a job waiting in its queue is no Ray job, and not finished either
    if not is_terminal(info.get("status")):
        raise BadInput(f"job {job_id} is {info.get('status')}; only finished jobs can be deleted "
                       f"(stop it first: rayjobs stop --wait {job_id})")
    client.delete_finished_job(job_id, info.get("end_time"))
    if (info.get("metadata") or {}).get(METADATA_QUEUE):
        from runner.client.queue import ClusterQueue

        ClusterQueue(client).forget_entry(job_id)  # its id is free for a new submission at once
    _say(f"deleted job {job_id}")


# After the cluster's commands in `rayjobs --help`: these need no cluster.
# Every other module of commands adds its own, one way: register(app).
for register in (register_cluster_commands, register_export_commands, register_queue_commands,
                 register_record_commands, register_spec_commands):
    register(app)


def main() -> None:
    """Console-script entry point."""
    prepare_ray_env()
    app()


if __name__ == "__main__":
    main()
