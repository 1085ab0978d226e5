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
) -> None:
    """Print a KubeRay RayJob manifest (YAML) for SPEC: `rayjobs export kuberay SPEC | kubectl apply -f -`."""
    from jobs.keys import METADATA_SPEC_HASH
    from jobs.loader import load_spec
    from jobs.submission import build_submission
    from jobs.submission import local_runtime_paths
    from runner.export.kuberay import build_rayjob, manifest_yaml
    from runner.export.packaging import S3Location, upload_local_paths

    if upload_to is not None:
        S3Location.parse(upload_to)
    loaded = load_spec(spec_file, set_ or [])
    submission = build_submission(loaded)
    if cluster is not None and image is not None:
        _say("warning: --image is not used with --cluster: the existing cluster's image runs the job")
    runtime_env = submission.get("runtime_env") or {}
    if upload_to is not None:
        if local_runtime_paths(runtime_env):
            submission["runtime_env"] = upload_local_paths(runtime_env, upload_to, say=_say)
        else:
            _say("note: --upload-to is not needed: the runtime_env names no local files")
    export = build_rayjob(loaded, submission, cluster=cluster, image=image)
    for note in export.notes:
        _say(f"note: {note}")
    for warning in export.warnings:
        _say(f"warning: {warning}")
    typer.echo(f"# rayjobs export kuberay {spec_file} (spec hash {submission['metadata'][METADATA_SPEC_HASH]})")
    typer.echo(manifest_yaml(export.manifest), nl=False)
