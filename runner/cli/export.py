"""``rayjobs export``: a spec written out for another system to run (``export kuberay``: a RayJob manifest).

The manifest goes to stdout, so ``rayjobs export kuberay SPEC | kubectl apply -f -`` works;
notes and warnings go to stderr as ``rayjobs: …`` lines.
"""

from __future__ import annotations

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
    from pathlib import Path

    from runner.cli.pipelines import is_pipeline_path
    from runner.errors import BadInput
    from runner.export import kuberay_export

    if is_pipeline_path(Path(spec_file)):
        raise BadInput(f"{spec_file} is a pipeline: KubeRay has no dependencies between RayJobs, so it is not exported "
                       "(half a pipeline would run its jobs in any order). Export each job's spec on its own and "
                       "order them with your workflow tool, or run the pipeline on a Ray cluster with `rayjobs submit`")
    typer.echo(kuberay_export(spec_file, set_ or [], cluster=cluster, image=image, upload_to=upload_to,
                              schedule=schedule, priority_class=priority_class, time_zone=time_zone,
                              multikueue=multikueue, say=_say), nl=False)


def register(app: typer.Typer) -> None:
    """Add ``rayjobs export …`` to the ``rayjobs`` command."""
    app.add_typer(export_app, name="export")
