"""``rayjobs cluster up|down|status``: a local Ray cluster on 127.0.0.1 for development and CI."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from runner.cli.options import OutputOption, check_output, handles_errors
from runner.cli.options import fail as _fail, say as _say
from runner.errors import ExitCode

cluster_app = typer.Typer(help="A local Ray cluster (one node or several) on 127.0.0.1 for development and CI.",
                          no_args_is_help=True, rich_markup_mode=None)

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
    gcs_store: Annotated[Optional[str], typer.Option("--gcs-store", metavar="redis://HOST:PORT", help="Keep the "
                         "head's GCS in this Redis, so that the cluster survives a restart of its head: after a crash, "
                         "`rayjobs cluster up` starts it again on its ports and it finds its jobs and queue.",
                         show_default=False)] = None,
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
    stale = local.state.peek_state(name)  # kept after its head died only when its GCS is in Redis
    if stale is not None and stale.gcs_store and gcs_store in (None, stale.gcs_store):
        _say(f"local cluster '{name}' keeps its GCS in {stale.gcs_store}: starting its head again on its ports, "
             "with its jobs and queue")
    else:
        _say(f"starting local cluster '{name}'{with_nodes} on 127.0.0.1 ...")
    started = local.start(name=name, num_cpus=num_cpus, auth=not no_auth, nodes=nodes, gcs_store=gcs_store)
    auth = f"token auth on (token file {started.token_file})" if started.token_file else "no authentication"
    _say(f"local cluster '{name}' is up at {started.dashboard_url}{with_nodes}; {auth}")
    if started.gcs_store:
        _say(f"its GCS is kept in {started.gcs_store} (namespace {started.storage_namespace}): if its head dies, "
             f"`rayjobs cluster up{'' if name == local.DEFAULT_CLUSTER_NAME else ' --name ' + name}` starts it again "
             "as it was")
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
    from runner.cli.render import nodes_text

    check_output(output)
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
    typer.echo(nodes_text(nodes, nodes_error))


def ensure_local_cluster(name: str) -> None:
    """Start the named local cluster unless it runs; a failed start ends the command like `cluster up` (exit 4)."""
    from runner import local

    if local.find_running(name) is not None:
        return
    down = "rayjobs cluster down" + ("" if name == local.DEFAULT_CLUSTER_NAME else f" --name {name}")
    _say(f"no cluster running: starting local cluster '{name}' on 127.0.0.1 (stop it with `{down}`)")
    started = local.start(name=name)
    _say(f"local cluster '{name}' is up at {started.dashboard_url}")


def register(app: typer.Typer) -> None:
    """Add ``rayjobs cluster …`` to the ``rayjobs`` command."""
    app.add_typer(cluster_app, name="cluster")
