"""The ``rayjobs`` command.

Every command builds its connection the same way, makes its calls, prints, and
exits with a code from ``runner.exit_codes``. Errors a user can fix are printed as
one paragraph, never as a traceback. Heavy imports (ray, pydantic specs) happen
inside the commands that need them, so ``status``/``logs``/``list`` start fast.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, Optional, TypeVar

import typer

from jobs.keys import METADATA_ATTEMPT
from jobs.ray_env import prepare_ray_env
from jobs.status import JobStatus, is_terminal
from runner.cli_export import export_app
from runner.errors import BadInput, RayJobsError
from runner.exit_codes import ExitCode

app = typer.Typer(
    name="rayjobs",
    help="Run declarative YAML job specs on a Ray cluster and follow them to the end.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
cluster_app = typer.Typer(help="A local Ray cluster (one node or several) on 127.0.0.1 for development and CI.",
                          no_args_is_help=True, rich_markup_mode=None)
app.add_typer(cluster_app, name="cluster")
app.add_typer(export_app, name="export")

F = TypeVar("F", bound=Callable[..., Any])

AddressOption = Annotated[Optional[str], typer.Option(
    "--address", "-a", metavar="URL", help="Dashboard address, e.g. http://127.0.0.1:8265. Overrides the spec's 'address', "
    "RAYJOBS_CLUSTER, RAY_API_SERVER_ADDRESS and RAY_ADDRESS; default: the local cluster.", show_default=False)]
ClusterOption = Annotated[Optional[str], typer.Option(
    "--cluster", metavar="NAME", help="A local cluster by name (`rayjobs cluster up --name NAME`) instead of an address. "
    "Overrides the spec's 'address', RAYJOBS_CLUSTER and RAY_ADDRESS.", show_default=False)]
HeaderOption = Annotated[Optional[list[str]], typer.Option(
    "--header", metavar="'NAME: VALUE'", help="Extra HTTP header 'Name: value' for the dashboard (repeatable; adds to RAY_JOB_HEADERS). "
    "Never printed.", show_default=False)]
NoVerifyOption = Annotated[bool, typer.Option("--no-verify", help="Do not verify the dashboard's TLS certificate.")]
CaCertOption = Annotated[Optional[str], typer.Option("--ca-cert", metavar="FILE", help="CA bundle to verify the dashboard's TLS "
                                                     "certificate with.", show_default=False)]
OutputOption = Annotated[str, typer.Option("--output", "-o", metavar="text|json", help="Output format.")]
JobIdArgument = Annotated[str, typer.Argument(metavar="ID", help="Submission id (or Ray job id).", show_default=False)]
GiveUpOption = Annotated[float, typer.Option("--give-up-after", min=1, metavar="SECONDS", help="Seconds without an answer from the "
                                             "cluster before following stops with exit code 4 (the job runs on).")]


def _say(text: str) -> None:
    typer.echo(f"rayjobs: {text}", err=True)


def _fail(message: str, code: ExitCode) -> None:
    typer.echo(f"rayjobs: error: {message}", err=True)
    raise typer.Exit(int(code))


def handles_errors(command: F) -> F:
    """Turn the library's exceptions into a one-paragraph message and an exit code."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from jobs.errors import SpecError

        try:
            return command(*args, **kwargs)
        except SpecError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(int(ExitCode.BAD_INPUT)) from None
        except RayJobsError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            # Click would print "Aborted!" and exit 1, which a script cannot tell from a failed job.
            _say("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    return wrapper  # type: ignore[return-value]


def _check_output(output: str) -> None:
    if output not in ("text", "json"):
        raise BadInput(f"--output must be 'text' or 'json', not {output!r}")


def _api(address: str | None, headers: list[str] | None, no_verify: bool, ca_cert: str | None,
         spec_address: str | None = None, spec_address_source: str = "the spec", cluster: str | None = None):
    from runner.api import JobsApi
    from runner.connection import resolve_connection

    connection = resolve_connection(address, spec_address, spec_address_source, headers, verify=not no_verify,
                                    ca_cert=ca_cert, cluster_name=cluster)
    return JobsApi(connection)


def _address_hint(api: Any) -> str:
    connection = api.connection
    if connection.source == "local cluster":
        return ""
    if connection.source in ("--cluster", "RAYJOBS_CLUSTER"):
        return f" --cluster {connection.local_cluster}"
    return f" --address {api.address}"


def _where(connection: Any) -> str:
    if connection.local_cluster is None or connection.source == "local cluster":
        return connection.source
    return f"local cluster '{connection.local_cluster}' via {connection.source}"


def _print_follow_up(api: Any, job_id: str) -> None:
    hint = _address_hint(api)
    _say(f"follow it:  rayjobs logs --follow {job_id}{hint}")
    _say(f"its status: rayjobs status {job_id}{hint}")
    _say(f"stop it:    rayjobs stop {job_id}{hint}")


def _follow(api: Any, job_id: str, *, output: str, stream_logs: bool, give_up_after: float,
            timeout_s: float | None = None, start_timeout_s: float | None = None, demand: dict | None = None,
            stop_on_interrupt: bool = False, log_tail_on_failure: bool = True) -> tuple[ExitCode, Any, str]:
    """Follow a job to its end; return its exit code, the follower's outcome and the summary line."""
    from runner.follow import Follower
    from runner.render import summary_line

    follower = Follower(api, job_id, logs_out=sys.stderr if output == "json" else sys.stdout,
                        stream_logs=stream_logs, give_up_after_s=give_up_after, timeout_s=timeout_s,
                        start_timeout_s=start_timeout_s, demand=demand)
    try:
        outcome = follower.run()
    except KeyboardInterrupt:
        return _interrupted(api, job_id, stop_on_interrupt), None, ""
    summary = summary_line(job_id, outcome.exit_code, outcome.info, outcome.reason)
    # With --output json the caller prints one JSON document once it is done.
    if output != "json":
        _say(summary)
        if log_tail_on_failure and outcome.status == "FAILED" and outcome.log_tail:
            _say("last lines of its log:")
            for line in outcome.log_tail[-10:]:
                typer.echo(f"  | {line}", err=True)
    return outcome.exit_code, outcome, summary


def _interrupted(api: Any, job_id: str, stop_it: bool) -> ExitCode:
    if not stop_it:
        _say(f"interrupted: detached from job {job_id}, which keeps running on the cluster")
        _print_follow_up(api, job_id)
        return ExitCode.INTERRUPTED
    _say(f"interrupted: stopping job {job_id} (--stop-on-interrupt)")
    try:
        api.stop_job(job_id)
        _say(f"stop requested; check with: rayjobs status {job_id}{_address_hint(api)}")
    except RayJobsError as exc:
        _say(f"could not stop it: {exc}")
    return ExitCode.INTERRUPTED


@app.command()
@handles_errors
def submit(
    spec_file: Annotated[str, typer.Argument(metavar="SPEC", help="Spec file (YAML).", show_default=False)],
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a spec field: KEY.PATH=VALUE "
                    "(value read as YAML, e.g. --set workload.train.epochs=3). Repeatable; beats the file.",
                    show_default=False)] = None,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Print the id and return right after submitting.")]
    = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted (secrets masked); "
                       "contact no cluster.")] = False,
    output: OutputOption = "text",
    local: Annotated[bool, typer.Option("--local", help="Start the local cluster (or --cluster NAME) first if it "
                     "is not running and no address is given.")] = False,
    stop_on_interrupt: Annotated[bool, typer.Option("--stop-on-interrupt", help="Stop the job on Ctrl-C "
                                 "(default: detach and leave it running).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream the job's log.")] = False,
    no_preflight: Annotated[bool, typer.Option("--no-preflight", help="Submit even if no node offers the "
                            "entrypoint's resources (e.g. nodes that will join later).")] = False,
    give_up_after: GiveUpOption = 60.0,
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Validate SPEC, submit it, and follow the job to its end (exit code = outcome)."""
    from pathlib import Path

    from jobs.loader import load_spec
    from jobs.secrets import masked
    from jobs.keys import METADATA_PARENT
    from jobs.submission import build_submission, should_retry
    from runner.connection import choose_target
    from runner.local.storage_note import shared_storage_note
    from runner.preflight import entrypoint_demand

    _check_output(output)
    try:
        loaded = load_spec(Path(spec_file), set_ or [])
        submission = build_submission(loaded)
        spec_address_source = "--set address" if any(o.split("=", 1)[0].strip() == "address" for o in set_ or []) \
            else f"'address' in {spec_file}"
        if dry_run:
            typer.echo(json.dumps({"address": address or loaded.spec.address, **masked(submission)}, indent=2)
                       if output == "json" else _dry_run_text(masked(submission), address or loaded.spec.address))
            return
        target = choose_target(address, loaded.spec.address, spec_address_source, cluster)
        if local and target.address is None:
            _ensure_local_cluster(target.cluster_name)
        api = _api(address, header, no_verify, ca_cert, loaded.spec.address, spec_address_source, cluster)
    except KeyboardInterrupt:
        _say("interrupted: nothing was submitted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    spec = loaded.spec
    if (note := shared_storage_note(api.connection.local_cluster, submission)) is not None:
        _say(f"note: {note}")
    if spec.max_retries:
        submission["metadata"][METADATA_ATTEMPT] = "1"
    job_id = _submit_reporting_interrupts(api, submission, spec.name, not no_preflight, stop_on_interrupt)
    if no_wait:
        if spec.timeout_s or spec.start_timeout_s or spec.max_retries:
            _say("note: timeout_s, start_timeout_s and max_retries are applied only while rayjobs follows the job")
        typer.echo(json.dumps({"submission_id": job_id, "address": api.address}) if output == "json" else job_id)
        _print_follow_up(api, job_id)
        return
    attempts = [job_id]
    while True:
        code, outcome, summary = _follow(
            api, job_id, output=output, stream_logs=not quiet, give_up_after=give_up_after, timeout_s=spec.timeout_s,
            start_timeout_s=spec.start_timeout_s, demand=entrypoint_demand(submission),
            stop_on_interrupt=stop_on_interrupt)
        info = outcome.info if outcome is not None else None
        attempt = len(attempts)
        if code != ExitCode.FAILED or attempt > spec.max_retries or not should_retry(info or {}, spec.retry_on):
            if output == "json" and outcome is not None:
                typer.echo(json.dumps(_json_summary(api, job_id, code, outcome, summary, attempts)))
            raise typer.Exit(int(code))
        attempt += 1
        _say(f"attempt {attempt - 1} failed with {(info or {}).get('error_type')} (in retry_on); "
             f"submitting attempt {attempt} of {spec.max_retries + 1}")
        retry = dict(submission, metadata={**submission["metadata"], METADATA_ATTEMPT: str(attempt),
                                           METADATA_PARENT: attempts[0]})
        if spec.submission_id:
            retry["submission_id"] = f"{spec.submission_id}-attempt{attempt}"
        job_id = _submit_reporting_interrupts(api, retry, spec.name, False, stop_on_interrupt)
        attempts.append(job_id)


def _json_summary(api: Any, job_id: str, code: ExitCode, outcome: Any, summary: str,
                  attempts: list[str]) -> dict[str, Any]:
    info = outcome.info or {}
    return {
        "submission_id": job_id, "status": outcome.status, "exit_code": int(code), "summary": summary,
        "error_type": info.get("error_type"), "message": info.get("message"), "start_time": info.get("start_time"),
        "end_time": info.get("end_time"), "address": api.address, "attempts": attempts,
    }


def _submit_reporting_interrupts(api: Any, submission: dict[str, Any], name: str, preflight: bool,
                                 stop_on_interrupt: bool) -> str:
    """``_submit_or_attach``; on Ctrl-C, say whether the job was submitted and exit 130."""
    from runner.submit import SubmitInterrupted

    try:
        return _submit_or_attach(api, submission, name, preflight)
    except SubmitInterrupted as interrupted:
        code = _interrupted_while_submitting(api, interrupted, stop_on_interrupt)
    except KeyboardInterrupt:  # in the attach check or the pre-flight: before any job request
        code = _interrupted_while_submitting(api, SubmitInterrupted(None), stop_on_interrupt)
    raise typer.Exit(int(code))


def _submit_or_attach(api: Any, submission: dict[str, Any], name: str, preflight: bool) -> str:
    """Submit; with a fixed submission_id already taken by the same spec, attach to that job instead."""
    from jobs.keys import METADATA_SPEC_HASH
    from runner.errors import JobNotFound
    from runner.preflight import check_entrypoint_fits
    from runner.submit import SubmitInterrupted, submit_job

    wanted = submission.get("submission_id")
    if wanted:
        try:
            existing = api.get_job(wanted)
        except JobNotFound:
            existing = None
        if existing is not None:
            ours = submission["metadata"][METADATA_SPEC_HASH]
            theirs = (existing.get("metadata") or {}).get(METADATA_SPEC_HASH)
            if theirs != ours:
                raise BadInput(
                    f"submission_id {wanted!r} is already taken by a job with different content (spec hash "
                    f"{theirs or 'none: not submitted by rayjobs'}, this spec {ours}); change submission_id, or "
                    f"delete the old job first (rayjobs delete {wanted})")
            _say(f"job {wanted} was already submitted from this spec ({existing.get('status')}); attaching to it")
            return wanted
    if preflight:
        check_entrypoint_fits(api, submission, warn=lambda text: _say(f"warning: {text}"))
    job_id = submit_job(api.connection, submission, warn=lambda text: _say(f"warning: {text}"), progress=_say)
    try:
        _say(f"submitted {name} as {job_id} to {api.address} ({_where(api.connection)})")
    except KeyboardInterrupt:  # the job exists; the caller must not report it as never submitted
        raise SubmitInterrupted(job_id, answered=True) from None
    return job_id


def _interrupted_while_submitting(api: Any, interrupted: Any, stop_it: bool) -> ExitCode:
    """Report a Ctrl-C that came while submitting: was the job created, and where is it now."""
    from runner.errors import JobNotFound

    job_id = interrupted.submission_id
    if job_id is None:
        _say("interrupted: nothing was submitted")
        return ExitCode.INTERRUPTED
    hint = _address_hint(api)
    if not interrupted.answered:
        # The job request had gone out; only the cluster knows whether it created the job.
        try:
            api.get_job(job_id)
        except JobNotFound:
            _say(f"interrupted: nothing was submitted (the cluster has no job {job_id}; "
                 f"`rayjobs status {job_id}{hint}` checks again)")
            return ExitCode.INTERRUPTED
        except (RayJobsError, KeyboardInterrupt):
            _say(f"interrupted: the request to submit job {job_id} had gone out, but whether the cluster created "
                 f"it is unknown; check with `rayjobs status {job_id}{hint}`")
            return ExitCode.INTERRUPTED
    if stop_it:
        return _interrupted(api, job_id, stop_it=True)
    _say(f"interrupted: job {job_id} was submitted and keeps running; follow it with "
         f"`rayjobs logs --follow {job_id}{hint}`, stop it with `rayjobs stop {job_id}{hint}`")
    return ExitCode.INTERRUPTED


def _dry_run_text(submission: dict[str, Any], address: str | None) -> str:
    import yaml

    header = f"# would submit to {address or 'the resolved cluster (see --address)'}\n"
    return header + yaml.safe_dump(submission, sort_keys=False, default_flow_style=False, width=100)


def _ensure_local_cluster(name: str) -> None:
    """Start the named local cluster unless it runs; a failed start ends the command like `cluster up` (exit 4)."""
    from runner import local

    if local.find_running(name) is not None:
        return
    down = "rayjobs cluster down" + ("" if name == local.DEFAULT_CLUSTER_NAME else f" --name {name}")
    _say(f"no cluster running: starting local cluster '{name}' on 127.0.0.1 (stop it with `{down}`)")
    started = local.start(name=name)
    _say(f"local cluster '{name}' is up at {started.dashboard_url}")


@app.command()
@handles_errors
def status(
    job_id: JobIdArgument,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    output: OutputOption = "text",
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Show a job's status. Exit code: 0 succeeded or still running, 1 failed, 3 stopped."""
    from jobs.secrets import masked
    from runner.api import retrying
    from runner.exit_codes import exit_code_for_status
    from runner.render import attempts_report, status_report

    _check_output(output)
    api = _api(address, header, no_verify, ca_cert, cluster=cluster)
    info = retrying(lambda: api.get_job(job_id), give_up_after_s=5)
    if output == "json":
        typer.echo(json.dumps(masked(info), indent=2))
    else:
        typer.echo(status_report(info))
        if METADATA_ATTEMPT in (info.get("metadata") or {}):
            typer.echo(attempts_report(info, retrying(api.list_jobs, give_up_after_s=5)))
    raise typer.Exit(int(exit_code_for_status(info.get("status", ""))))


