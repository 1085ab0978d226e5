"""Loading ``rayjobs ui``'s pages in Debian's headless Chromium: the DOM after the page's scripts ran, what the
page's console printed, and screenshots, with no driver library (Chromium's own ``--dump-dom``, its log on stderr
and ``--screenshot``)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)"
# Nothing reaches beyond the page: no updates, no sync, no QUIC probes, no first-run dialogs.
_QUIET = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--hide-scrollbars")


def _chromium(url: str, *flags: str, budget_ms: int, timeout_s: float) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, NO_CHROMIUM
    with tempfile.TemporaryDirectory(prefix="rayjobs-chromium-") as profile:
        return subprocess.run([CHROMIUM, *_QUIET, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
                               *flags, url], capture_output=True, text=True, timeout=timeout_s, check=False)


def dom_after_scripts(url: str, budget_ms: int = 5000, timeout_s: float = 90) -> str:
    """The page's DOM once its scripts ran (and fetched what they fetch), serialised as HTML."""
    return dom_and_console(url, budget_ms, timeout_s)[0]


# Chromium's log line for a page's console message: ``[…:INFO:CONSOLE:1] "message", source: URL (line)``.
_CONSOLE_LINE = re.compile(r':CONSOLE(?:\(\d+\))?[^\]]*\] "(.*)", source: ')


def dom_and_console(url: str, budget_ms: int = 5000, timeout_s: float = 90) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran, and every message its console printed meanwhile: the page's own, and
    the browser's (a script or style the page's Content-Security-Policy refused, a script's uncaught error)."""
    done = _chromium(url, "--dump-dom", "--enable-logging=stderr", "--v=0", budget_ms=budget_ms,
                     timeout_s=timeout_s)
    assert done.stdout.strip(), f"chromium printed no DOM for {url}: {done.stderr[-2000:]}"
    return done.stdout, [match[1] for line in done.stderr.splitlines() if (match := _CONSOLE_LINE.search(line))]


def screenshot(url: str, path: Path, size: str = "1400,1000", budget_ms: int = 5000, timeout_s: float = 90) -> Path:
    """A PNG of the page as a window of ``size`` shows it, once its scripts ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _chromium(url, f"--screenshot={path}", f"--window-size={size}", budget_ms=budget_ms, timeout_s=timeout_s)
    assert path.exists(), f"chromium took no screenshot of {url}: {done.stderr[-2000:]}"
    return path


class Node:
    """One element of a dumped DOM: its tag, attributes and children, to query as a test reads a page."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    def text(self) -> str:
        """The text inside, as one string with runs of whitespace made one space."""
        pieces: list[str] = []

        def walk(node: Node) -> None:
            for child in node.children:
                if isinstance(child, str):
                    pieces.append(child)
                elif child.tag not in ("script", "style"):
                    walk(child)
        walk(self)
        return " ".join("".join(pieces).split())

    def all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        """Every element inside (at any depth) of ``tag`` whose attributes hold ``attrs`` (``class_`` for class:
        one of its classes)."""
        found: list[Node] = []
        for child in self.children:
            if isinstance(child, Node):
                if (tag is None or child.tag == tag) and all(
                        (value in child.attrs.get("class", "").split()) if key == "class_"
                        else child.attrs.get(key.replace("_", "-")) == value for key, value in attrs.items()):
                    found.append(child)
                found += child.all(tag, **attrs)
        return found

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        """The one element of ``tag`` with ``attrs``; fails when there is none or more than one."""
        found = self.all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag or '*'} {attrs}> in the page"
        return found[0]


_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


def parsed(dom: str) -> Node:
    """The dumped DOM as a tree of :class:`Node` (the standard library's parser; no lxml needed)."""
    import html.parser

    root = Node("#document", {}, None)

    class Builder(html.parser.HTMLParser):
        current = root

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            node = Node(tag, {key: value or "" for key, value in attrs}, self.current)
            self.current.children.append(node)
            if tag not in _VOID:
                self.current = node

        def handle_endtag(self, tag: str) -> None:
            node: Node | None = self.current
            while node is not None and node.tag != tag:
                node = node.parent
            if node is not None and node.parent is not None:
                self.current = node.parent

        def handle_data(self, data: str) -> None:
            self.current.children.append(data)

    builder = Builder(convert_charrefs=True)
    builder.feed(dom)
    return root


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A plain GET: status, headers and body, whatever the status."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@contextlib.contextmanager
def served(location: str, host: str = "127.0.0.1") -> Iterator[Any]:
    """``rayjobs ui``'s server over ``location`` in this process, on a free port; yields the server."""
    from runner.records.store import Folder
    from runner.ui.data import Records
    from runner.ui.server import make_server, serve_in_thread

    server = make_server(Records(Folder(location)), host, 0)
    serve_in_thread(server)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
