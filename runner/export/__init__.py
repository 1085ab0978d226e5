"""A spec in another form: a KubeRay RayJob manifest, and the working_dir package Ray uploads."""

from __future__ import annotations

import dataclasses
from typing import Callable


def kuberay_export(spec_file: str, overrides: list[str], *, cluster: str | None, image: str | None,
                   upload_to: str | None, schedule: str | None, priority_class: str | None, time_zone: str | None,
                   multikueue: bool, say: Callable[[str], None]) -> str:
    """The KubeRay manifest of a spec (a RayJob; with ``schedule``, a RayCronJob whose template it is), headed by a
    comment with the spec's hash: what ``rayjobs export kuberay`` prints. Notes and warnings go to ``say``; with
    ``upload_to``, the spec's local code is packaged as Ray does and uploaded there first.

    Raises:
        BadInput: options that cannot go together, a bad schedule or time zone, a spec the export cannot run as
            written (a queue with cleanup on an existing cluster, …).
    """
    from jobs.loader import load_spec
    from jobs.submission import build_submission, local_runtime_paths
    from rayjobs_agent.package import is_agent_module
    from rayjobs_agent.wire import METADATA_SPEC_HASH, RECORD_ENV_VAR
    from runner.errors import BadInput
    from runner.export.kuberay import build_rayjob, check_queue_and_cleanup, manifest_yaml
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
    loaded = load_spec(spec_file, overrides)
    check_queue_and_cleanup(loaded, on_existing_cluster=cluster is not None, multikueue=multikueue)
    # On Kubernetes, Kueue queues the RayJob itself (the labels build_rayjob adds): the job does not also wait
    # in a queue of its own cluster.
    unqueued = dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"queue": None}))
    submission = build_submission(unqueued)
    local = local_runtime_paths(submission.get("runtime_env") or {})
    env_vars = (submission.get("runtime_env") or {}).get("env_vars") or {}
    if (upload_to is None and len(local) == 1 and local[0][0] == "py_modules" and is_agent_module(local[0][1])
            and RECORD_ENV_VAR not in env_vars):
        # Nothing of the user's needs uploading, and the agent alone is no reason to ask for a bucket: the job
        # runs as written, and what that costs is said.
        submission = build_submission(unqueued, beside_agent=False)
        say("warning: the job runs without rayjobs' agent, which only --upload-to can ship to a RayJob: no retries "
            "in place by cause (backoffLimit retries after any failure, on a new cluster) and no cause in its log")
    if cluster is not None and image is not None:
        say("warning: --image is not used with --cluster: the existing cluster's image runs the job")
    runtime_env = submission.get("runtime_env") or {}
    if upload_to is not None:
        if local_runtime_paths(runtime_env):
            submission["runtime_env"] = upload_local_paths(runtime_env, upload_to, say=say)
        else:
            say("note: --upload-to is not needed: the runtime_env names no local files")
    export = build_rayjob(loaded, submission, cluster=cluster, image=image, priority_class=priority_class,
                          multikueue=multikueue)
    if schedule is not None:
        export = build_raycronjob(export, schedule, time_zone)
        if zone_note:
            export.warnings.append(zone_note)
    for note in export.notes:
        say(f"note: {note}")
    for warning in export.warnings:
        say(f"warning: {warning}")
    return (f"# rayjobs export kuberay {spec_file} (spec hash {submission['metadata'][METADATA_SPEC_HASH]})\n"
            + manifest_yaml(export.manifest))