@app.command()
@handles_errors
def logs(
    job_id: JobIdArgument,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends; exit code = "
                      "outcome.")] = False,
    tail: Annotated[Optional[int], typer.Option("--tail", "-n", min=0, metavar="N", help="Print only the last N lines "
                    "(without --follow).", show_default=False)] = None,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    give_up_after: GiveUpOption = 60.0,
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Print a job's log (--follow: stream it until the job ends)."""
    from runner.api import retrying

    api = _api(address, header, no_verify, ca_cert, cluster=cluster)
    if follow:
        if tail is not None:
            raise BadInput("--tail and --follow cannot be combined; --follow prints the whole log")
        retrying(lambda: api.get_job(job_id), give_up_after_s=5)  # unknown id: clear error before streaming
        code, _, _ = _follow(api, job_id, output="text", stream_logs=True, give_up_after=give_up_after,
                          log_tail_on_failure=False)
        raise typer.Exit(int(code))
    text = retrying(lambda: api.job_log(job_id, tail), give_up_after_s=5)
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command()
@handles_errors
def stop(
    job_id: JobIdArgument,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job has stopped.")] = False,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Stop a running job."""
    from runner.api import retrying

    api = _api(address, header, no_verify, ca_cert, cluster=cluster)
    stopped = retrying(lambda: api.stop_job(job_id), give_up_after_s=5)
    if not stopped:
        info = api.get_job(job_id)
        _say(f"job {job_id} had already ended: {info.get('status')}")
        return
    _say(f"stop requested for job {job_id}")
    if wait:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status_now = retrying(lambda: api.get_job(job_id), give_up_after_s=10).get("status")
            if is_terminal(status_now):
                _say(f"job {job_id} is {status_now}")
                return
            time.sleep(0.3)
        _fail(f"job {job_id} has not stopped after 60s (still {status_now})", ExitCode.FAILED)


@app.command("list")
@handles_errors
def list_jobs(
    status_filter: Annotated[Optional[list[str]], typer.Option("--status", "-s", metavar="STATUS", help="Only jobs in this status "
                             "(repeatable): PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED.", show_default=False)] = None,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    output: OutputOption = "text",
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """List the jobs on the cluster, newest first."""
    from jobs.secrets import masked
    from runner.api import retrying
    from runner.render import jobs_table

    _check_output(output)
    wanted = {s.upper() for s in status_filter or []}
    unknown = wanted - {status.value for status in JobStatus}
    if unknown:
        raise BadInput(f"unknown status {', '.join(sorted(unknown))}; use PENDING, RUNNING, SUCCEEDED, FAILED "
                       "or STOPPED")
    api = _api(address, header, no_verify, ca_cert, cluster=cluster)
    jobs = [job for job in retrying(api.list_jobs, give_up_after_s=5) if not wanted or job.get("status") in wanted]
    typer.echo(json.dumps([masked(job) for job in jobs], indent=2) if output == "json" else jobs_table(jobs))


@app.command()
@handles_errors
def delete(
    job_id: JobIdArgument,
    address: AddressOption = None,
    cluster: ClusterOption = None,
    header: HeaderOption = None,
    no_verify: NoVerifyOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Delete a finished job and its record from the cluster."""
    from runner.api import retrying

    api = _api(address, header, no_verify, ca_cert, cluster=cluster)
    info = retrying(lambda: api.get_job(job_id), give_up_after_s=5)
    if not is_terminal(info.get("status")):
        raise BadInput(f"job {job_id} is {info.get('status')}; only finished jobs can be deleted "
                       f"(stop it first: rayjobs stop --wait {job_id})")
    api.delete_finished_job(job_id, info.get("end_time"))
    _say(f"deleted job {job_id}")


@app.command()
def validate(
    spec_files: Annotated[list[str], typer.Argument(metavar="SPEC...", help="Spec files to check.",
                                                    show_default=False)],
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a field before checking (as in "
                    "submit).", show_default=False)] = None,
) -> None:
    """Check spec files without contacting a cluster (exit code 2 if any is invalid)."""
    from jobs.errors import SpecError
    from jobs.loader import load_spec

    failed = 0
    for spec_file in spec_files:
        try:
            loaded = load_spec(spec_file, set_ or [])
        except SpecError as exc:
            failed += 1
            typer.echo(str(exc), err=True)
            continue
        kind = f", workload {loaded.workload_kind}" if loaded.workload_kind else ""
        typer.echo(f"{spec_file}: ok ({loaded.spec.name}{kind})")
    raise typer.Exit(int(ExitCode.BAD_INPUT) if failed else 0)


@app.command()
def schema(
    workload: Annotated[Optional[str], typer.Option("--workload", metavar="KIND", help="Print the schema of this workload kind's "
                        "parameters instead (e.g. vision).", show_default=False)] = None,
) -> None:
    """Print the JSON Schema of a spec file (for editor validation of specs/*.yaml)."""
    from jobs.spec import JobSpec
    from jobs.workload_kinds import workload_model

    if workload is None:
        document = JobSpec.model_json_schema()
        document["title"] = "rayjobs spec"
    else:
        try:
            document = workload_model(workload).model_json_schema()
        except ValueError as exc:
            _fail(str(exc), ExitCode.BAD_INPUT)
    typer.echo(json.dumps(document, indent=2))


ClusterNameOption = Annotated[str, typer.Option("--name", metavar="NAME", envvar="RAYJOBS_CLUSTER",
                                                help="Name of the local cluster (several may run).")]


@cluster_app.command("up")
@handles_errors
def cluster_up(
    num_cpus: Annotated[Optional[int], typer.Option("--num-cpus", min=1, metavar="N", help="CPUs each node offers "
                        "(default: all).", show_default=False)] = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, metavar="N", help="Nodes on 127.0.0.1: the head and N-1 "
                     "worker nodes, each its own raylet and object store.")] = 1,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Start without token authentication (anyone who can "
                       "reach 127.0.0.1 can then run code on it).")] = False,
    name: ClusterNameOption = "default",
) -> None:
    """Start a Ray cluster bound to 127.0.0.1 on free ports (exit code 4 when it fails to start)."""
    from runner import local

    running = local.status(name)
    if running is not None:
        _say(f"local cluster '{name}' is already running at {running.dashboard_url}")
        if running.node_count != nodes:
            _say(f"it has {running.node_count} node(s), not {nodes}; stop it first to start it with --nodes {nodes}")
        return
    with_nodes = f" with {nodes} nodes" if nodes > 1 else ""
    _say(f"starting local cluster '{name}'{with_nodes} on 127.0.0.1 ...")
    started = local.start(name=name, num_cpus=num_cpus, auth=not no_auth, nodes=nodes)
    auth = f"token auth on (token file {started.token_file})" if started.token_file else "no authentication"
    _say(f"local cluster '{name}' is up at {started.dashboard_url}{with_nodes}; {auth}")
    if name == local.DEFAULT_CLUSTER_NAME:
        _say("rayjobs commands use it when no address is given; stop it with `rayjobs cluster down`")
    else:
        _say(f"rayjobs commands use it with --cluster {name} (or RAYJOBS_CLUSTER={name}) or its address; "
             f"stop it with `rayjobs cluster down --name {name}`")


@cluster_app.command("down")
@handles_errors
def cluster_down(name: ClusterNameOption = "default") -> None:
    """Stop the local cluster started by `rayjobs cluster up`, all its nodes (and nothing else)."""
    from runner import local

    if local.stop(name):
        _say(f"local cluster '{name}' stopped")
    else:
        _say(f"no local cluster '{name}' is running")


@cluster_app.command("status")
@handles_errors
def cluster_status(name: ClusterNameOption = "default", output: OutputOption = "text") -> None:
    """Show whether the local cluster runs, where, and its nodes (exit code 4 when it does not run)."""
    from runner import local

    _check_output(output)
    running = local.status(name)
    if running is None:
        up = "rayjobs cluster up" + ("" if name == local.DEFAULT_CLUSTER_NAME else f" --name {name}")
        _fail(f"no local cluster '{name}' is running; start one with `{up}`", ExitCode.CLUSTER_UNREACHABLE)
    try:
        nodes, nodes_error = local.list_nodes(running), None
    except local.ClusterError as exc:
        nodes, nodes_error = None, str(exc)
    if output == "json":
        typer.echo(json.dumps({
            "name": running.name, "dashboard": running.dashboard_url, "gcs": running.gcs_address,
            "auth": running.auth, "token_file": running.token_file, "pid": running.pid, "log": running.log_file,
            "node_count": running.node_count,
            "nodes": None if nodes is None else [node.to_dict() for node in nodes], "nodes_error": nodes_error,
        }, indent=2))
        return
    typer.echo(f"name:      {running.name}\ndashboard: {running.dashboard_url}\ngcs:       {running.gcs_address}\n"
               f"auth:      {'token (' + running.token_file + ')' if running.token_file else 'none'}\n"
               f"pid:       {running.pid}\nlog:       {running.log_file}")
    typer.echo(_nodes_text(nodes, nodes_error))


def _nodes_text(nodes: list[Any] | None, error: str | None) -> str:
    """The ``nodes:`` section of ``cluster status``: one row per node the cluster's GCS knows."""
    if nodes is None:
        return f"nodes:     unknown ({error})"
    alive = sum(node.alive for node in nodes)
    rows = [("ROLE", "NODE ID", "CPUS", "ALIVE")]
    rows += [(node.role, node.node_id, "-" if node.cpus is None else f"{node.cpus:g}", "yes" if node.alive else
              f"no ({node.state})") for node in nodes]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [f"nodes:     {len(nodes)} ({alive} alive)"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]
    return "\n".join(lines)


def main() -> None:
    """Console-script entry point."""
    prepare_ray_env()
    app()


if __name__ == "__main__":
    main()
