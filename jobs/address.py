"""The one rule for a cluster address: the dashboard over http(s)."""

from __future__ import annotations


def normalize_address(address: str) -> str:
    """``host:port`` → ``http://host:port``; ValueError for other schemes or no host.

    Plain Python on purpose: the CLI calls it on paths that must not import pydantic.
    """
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = "http://" + address
    scheme, rest = address.split("://", 1)
    if scheme.lower() not in ("http", "https"):
        hint = " (ray:// is the Ray Client port; jobs go to the dashboard, usually http://host:8265)" \
            if scheme.lower() == "ray" else ""
        raise ValueError(f"address {address!r} has scheme {scheme!r}; rayjobs talks to the dashboard over "
                         f"http:// or https://{hint}")
    if not rest or rest.startswith((":", "/")):
        raise ValueError(f"address {address!r} has no host")
    return f"{scheme.lower()}://{rest}"
