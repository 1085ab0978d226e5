"""Where the cluster is and how to talk to it: address, headers, TLS.

Precedence of the address, highest first:
``--address`` or ``--cluster NAME`` (given together, they must name the same cluster) > ``--set address=…``
> the spec's ``address`` > ``$RAYJOBS_CLUSTER`` > ``$RAY_API_SERVER_ADDRESS`` > ``$RAY_ADDRESS``
> the local cluster ``default`` started by ``rayjobs cluster up``.
(Ray's own CLI lets ``RAY_ADDRESS`` beat an explicit address; rayjobs does not.)

Headers, later ones winning: ``$RAY_JOB_HEADERS`` (JSON object) < ``--header 'Name: value'``.
A bearer token is added when none of those set ``Authorization``: from ``$RAY_AUTH_TOKEN``,
``$RAY_AUTH_TOKEN_PATH``, the token file of the local cluster that serves the address (however the
address was spelled or given), or ``~/.ray/auth_token`` when ``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.infra.address import dashboard_endpoint, normalize_address
from runner.errors import BadInput, NoCluster

if TYPE_CHECKING:
    from runner.local import LocalCluster


@dataclass
class Connection:
    """Everything needed to reach one cluster's job API. Never print ``headers``."""

    address: str
    source: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str = True
    # The rayjobs local cluster that serves ``address``, if any.
    local_cluster: str | None = None

    def __repr__(self) -> str:
        return f"Connection(address={self.address!r}, source={self.source!r}, headers=<{len(self.headers)} hidden>)"


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` → ``("Name", "value")``."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(ch.isspace() for ch in name.strip()):
        raise BadInput("--header expects 'Name: value', e.g. --header 'Authorization: Bearer …'")
    return name.strip(), value.strip()


def _headers_from_env() -> dict[str, str]:
    raw = os.environ.get("RAY_JOB_HEADERS")
    if not raw:
        return {}
    try:
        headers = json.loads(raw)
    except json.JSONDecodeError:
        raise BadInput("RAY_JOB_HEADERS must be a JSON object of header names to values, "
                       "e.g. '{\"Authorization\": \"Bearer …\"}'") from None
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise BadInput("RAY_JOB_HEADERS must be a JSON object whose values are strings")
    return {str(k): v for k, v in headers.items()}


def _token_for(local_token_file: str | None) -> str | None:
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        return token.strip()
    candidates = [os.environ.get("RAY_AUTH_TOKEN_PATH"), local_token_file]
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        candidates.append(str(Path.home() / ".ray" / "auth_token"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            try:
                return Path(candidate).read_text().strip() or None
            except OSError:
                continue
    return None


@dataclass(frozen=True)
class Target:
    """What the precedence picked: an address, or else the name of a local cluster."""

    address: str | None
    cluster_name: str | None
    source: str


def choose_target(
    cli_address: str | None = None,
    spec_address: str | None = None,
    spec_address_source: str = "the spec",
    cluster_name: str | None = None,
) -> Target:
    """Apply the documented precedence; reads the environment only, never a cluster."""
    from runner.local import DEFAULT_CLUSTER_NAME

    if cluster_name is not None and not cluster_name.strip():
        raise BadInput("--cluster needs the name of a local cluster (`rayjobs cluster up --name NAME`)")
    for address, name, source in (
        (cli_address, None, "--address"),
        (None, cluster_name, "--cluster"),
        (spec_address, None, spec_address_source),
        (None, os.environ.get("RAYJOBS_CLUSTER"), "RAYJOBS_CLUSTER"),
        (os.environ.get("RAY_API_SERVER_ADDRESS"), None, "RAY_API_SERVER_ADDRESS"),
        (os.environ.get("RAY_ADDRESS"), None, "RAY_ADDRESS"),
    ):
        if address or name:
            return Target(address or None, None if address else name, source)
    return Target(None, DEFAULT_CLUSTER_NAME, "local cluster")


def resolve_connection(
    cli_address: str | None = None,
    spec_address: str | None = None,
    spec_address_source: str = "the spec",
    cli_headers: list[str] | None = None,
    verify: bool = True,
    ca_cert: str | None = None,
    cluster_name: str | None = None,
) -> Connection:
    """Decide which cluster to talk to, following the documented precedence.

    Only reads the state of local clusters: nothing is started, stopped or cleaned up, even when a
    state file is stale, so any command may call it whatever cluster it talks to.
    """
    from runner import local

    target = choose_target(cli_address, spec_address, spec_address_source, cluster_name)
    if target.address is not None:
        address = _normalized(target.address)
        serving = local.find_serving(address)
        if cluster_name is not None and cli_address:
            _check_same_cluster(address, _running_cluster_named(cluster_name, "--cluster"), serving)
    else:
        serving = _running_cluster_named(target.cluster_name, target.source)
        address = serving.dashboard_url

    headers = _headers_from_env()
    for text in cli_headers or []:
        name, value = parse_header(text)
        headers[name] = value
    if not any(name.lower() == "authorization" for name in headers):
        token = _token_for(serving.token_file if serving is not None else None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
    if ca_cert is not None and not Path(ca_cert).is_file():
        raise BadInput(f"--ca-cert {ca_cert!r} is not a file")
    return Connection(address=address, source=target.source, headers=headers, verify=ca_cert or verify,
                      local_cluster=serving.name if serving is not None else None)


def _normalized(address: str) -> str:
    try:
        normalized = normalize_address(address)
        dashboard_endpoint(normalized)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return normalized


def _running_cluster_named(name: str, source: str) -> LocalCluster:
    from runner import local

    try:
        found = local.find_running(name)
    except local.InvalidClusterRequest as exc:
        raise BadInput(f"{source}: {exc}") from None
    if found is not None:
        return found
    others = local.list_running()
    running = ("Running local clusters: " + ", ".join(f"'{c.name}' at {c.dashboard_url}" for c in others) + "."
               if others else f"No local cluster is running under {local.rayjobs_home()}.")
    if source == "local cluster":
        pick = " Pick one with --cluster NAME." if others else ""
        raise NoCluster(
            "no cluster to talk to: give --address or --cluster (or set RAY_ADDRESS / RAYJOBS_CLUSTER / 'address' "
            "in the spec), or start a local one with `rayjobs cluster up` (or pass --local to `rayjobs submit`). "
            f"{running}{pick}")
    raise NoCluster(f"no local cluster '{name}' is running (named by {source}). {running} Start it with "
                    f"`rayjobs cluster up --name {name}`, or name a running one.")


def _check_same_cluster(address: str, named: LocalCluster, serving: LocalCluster | None) -> None:
    if serving is None or serving.name != named.name:
        raise BadInput(f"--cluster {named.name} and --address {address} name different clusters (local cluster "
                       f"'{named.name}' is at {named.dashboard_url}); give only one of them")
