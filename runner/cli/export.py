"""``rayjobs export``: a spec written out for another system to run (``export kuberay``: a RayJob manifest).

The manifest goes to stdout, so ``rayjobs export kuberay SPEC | kubectl apply -f -`` works;
notes and warnings go to stderr as ``rayjobs: …`` lines.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from runner.cli.options import handles_errors, say as _say

export_app = typer.Typer(help="Write a spec out for another system to run (no cluster is contacted).",
                         no_args_is_help=True, rich_markup_mode=None)

@export_app.command("kuberay")
@handles_errors
def kuberay(
    spec_file: Annotated[str, typer.Argument(metavar="SPEC", help="Spec file (YAML).", show_default=False)],
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a spec field "
                    "(as in submit). Repeatable.", show_default=False)] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", metavar="NAME", help="Run on this existing "
                       "RayCluster (clusterSelector) instead of a cluster of the job's own.",
                       show_default=False)] = None,
    image: Annotated[Optional[str], typer.Option("--image", metavar="IMAGE", help="Container image of the job's "
                     "own cluster (default: rayproject/ray for this Ray and Python version, -gpu when GPUs are "
                     "asked for).", show_default=False)] = None,
    upload_to: Annotated[Optional[str], typer.Option("--upload-to", metavar="s3://BUCKET/PREFIX", help="Package "
                         "the local working_dir (and py_modules folders) as Ray does and upload it there; the "
                         "manifest names the uploaded zip.", show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", metavar="CRON", help="Print a RayCronJob that "
                        "runs the RayJob on this cron schedule (five fields, e.g. \"0 3 * * *\"); needs the "
                        "operator's RayCronJob feature gate.", show_default=False)] = None,
    priority_class: Annotated[Optional[str], typer.Option("--priority-class", metavar="NAME", help="For a spec "
                              "with queue: the Kueue WorkloadPriorityClass of the RayJob (its queue becomes the "
                              "kueue.x-k8s.io/queue-name label).", show_default=False)] = None,
    time_zone: Annotated[Optional[str], typer.Option("--time-zone", metavar="ZONE", help="With --schedule: the "
                         "IANA time zone of the schedule (e.g. Europe/Paris; default: the operator's).",
                         show_default=False)] = None,
    multikueue: Annotated[bool, typer.Option("--multikueue", help="For a spec with queue, applied on a MultiKueue "
                          "manager cluster: set managedBy: kueue.x-k8s.io/multikueue, so that Kueue runs the RayJob "
                          "on one of its worker clusters.")] = False,
) -> None:
    """Print a KubeRay RayJob manifest (YAML) for SPEC: `rayjobs export kuberay SPEC | kubectl apply -f -`.

    With --schedule, a RayCronJob whose job template is that RayJob.
    """
    from rayjobs_agent.wire import METADATA_SPEC_HASH
    from jobs.loader import load_spec
    from jobs.submission import build_submission
    from jobs.submission import local_runtime_paths
    from rayjobs_agent.package import AGENT_PACKAGE_DIR
    from rayjobs_agent.wire import RECORD_ENV_VAR
    from runner.export.kuberay import build_rayjob, check_queue_and_cleanup, manifest_yaml
    from runner.errors import BadInput
    from runner.export.packaging import upload_destination, upload_local_paths
    from runner.export.schedule import build_raycronjob, check_schedule, check_time_zone

    # Checked before the spec and any upload: a schedule refused after an upload would have wasted it.
    zone_note = None
    if schedule is not None:
        schedule = check_schedule(schedule)
        if time_zone is not None:
            zone_note = check_time_zone(time_zone)
    elif time_zone is not None:
        raise BadInput(f"--time-zone {time_zone} is given without --schedule: it is the time zone of a schedule, "
                       "so give both (e.g. --schedule \"0 3 * * *\" --time-zone Europe/Paris) or neither")
    if multikueue and schedule is not None:
        raise BadInput("--multikueue cannot go with --schedule: the RayCronJob gives the RayJobs it creates none of "
                       "its labels, so they join no Kueue queue, and KubeRay leaves alone a RayJob that names another "
                       "manager: nothing would ever run them. Schedule the export without --multikueue, or leave out "
                       "--schedule")
    if upload_to is not None:
        upload_destination(upload_to)
    from pathlib import Path

    from runner.cli.pipelines import is_pipeline_path

    if is_pipeline_path(Path(spec_file)):
        raise BadInput(f"{spec_file} is a pipeline: KubeRay has no dependencies between RayJobs, so it is not exported "
                       "(half a pipeline would run its jobs in any order). Export each job's spec on its own and "
                       "order them with your workflow tool, or run the pipeline on a Ray cluster with `rayjobs submit`")
    loaded = load_spec(spec_file, set_ or [])
    check_queue_and_cleanup(loaded, on_existing_cluster=cluster is not None, multikueue=multikueue)
    # On Kubernetes, Kueue queues the RayJob itself (the labels build_rayjob adds): the job does not also wait
    # in a queue of its own cluster.
    unqueued = dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"queue": None}))
    submission = build_submission(unqueued)
    if upload_to is None and local_runtime_paths(submission.get("runtime_env") or {}) == [
            ("py_modules", str(AGENT_PACKAGE_DIR))] and RECORD_ENV_VAR not in _env_vars(submission):
        # Nothing of the user's needs uploading, and the agent alone is no reason to ask for a bucket: the job
        # runs as written, and what that costs is said.
        submission = build_submission(unqueued, beside_agent=False)
        _say("warning: the job runs without rayjobs' agent, which only --upload-to can ship to a RayJob: no retries "
             "in place by cause (backoffLimit retries after any failure, on a new cluster) and no cause in its log")
    if cluster is not None and image is not None:
        _say("warning: --image is not used with --cluster: the existing cluster's image runs the job")
    runtime_env = submission.get("runtime_env") or {}
    if upload_to is not None:
        if local_runtime_paths(runtime_env):
            submission["runtime_env"] = upload_local_paths(runtime_env, upload_to, say=_say)
        else:
            _say("note: --upload-to is not needed: the runtime_env names no local files")
    export = build_rayjob(loaded, submission, cluster=cluster, image=image, priority_class=priority_class,
                          multikueue=multikueue)
    if schedule is not None:
        export = build_raycronjob(export, schedule, time_zone)
        if zone_note:
            export.warnings.append(zone_note)
    for note in export.notes:
        _say(f"note: {note}")
    for warning in export.warnings:
        _say(f"warning: {warning}")
    typer.echo(f"# rayjobs export kuberay {spec_file} (spec hash {submission['metadata'][METADATA_SPEC_HASH]})")
    typer.echo(manifest_yaml(export.manifest), nl=False)


def _env_vars(submission: dict) -> dict:
    return (submission.get("runtime_env") or {}).get("env_vars") or {}


def register(app: typer.Typer) -> None:
    """Add ``rayjobs export …`` to the ``rayjobs`` command."""
    app.add_typer(export_app, name="export")
