"""Where the cluster is and how to talk to it: address, headers, TLS.

Precedence of the address, highest first:
``--address`` > ``--set address=…`` > the spec's ``address`` > ``$RAY_API_SERVER_ADDRESS``
> ``$RAY_ADDRESS`` > the local cluster started by ``rayjobs cluster up``.
(Ray's own CLI lets ``RAY_ADDRESS`` beat an explicit address; rayjobs does not.)

Headers, later ones winning: ``$RAY_JOB_HEADERS`` (JSON object) < ``--header 'Name: value'``.
A bearer token is added when none of those set ``Authorization``: from ``$RAY_AUTH_TOKEN``,
``$RAY_AUTH_TOKEN_PATH``, the local cluster's token file (for its own address), or
``~/.ray/auth_token`` when ``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from jobs.address import normalize_address
from runner.errors import BadInput, NoCluster


@dataclass
class Connection:
    """Everything needed to reach one cluster's job API. Never print ``headers``."""

    address: str
    source: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    verify: bool | str = True

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


def _token_for(address: str, local_token_file: str | None) -> str | None:
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


def resolve_connection(
    cli_address: str | None = None,
    spec_address: str | None = None,
    spec_address_source: str = "the spec",
    cli_headers: list[str] | None = None,
    verify: bool = True,
    ca_cert: str | None = None,
    cluster_name: str | None = None,
) -> Connection:
    """Decide which cluster to talk to, following the documented precedence."""
    from runner import cluster

    local = cluster.running_local_cluster(cluster_name or cluster.DEFAULT_CLUSTER_NAME)
    for value, source in (
        (cli_address, "--address"),
        (spec_address, spec_address_source),
        (os.environ.get("RAY_API_SERVER_ADDRESS"), "RAY_API_SERVER_ADDRESS"),
        (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
    ):
        if value:
            try:
                address, chosen = normalize_address(value), source
            except ValueError as exc:
                raise BadInput(str(exc)) from None
            break
    else:
        if local is None:
            raise NoCluster(
                "no cluster to talk to: give --address (or set RAY_ADDRESS / 'address' in the spec), "
                "or start a local one with `rayjobs cluster up` (or pass --local to `rayjobs submit`)"
            )
        address, chosen = local.dashboard_url, "local cluster"

    headers = _headers_from_env()
    for text in cli_headers or []:
        name, value = parse_header(text)
        headers[name] = value
    if not any(name.lower() == "authorization" for name in headers):
        local_token = local.token_file if local is not None and local.dashboard_url == address else None
        token = _token_for(address, local_token)
        if token:
            headers["Authorization"] = f"Bearer {token}"
    if ca_cert is not None and not Path(ca_cert).is_file():
        raise BadInput(f"--ca-cert {ca_cert!r} is not a file")
    return Connection(address=address, source=chosen, headers=headers, verify=ca_cert or verify)
