"""The one place rayjobs makes an HTTP request, and its proxy rules.

Every REST call to a dashboard (``JobsApi``) and every health check of a local cluster comes
through :func:`fetch`. Loopback never goes through a proxy: a corporate ``HTTP_PROXY`` without a
``NO_PROXY`` must not send requests for 127.0.0.1 to a proxy that cannot reach this machine.
Other hosts follow the environment's proxy settings, and a failure while a proxy was in the way
says so, since it is then the first thing to check.
"""

from __future__ import annotations

import http.client
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobs.infra.address import is_loopback_host

_NO_PROXY_FOR_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Answer:
    """A server's answer: its status and body (an error status is an answer too)."""

    status: int
    body: bytes
    reason: str = ""


class Unanswered(OSError):
    """No answer: refused, reset, timed out, cut off mid-answer, or a TLS failure; ``reason`` says which."""

    def __init__(self, reason: BaseException | str, proxy: str | None) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.proxy = proxy

    def proxy_note(self) -> str:
        """`` (through the proxy at …)`` when a proxy was in the way, else ``""``."""
        if self.proxy is None:
            return ""
        return (f" (through the proxy at {self.proxy}, from the environment's HTTP(S)_PROXY; if the cluster is "
                "reachable directly, add its host to NO_PROXY)")


def proxy_for(url: str) -> str | None:
    """The proxy a request for ``url`` goes through under these rules (None: straight to the host)."""
    parts = urlsplit(url)
    if is_loopback_host(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme)
    if proxy is None or urllib.request.proxy_bypass(parts.netloc):
        return None
    return proxy


def fetch(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None,
          timeout_s: float | None = 10.0, ssl_context: ssl.SSLContext | None = None) -> Answer:
    """Send one request and return the answer, whatever its status.

    Raises:
        Unanswered: no (complete) answer came; it names the proxy that was in the way, if any.
    """
    proxy = proxy_for(url)
    scheme = urlsplit(url).scheme
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({scheme: proxy} if proxy else {})]
    if ssl_context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return Answer(response.status, response.read(), response.reason or "")
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read()
        except (OSError, http.client.HTTPException):
            text = b""
        return Answer(exc.code, text, str(exc.reason or ""))
    except http.client.HTTPException as exc:
        raise Unanswered(exc, proxy) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unanswered(getattr(exc, "reason", exc), proxy) from None


def bypass_proxy_for_loopback(env: dict[str, str] | os._Environ = os.environ) -> None:
    """Add loopback to ``NO_PROXY`` in ``env``, for libraries that read it (``requests``, in Ray's job client)."""
    for name in ("NO_PROXY", "no_proxy"):
        listed = [entry.strip() for entry in env.get(name, "").split(",") if entry.strip()]
        missing = [host for host in _NO_PROXY_FOR_LOOPBACK if host not in listed]
        if missing:
            env[name] = ",".join(listed + missing)


def through_proxy_note(url: str) -> str:
    """`` (through the proxy …)`` when a request to ``url`` goes through a proxy, else ""."""
    proxy = proxy_for(url)
    return Unanswered("", proxy).proxy_note() if proxy else ""


def ssl_context_for(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of a connection: verified by the system's CAs, by a CA bundle file, or not at all (False)."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()
