"""Masking secrets by value in whatever rayjobs writes or prints: logs, run records, specs, job info.

A secret is registered once, by its value, and every occurrence of that value is replaced by ``***``
wherever it turns up (a driver log line, an entrypoint argument, a JSON document), the way CI systems
mask their registered secrets in every log line. The password (or bare token) of any URL written as
``scheme://user:password@host`` is masked too, registered or not.

Which values are secret is one rule, here, for every side: the variables the spec names in
``secret_env_vars`` and every variable whose name looks secret (:func:`secret_names`). On the cluster
that rule is applied to the whole environment of the job's process (:func:`environment_mask`), so a
secret the node itself holds (``AWS_SECRET_ACCESS_KEY``) is masked in the run record, in notifications
and in MLflow as it is in the log; the client applies it to the variables it sends. A notification URL
counts with the parts of it that are tokens, so that one printed alone is masked too.

Standard library only: this module runs first in every job on the cluster (the run record's keeper
masks the log it copies) and is imported by the client as well, so both sides mask by one rule.
"""

from __future__ import annotations

import json
import re
from typing import Any, AnyStr, Iterable, Iterator, Mapping
from urllib.parse import quote, urlsplit

from .wire import METADATA_SECRETS, NOTIFY_ENV_VAR, job_metadata

# What a secret becomes wherever it is shown: its value in a log or an argument, the value of a secret
# variable in a copy of a spec or a job's info, the password of a URL, the token of a notification URL.
MASK = "***"
_MASK_BYTES = MASK.encode()
# What records written by earlier versions hold in place of a secret variable's value and of a notification URL's
# token: read as a mask still (`rayjobs rerun` of such a record takes the value from the environment).
_EARLIER_MASKS = frozenset({"****"})
# Shorter values are not masked: a secret of one to three characters is no secret, and masking every
# "1", "on" or "dev" a job prints would make its output unreadable while protecting nothing.
MIN_SECRET_CHARS = 4
# Nor is a switch: a name can look secret and hold one (TOKENIZERS_PARALLELISM=false), and masking every
# "false" in a log would hide nothing.
_SWITCH_WORDS = frozenset({"true", "false", "yes", "none", "null", "enabled", "disabled"})

# Names that say their variable holds a secret.
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|_KEY$|^KEY$|AUTH)", re.IGNORECASE
)
# ... unless the name says its value is where or how, not what: RAY_AUTH_TOKEN_PATH holds a path, RAY_AUTH_MODE a
# word ("token") that a mask would then hide in every line of every log.
_NOT_A_SECRET = re.compile(r"_(PATH|FILE|DIR|MODE|SOCK|TYPE)$", re.IGNORECASE)
# A part of a notification URL (a path segment, a query value) counts as its token when it is this long and holds a
# digit, or is long enough to be one anyway: Slack's T…/B…/XXXX are, "services" and "hooks" are not.
_TOKEN_PART_CHARS = 8
_LONG_PART_CHARS = 16

