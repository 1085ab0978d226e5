"""Word of how a job went, sent by the job itself: its spec's ``notify`` targets, through Apprise.

The run record's keeper (``supervisor.py``) calls these as the job starts, while it runs and when it has
ended, so the news goes out with nobody following the job (``--no-wait``, CI that has gone away, a
KubeRay RayJob). Every send is bounded (``SEND_BOUND_S`` for all targets of one event together) and
fail-soft: Apprise missing on the cluster, a closed port or a slow service cost the job that bound at
most and leave its result unchanged, with one line in its log. A notification URL is never printed
whole (it often holds a token), and every message is masked like the rest of the job's output.

Standard library only, but for Apprise, imported when a message is sent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from typing import Any, Mapping

from .causes import UNKNOWN, Diagnosis
from .masking import MASK
from .wording import format_duration, format_metrics
from .wire import OWN_LINE_PREFIX, NOTIFY_ENV_VAR, say

SEND_BOUND_S = 5.0
# The job's end, as the record names it, and the event a target's `on` names for it.
END_EVENTS = {"SUCCEEDED": "succeeded", "FAILED": "failed", "STOPPED": "stopped"}
# Schemes whose host is a server's name, not a token: shown with their host and port.
# (An ntfy topic is its password on a public server: not among them.)
_HOST_SCHEMES = frozenset({"json", "jsons", "xml", "xmls", "form", "forms", "mailto", "mailtos"})
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)


def masked_url(url: str) -> str:
    """``url`` safe to print: its scheme, and host and port only where they name a server, never a token
    (the client's ``jobs/notify.py`` uses this too)."""
    match = _URL.match(url.strip())
    if match is None:
        return MASK
    scheme = match["scheme"].lower()
    if scheme not in _HOST_SCHEMES:
        return f"{scheme}://{MASK}"
    authority, slash, path = match["rest"].partition("/")
    authority = authority.split("?", 1)[0]
    _user, at, host = authority.rpartition("@")
    shown = f"{scheme}://{MASK + '@' if at else ''}{host}"
    return shown + (f"/{MASK}" if (slash and path) or "?" in match["rest"] else "")


def notify_config(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The job's notify settings (``targets``, ``attempts``), or None when it has none."""
    text = environ.get(NOTIFY_ENV_VAR)
    if not text:
        return None
    try:
        config = json.loads(text)
        return {**config, "targets": [{"url": str(target["url"]), "on": list(target.get("on") or [])}
                                      for target in config["targets"]]}
    except Exception as exc:  # a notification is a courtesy: the job runs whatever is wrong here
        _say(f"notifications are off: their settings could not be read ({type(exc).__name__})")
        return None


def notify_end(config: dict[str, Any] | None, status: str, exit_code: int | None, duration_s: float,
               summary: dict[str, Any] | None = None, *, environ: Mapping[str, str] | None = None,
               bound_s: float = SEND_BOUND_S) -> list[dict[str, Any]]:
    """Tell the targets that want it how the job ended.

    Args:
        config: :func:`notify_config`'s settings (None: nothing is sent).
        status: SUCCEEDED, FAILED or STOPPED.
        exit_code: the entrypoint's exit code.
        duration_s: how long the job ran.
        summary: what else the message says, each optional: ``name``, ``submission_id``, ``attempt``,
            ``metrics`` and ``iteration`` (the last report's), ``cause`` (the failure in words), ``record``
            (where the run record is).
        environ: where secrets are read for masking (default: this process's environment).
        bound_s: the longest the sends may take together.

    Returns:
        One entry per target asked: its masked URL, the event, and whether it was sent (else ``error``).
    """
    event = END_EVENTS.get(status)
    if config is None or event is None:
        return []
    summary = summary or {}
    name = summary.get("name") or "job"
    lines = [f"{name} {status} after {format_duration(duration_s)}"
             + (f" (exit code {exit_code})" if exit_code not in (None, 0) else "") + _attempt_words(summary, config)]
    if summary.get("cause"):
        lines.append(f"cause: {summary['cause']}")
    if summary.get("metrics"):
        lines.append(f"metrics: {format_metrics(summary['metrics'])}"
                     + (f" (iteration {summary['iteration']})" if summary.get("iteration") is not None else ""))
    lines += _where_lines(summary)
    return send(config, event, f"{OWN_LINE_PREFIX}{name} {status}", "\n".join(lines), environ=environ, bound_s=bound_s)


def notify_retry(config: dict[str, Any] | None, summary: dict[str, Any], previous: dict[str, Any] | None = None, *,
                 environ: Mapping[str, str] | None = None, bound_s: float = SEND_BOUND_S) -> list[dict[str, Any]]:
    """Tell the targets that want ``retry`` that this attempt (``summary['attempt']`` > 1) follows a failed one."""
    if config is None or int(summary.get("attempt") or 1) <= 1:
        return []
    name = summary.get("name") or "job"
    before = previous or {}
    cause = (before.get("cause") or {}).get("cause")
    said = (f" ({cause if cause and cause != UNKNOWN else before.get('status')}, exit code {before.get('exit_code')})"
            if before.get("status") else "")
    lines = [f"{name}: attempt {int(summary['attempt']) - 1} failed{said}; attempt {summary['attempt']}"
             f"{_of_attempts(config)} has started"] + _where_lines(summary)
    return send(config, "retry", f"{OWN_LINE_PREFIX}{name} retried", "\n".join(lines), environ=environ, bound_s=bound_s)


def notify_stalled(config: dict[str, Any] | None, silent_s: float, summary: dict[str, Any], *,
                   environ: Mapping[str, str] | None = None, bound_s: float = SEND_BOUND_S) -> list[dict[str, Any]]:
    """Tell the targets that want ``stalled`` that the job has printed and reported nothing for ``silent_s``."""
    name = summary.get("name") or "job"
    lines = [f"{name} has printed nothing and reported no progress for {format_duration(silent_s)}; it is left "
             "running (its stacks: rayjobs stack JOB_ID)"] + _where_lines(summary)
    return send(config, "stalled", f"{OWN_LINE_PREFIX}{name} stalled", "\n".join(lines), environ=environ, bound_s=bound_s)


def send(config: dict[str, Any] | None, event: str, title: str, body: str, *,
         environ: Mapping[str, str] | None = None, bound_s: float = SEND_BOUND_S) -> list[dict[str, Any]]:
    """Send ``title`` and ``body`` (masked) to every target whose ``on`` names ``event``, all within ``bound_s``.

    Never raises: a target that fails or does not answer in time gets one line in the log.
    """
    targets = [target for target in (config or {}).get("targets", []) if event in target.get("on", [])]
    if not targets:
        return []
    try:
        mask = _secret_mask(os.environ if environ is None else environ)
        title, body = mask(title), mask(body)
    except Exception:  # masking must not cost the message; the URLs' passwords are masked below regardless
        title, body = _mask_passwords(title), _mask_passwords(body)
    outcomes: list[str | None] = ["no answer within {:g}s".format(bound_s)] * len(targets)
    capture = _ApprisesWarnings()
    deadline = time.monotonic() + bound_s
    threads = [threading.Thread(target=_send_one, args=(target["url"], title, body, outcomes, index, capture),
                                daemon=True, name=f"rayjobs-notify-{index}") for index, target in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    capture.close()
    results = []
    for target, error in zip(targets, outcomes):
        shown = masked_url(target["url"])
        if error is not None:
            error = _mask_passwords(error)
            _say(f"notification to {shown} failed: {error}; the job's result is unchanged")
        results.append({"url": shown, "event": event, "sent": error is None, **({"error": error} if error else {})})
    return results


class JobNotifier:
    """The notify settings of the job this process runs, tied to its run record's keeper (``recorder.Recorder``).

    ``supervisor.py`` calls :meth:`started` once the record has read the earlier attempts (and as each retry in
    place starts), :meth:`stalled` when the agent's watch says so, and :meth:`ended` before the record's final
    uploads. A failed send is also kept in ``run.json``'s notes.
    """

    def __init__(self, config: dict[str, Any], recorder: Any = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.recorder = recorder
        self.environ = os.environ if environ is None else environ
        self.sent: list[dict[str, Any]] = []

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], recorder: Any = None) -> JobNotifier | None:
        """The job's notifier, started (a retried attempt says so at once); None when its spec has no notify."""
        config = notify_config(environ)
        if config is None:
            return None
        try:
            notifier = cls(config, recorder, environ)
        except Exception as exc:  # the job runs on without notifications
            _say(f"notifications are off ({type(exc).__name__}); the job's result is unchanged")
            return None
        notifier.started()
        return notifier

    def started(self) -> None:
        """Send ``retry`` when this attempt follows a failed one."""
        self._safely(self._started)

    def stalled(self, silent_s: float) -> None:
        """Send ``stalled``: the agent's watch decided the job has been silent past its limit."""
        self._safely(lambda: self._keep(notify_stalled(self.config, silent_s, self.summary(), environ=self.environ)))

    def ended(self, status: str, exit_code: int | None, diagnosis: Diagnosis | None = None) -> None:
        """Send the job's end (SUCCEEDED, FAILED or STOPPED) to the targets that want it, with the cause the
        agent decided for its last attempt (the same the record and ``rayjobs status`` show)."""
        self._safely(lambda: self._ended(status, exit_code, diagnosis))

    def _safely(self, step: Any) -> None:
        try:
            step()
        except Exception as exc:  # a bug here must cost the job nothing but this line
            _say(f"notifications failed ({type(exc).__name__}: {_mask_passwords(str(exc))[:200]}); the job's result "
                 "is unchanged")

    def _started(self) -> None:
        attempts = self._document().get("attempts") or []
        previous = attempts[-2] if len(attempts) > 1 else None
        self._keep(notify_retry(self.config, self.summary(), previous, environ=self.environ))

    def _ended(self, status: str, exit_code: int | None, diagnosis: Diagnosis | None) -> None:
        started = (self._document().get("attempts") or [{}])[-1].get("started")
        duration_s = time.time() - started if started else 0.0
        summary = self.summary()
        if status == "FAILED" and diagnosis is not None:
            summary["cause"] = cause_words(diagnosis)
        self._keep(notify_end(self.config, status, exit_code, duration_s, summary, environ=self.environ))

    def summary(self) -> dict[str, Any]:
        """What a message says of the run, from its record as of now."""
        document = self._document()
        attempt = (document.get("attempts") or [{}])[-1]
        return {
            "name": document.get("name"), "submission_id": attempt.get("submission_id"),
            "attempt": attempt.get("attempt") or 1, "record": document.get("run_dir"),
            "metrics": document.get("metrics"), "iteration": document.get("iterations"),
        }

    def _document(self) -> dict[str, Any]:
        # run.json as it would be written now: the record's own account of the run, whatever keeps it.
        try:
            return self.recorder.run_document("RUNNING", None) if self.recorder is not None else {}
        except Exception:
            return {}

    def _keep(self, results: list[dict[str, Any]]) -> None:
        self.sent += results
        note = getattr(self.recorder, "note", None)
        for result in results:
            if not result["sent"] and note is not None:
                note(f"notification ({result['event']}) to {result['url']} failed: {result['error']}")


def cause_words(diagnosis: Diagnosis) -> str:
    """A failure's cause in a message: its name and what it says, or, for one no cause explains, the last
    exception its log names."""
    if diagnosis.cause == UNKNOWN:
        return diagnosis.evidence or diagnosis.text
    return f"{diagnosis.cause}: {diagnosis.text}"


def _send_one(url: str, title: str, body: str, outcomes: list[str | None], index: int,
              capture: _ApprisesWarnings) -> None:
    try:
        import apprise
    except ImportError:
        outcomes[index] = "Apprise is not installed on the cluster (add apprise to runtime_env.pip, or to the image)"
        return
    try:
        sender = apprise.Apprise()
        if not sender.add(url):
            outcomes[index] = "Apprise does not read this URL"
            return
        sent = sender.notify(title=title, body=body)
        outcomes[index] = None if sent else (_said_by(sent) or capture.last() or "the service refused it")
    except Exception as exc:
        outcomes[index] = f"{type(exc).__name__}: {exc}"


def _said_by(result: Any) -> str | None:
    """The last warning Apprise kept with a send's result (Apprise 2 keeps them; 1.x returns a bare bool)."""
    try:
        warnings = [entry.message for entry in result.logs() if entry.level in ("WARNING", "ERROR", "CRITICAL")]
    except Exception:
        return None
    return warnings[-1] if warnings else None


class _ApprisesWarnings(logging.Handler):
    """Apprise 1.x says why a send failed only in its log: its last warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None
        self.logger = logging.getLogger("apprise")
        self.level_before = self.logger.level
        # Attached, it also keeps Apprise's own warnings (hosts, paths) out of the job's log.
        self.logger.addHandler(self)
        if self.logger.level in (logging.NOTSET,) or self.logger.level > logging.WARNING:
            self.logger.setLevel(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()

    def last(self) -> str | None:
        return self.message

    def close(self) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
        super().close()


def _secret_mask(environ: Mapping[str, str]) -> Any:
    from .masking import environment_mask

    return environment_mask(environ).mask_text


def _mask_passwords(text: str) -> str:
    try:
        from .masking import mask_url_userinfo
    except ImportError:
        return re.sub(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@]+@", r"\1" + MASK + "@", text)
    return mask_url_userinfo(text)


def _attempt_words(summary: dict[str, Any], config: dict[str, Any]) -> str:
    attempt = int(summary.get("attempt") or 1)
    return f", attempt {attempt}{_of_attempts(config)}" if attempt > 1 or int(config.get("attempts") or 1) > 1 else ""


def _of_attempts(config: dict[str, Any]) -> str:
    most = int(config.get("attempts") or 1)
    return f" of up to {most}" if most > 1 else ""


def _where_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    if summary.get("record"):
        lines.append(f"record: {summary['record']}")
    if summary.get("submission_id"):
        lines.append(f"job: {summary['submission_id']}")
    return lines


_say = say
