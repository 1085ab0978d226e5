"""A spec's ``notify`` block: where the job itself says how it ended (Apprise URLs), and when.

Checked on the client like the rest of the spec. The job sends the messages from its own wrapper
(``rayjobs_agent/notify.py``), so they arrive with nobody following it. Notification URLs
often hold tokens (a Slack webhook's path, a password in ``mailto://``): :func:`masked_notify_url` is
how one is shown anywhere, the run record included.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, field_validator

from jobs.errors import did_you_mean
from rayjobs_agent.storage_location import uri_scheme
from jobs.secrets import MASK
from jobs.strict import StrictModel
from rayjobs_agent.notify import masked_url
from rayjobs_agent.wire import ray_env_json

INSTALL_APPRISE = "pip install 'rayjobs[notify]'"
NOTIFY_EVENTS = ("succeeded", "failed", "stopped", "stalled", "retry")
# The news worth interrupting someone for; a quiet success is in the run record.
DEFAULT_NOTIFY_ON = ("failed", "stopped")
NotifyEvent = Literal["succeeded", "failed", "stopped", "stalled", "retry"]

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)


def masked_notify_url(url: str) -> str:
    """``url`` safe to print: the scheme, and the host and port only where they name a server; never a token.

    ``json://user:pass@host:8080/hook`` → ``json://***@host:8080/***``; ``slack://T1/B2/C3`` → ``slack://***``.
    The job masks the URLs it names in its log by the same rule: one function serves both sides.
    """
    return masked_url(url)


@lru_cache(maxsize=1)
def apprise_schemes() -> frozenset[str]:
    """Every URL scheme the installed Apprise can send to (imports it: about a second, once)."""
    from apprise.manager_plugins import NotificationManager

    return frozenset(scheme.lower() for scheme in NotificationManager().schemas() or ())


class NotifyTarget(StrictModel):
    """One place the job's news goes, and which news."""

    url: str = Field(description="An Apprise URL: slack://…, msteams://…, discord://…, mailto://user:pass@host, "
                     "ntfy://topic, json://host:port/path (a JSON webhook), and every other service Apprise knows. "
                     "Never printed whole: rayjobs shows the scheme, and the host only of a server's address.")
    on: list[NotifyEvent] = Field(
        default_factory=lambda: list(DEFAULT_NOTIFY_ON), min_length=1,
        description="When: succeeded, failed, stopped (the job's end), stalled (its log silent for stall_after_s), "
        "retry (an attempt failed and the next started). Default: failed and stopped.")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        match = _URL.match(value.strip())
        if match is None or not match["rest"]:
            raise ValueError("is not a notification URL: write SCHEME://… as Apprise reads it, e.g. "
                             "slack://TOKEN_A/TOKEN_B/TOKEN_C or json://host:port/path")
        if MASK in value:
            raise ValueError(f"holds a masked value ({MASK}): run records keep no notification URLs; put the real "
                             "URL back (e.g. --set notify=…)")
        if importlib.util.find_spec("apprise") is None:
            raise ValueError(f"needs Apprise to check the URL, which is not installed here: {INSTALL_APPRISE} (the "
                             "cluster needs it as well, e.g. in runtime_env.pip)")
        scheme = match["scheme"].lower()
        known = apprise_schemes()
        if scheme not in known:
            raise ValueError(f"{scheme}:// is not a scheme Apprise sends to{did_you_mean(scheme, known)}; see "
                             "https://github.com/caronc/apprise/wiki for every service's URL")
        return value.strip()


def notify_document(targets: list[NotifyTarget], *, masked: bool) -> list[dict[str, object]]:
    """The targets as the job reads them (``masked=False``) or as they are shown (``masked=True``)."""
    return [{"url": masked_notify_url(target.url) if masked else target.url, "on": list(target.on)}
            for target in targets]


def job_notify_settings(targets: list[NotifyTarget], attempts: int) -> str:
    """The value of ``rayjobs_agent.wire.NOTIFY_ENV_VAR`` (a name every output masks, and the URLs' tokens with it):
    the targets in full, and how many attempts may run."""
    return ray_env_json({"targets": notify_document(targets, masked=False), "attempts": attempts})


def unsent_notifications(spec: Any) -> str | None:
    """Why a spec's ``notify`` block would send nothing, or None when the job will send it.

    The job's run-record keeper sends the notifications, and only a job that uploads code and keeps its
    record runs under it: any other would silently send nothing.
    """
    if not spec.notify:
        return None
    if not spec.record:
        return ("notify needs the run record: the job sends its notifications from the wrapper that keeps it, "
                "and record is false; remove notify or set record: true")
    runtime_env = spec.runtime_env
    paths = [runtime_env.working_dir, *(runtime_env.py_modules or [])] if runtime_env is not None else []
    if not any(path and uri_scheme(path) is None for path in paths) and spec.record_path is None \
            and spec.queue is None:
        return ("notify needs the run record's keeper, which a job gets when it uploads code (a local "
                "runtime_env.working_dir or py_modules) or names where its record goes (record_path); this spec "
                "does neither, so nothing would be sent")
    return None