# ``scheme://userinfo@``: the userinfo runs to the last ``@`` of the authority. Quotes, backslashes and
# angle brackets end it, so that a URL inside JSON or markup never swallows the text around it.
# A scheme is taken from the start of its word only: a regex that tried every letter of a long word (a
# base64 blob) as a start would take time that grows with the square of its length.
_SCHEME = r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]+://"
_AUTHORITY_CHARS = r"[^\s/?#\"'<>\\`]"
_URL_USERINFO = re.compile(rf"({_SCHEME})({_AUTHORITY_CHARS}+)@")
_URL_USERINFO_BYTES = re.compile(_URL_USERINFO.pattern.encode())
# A URL whose authority has not ended yet at the end of a piece of streamed text: its password may still
# be arriving.
_URL_UNFINISHED = re.compile(rf"{_SCHEME}{_AUTHORITY_CHARS}*\Z")
_URL_UNFINISHED_BYTES = re.compile(_URL_UNFINISHED.pattern.encode())
# The end of streamed text that may be the scheme of a URL whose "://" comes in the next piece. It is shown
# at once (a scheme is no secret) and kept to read the next piece with.
_SCHEME_SO_FAR = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]*(?::/{0,2})?\Z")
_SCHEME_SO_FAR_BYTES = re.compile(_SCHEME_SO_FAR.pattern.encode())
_MAX_SCHEME_CHARS = 256
# An unfinished URL is held back at most this long; past it, the text is released as it is.
_MAX_HELD_URL_CHARS = 4096


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name suggests its value is a secret."""
    return bool(SECRET_NAME.search(name)) and not _NOT_A_SECRET.search(name)


def secret_names(variables: Iterable[str], marked: Iterable[str]) -> list[str]:
    """The variables of ``variables`` that hold secrets: those ``marked`` (a spec's ``secret_env_vars``) and those
    whose names look secret."""
    marked = set(marked)
    return [name for name in variables if name in marked or looks_secret(name)]


def is_masked(value: Any) -> bool:
    """Whether ``value`` is what masking left in place of a secret (this version's mask, or an earlier one's)."""
    return isinstance(value, str) and (value == MASK or value in _EARLIER_MASKS)


def marked_names(metadata: Mapping[str, Any]) -> list[str]:
    """The spec's ``secret_env_vars`` as a job's metadata carries them (one comma-separated value)."""
    return [name.strip() for name in str(metadata.get(METADATA_SECRETS) or "").split(",") if name.strip()]


def marked_in_job_config(environ: Mapping[str, str]) -> list[str]:
    """The spec's ``secret_env_vars``, from the job config Ray hands every process of the job (its metadata)."""
    return marked_names(job_metadata(environ))


def environment_mask(environ: Mapping[str, str]) -> SecretMask:
    """The mask of a job's process on the cluster: every secret of its environment, by the one rule."""
    return SecretMask.from_environ(environ, secret_names(environ, marked_in_job_config(environ)))


def url_secrets(url: str) -> list[str]:
    """A notification URL's secret parts: the URL, all that follows its host (or its scheme, where the host itself is
    a token), and each path segment or query value that looks like a token."""
    found = [url]
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return found
    after_scheme = url.split("://", 1)[1] if "://" in url else url
    tail = after_scheme[len(parts.netloc):] if parts.scheme in ("http", "https", "json", "jsons", "xml", "xmls",
                                                                  "form", "forms") else after_scheme
    found.append(tail.lstrip("/"))
    pieces = [*re.split(r"[/?&#@:]", after_scheme), *[value for _, _, value in
                                                      (pair.partition("=") for pair in parts.query.split("&"))]]
    found += [piece for piece in pieces if len(piece) >= _LONG_PART_CHARS
              or (len(piece) >= _TOKEN_PART_CHARS and any(char.isdigit() for char in piece))]
    return [value for value in dict.fromkeys(found) if value]


def secret_values(name: str, value: str) -> list[str]:
    """What a secret variable's value registers: the value, and for rayjobs' notification settings each URL's
    secret parts as well (a job that prints one URL alone, or its token alone, is masked too)."""
    if name != NOTIFY_ENV_VAR:
        return [value]
    try:
        urls = [str(target["url"]) for target in json.loads(value).get("targets") or []]
    except (ValueError, TypeError, KeyError, AttributeError):
        urls = []
    return [value, *(part for url in urls for part in url_secrets(url))]


def _mask_userinfo(match: re.Match) -> str:
    user, colon, _password = match[2].partition(":")
    return f"{match[1]}{user}:{MASK}@" if colon else f"{match[1]}{MASK}@"


def _mask_userinfo_bytes(match: re.Match) -> bytes:
    user, colon, _password = match[2].partition(b":")
    return match[1] + (user + b":" if colon else b"") + _MASK_BYTES + b"@"


def mask_url_userinfo(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` (and a bare ``scheme://token@``)
    replaced by ``***``; the user name and the rest of the URL are kept."""
    if "://" not in text:
        return text
    return _URL_USERINFO.sub(_mask_userinfo, text)


def cut_outside_url_userinfo(data: bytes, at: int) -> int:
    """The latest offset at or before ``at`` that does not fall inside a URL's ``scheme://user:password@``
    in ``data``: text cut there and masked in two pieces keeps the password masked, as it is whole."""
    for match in _URL_USERINFO_BYTES.finditer(data):
        if match.start() >= at:
            break
        if at < match.end():
            return match.start()
    return at


def mask_url_userinfo_bytes(data: bytes) -> bytes:
    """:func:`mask_url_userinfo` for bytes (a log that need not be valid UTF-8)."""
    if b"://" not in data:
        return data
    return _URL_USERINFO_BYTES.sub(_mask_userinfo_bytes, data)


def _written_forms(value: str) -> Iterator[str]:
    """The value, each of its lines, and the forms it takes inside JSON text and inside a URL."""
    yield value
    # A multi-line secret (a private key) is printed line by line as often as whole; a line redrawn after a carriage
    # return is read (by the judge) as it was last drawn.
    yield from re.split(r"[\r\n]+", value)
    yield json.dumps(value)[1:-1]
    yield quote(value, safe="")


class SecretMask:
    """Replaces every occurrence of known secret values (and any URL's password) with ``***``.

    Args:
        values: the secret values; those shorter than ``MIN_SECRET_CHARS``, and switches (``true``,
            ``false``, …), are left out.
    """

    def __init__(self, values: Iterable[str]) -> None:
        forms = {form for value in values if value and value.strip().lower() not in _SWITCH_WORDS
                 for form in _written_forms(value) if len(form) >= MIN_SECRET_CHARS}
        # Longest first: a secret that contains another is masked whole, not around the shorter one.
        self.values: tuple[str, ...] = tuple(sorted(forms, key=lambda form: (-len(form), form)))
        self._values_bytes = tuple(value.encode() for value in self.values)
        self._pattern = re.compile("|".join(map(re.escape, self.values))) if self.values else None
        self._pattern_bytes = (re.compile(b"|".join(re.escape(value) for value in self._values_bytes))
                               if self.values else None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, Any], names: Iterable[str]) -> SecretMask:
        """The values of the variables ``names`` that ``environ`` sets (names it does not set are skipped)."""
        return cls(value for name in names if isinstance(environ.get(name), str)
                   for value in secret_values(name, environ[name]))

    def __bool__(self) -> bool:
        """Whether any value is registered (URL passwords are masked either way)."""
        return bool(self.values)

    def mask_text(self, text: str) -> str:
        """``text`` with every registered value and every URL's password replaced by ``***``."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return mask_url_userinfo(text)

    def mask_bytes(self, data: bytes) -> bytes:
        """:meth:`mask_text` for bytes, matched as UTF-8 (bytes that are not valid UTF-8 are kept as they are)."""
        if self._pattern_bytes is not None:
            data = self._pattern_bytes.sub(_MASK_BYTES, data)
        return mask_url_userinfo_bytes(data)

    def stream(self, kind: type = str) -> MaskingStream:
        """A masker for a log that arrives in pieces split anywhere: text (``kind`` str, what the client prints)
        or bytes (``kind`` bytes, what the job's record keeps)."""
        return MaskingStream(self, kind)

    def hold_from(self, data: AnyStr) -> int:
        """Where the end of ``data`` (text or bytes) may be the start of a secret or of a URL's password, or falls
        inside a whole secret: the earliest such place, else ``len(data)``. What lies from there on waits for the
        next piece to show whether it is one; everything before it can be masked and released now."""
        if isinstance(data, str):
            return _hold_point(data, self.values, _URL_UNFINISHED, self._pattern)
        return _hold_point(data, self._values_bytes, _URL_UNFINISHED_BYTES, self._pattern_bytes)

    def _masked(self, data: AnyStr) -> AnyStr:
        return self.mask_text(data) if isinstance(data, str) else self.mask_bytes(data)


def _hold_point(text: Any, values: tuple[Any, ...], unfinished_url: re.Pattern, whole: re.Pattern | None) -> int:
    hold = len(text)
    for value in values:
        tail = text[-(len(value) - 1):] if len(value) > 1 else text[:0]
        first = value[:1]
        start = tail.find(first)
        while start != -1:
            if value.startswith(tail[start:]):
                hold = min(hold, len(text) - len(tail) + start)
                break
            start = tail.find(first, start + 1)
    unfinished = unfinished_url.search(text, max(0, len(text) - _MAX_HELD_URL_CHARS))
    if unfinished is not None:
        hold = min(hold, unfinished.start())
    if whole is not None:
        # Never between the start and end of a whole secret: hold back all of it.
        for match in whole.finditer(text):
            if match.start() >= hold:
                break
            if match.end() > hold:
                hold = match.start()
                break
    return hold


class MaskingStream:
    """Masks a log that arrives in pieces split anywhere, text or bytes: what it releases, joined, is the whole
    log masked at once, byte for byte; a secret split between two pieces is still masked whole.

    The one masker of both sides: the client prints through it, and the job's run record keeps the driver log
    through it. The end of a piece that could be the start of a secret, or a URL whose password may still be
    coming, is held back (:meth:`SecretMask.hold_from`) until the next piece (or :meth:`finish`) shows what it
    is. A URL's scheme is released at once (it is no secret) but remembered, so that a password whose ``://``
    comes in the next piece is still known to be one.
    """

    def __init__(self, mask: SecretMask, kind: type = str) -> None:
        self.mask = mask
        self._held: Any = kind()
        self._shown_scheme: Any = kind()  # the end of what was released, when it may be a URL's scheme
        self._scheme_so_far = _SCHEME_SO_FAR if kind is str else _SCHEME_SO_FAR_BYTES

    @property
    def held(self) -> int:
        """How much (characters or bytes) waits for the next piece."""
        return len(self._held)

    def feed(self, data: AnyStr) -> AnyStr:
        """The masked part of everything fed so far that can be released now."""
        before = self._shown_scheme
        pending = self._held + data
        hold = max(0, self.mask.hold_from(before + pending) - len(before))
        self._held = pending[hold:]
        shown = self._masked_after(before, pending[:hold])
        if shown:
            self._shown_scheme = self._scheme_so_far.search((before + shown)[-_MAX_SCHEME_CHARS:])[0]
        return shown

    def finish(self) -> Any:
        """What is still held back, masked: the log is over."""
        held, self._held = self._held, self._held[:0]
        return self._masked_after(self._shown_scheme, held)

    def _masked_after(self, shown: AnyStr, data: AnyStr) -> AnyStr:
        """``data`` masked as it reads after ``shown``, the scheme a URL in it may have started with."""
        if not data:
            return data
        masked = self.mask._masked(shown + data)
        # Masking only ever starts after a scheme's "://", so what was shown already comes back unchanged.
        return masked[len(shown):] if masked.startswith(shown) else self.mask._masked(data)
