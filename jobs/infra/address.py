"""The one rule for a cluster address: the dashboard over http(s)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from rayjobs_agent.storage_location import uri_scheme

# Names that reach this machine's loopback interface, where local clusters listen.
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "localhost.localdomain"})


def normalize_address(address: str) -> str:
    """``host:port`` → ``http://host:port``; ``http(s)://`` addresses are kept.

    Raises:
        ValueError: another scheme, or no host.

    Plain Python on purpose: the CLI calls it on paths that must not import pydantic.
    """
    address = address.strip().rstrip("/")
    if uri_scheme(address) is None:
        address = "http://" + address
    scheme = uri_scheme(address) or ""
    rest = address[len(scheme) + 3:]
    if scheme.lower() not in ("http", "https"):
        hint = " (ray:// is the Ray Client port; jobs go to the dashboard, usually http://host:8265)" \
            if scheme.lower() == "ray" else ""
        raise ValueError(f"address {address!r} has scheme {scheme!r}; rayjobs talks to the dashboard over "
                         f"http:// or https://{hint}")
    if not rest or rest.startswith((":", "/")):
        raise ValueError(f"address {address!r} has no host")
    return f"{scheme.lower()}://{rest}"


def dashboard_endpoint(address: str) -> tuple[str, int]:
    """The (host, port) an address reaches, so that two spellings of one dashboard compare equal.

    The scheme and a trailing slash do not matter, ``localhost`` is ``127.0.0.1``, and a missing
    port is the scheme's default. ValueError as for ``normalize_address``, or for a bad port.
    """
    parts = urlsplit(normalize_address(address))
    host = (parts.hostname or "").lower()
    if host in _LOOPBACK_NAMES:
        host = "127.0.0.1"
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` is this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
