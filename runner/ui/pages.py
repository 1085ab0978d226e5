"""The pages: one HTML document per page, made from the templates in ``templates/``, with the style and the plain
JavaScript they share in ``static/`` (``app.css``, ``app.js``; no build step, nothing loaded from anywhere else),
so that they work offline, from ``rayjobs ui`` or opened from disk after ``--export``.

No script or style is inline, so the served pages' policy (:data:`CONTENT_SECURITY_POLICY`) allows scripts and
styles from the server alone, and an exported page's from the files beside it.

Served, a page asks the JSON API for its data (and again every few seconds while a run goes on); exported, its
data is in a ``<script type="application/json" id="data">`` block of the page itself, which no browser runs.
"""

from __future__ import annotations

import html
import json
import math
import string
from functools import cache
from importlib import resources
from typing import Any

# Everything a served page loads comes from its own server; it may not be framed, nor post anywhere else.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# An exported page's, in a <meta> tag (where frame-ancestors has no effect): its own files, nothing else.
EXPORTED_POLICY = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; base-uri 'none'"
REFRESH_S = 3
STATIC_FOLDER = "static"
# What the static folder may serve, by how a file's name ends; any other file there is not served.
CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def _package_file(*path: str) -> Any:
    return resources.files(__package__).joinpath(*path)


@cache
def _template(name: str) -> str:
    return _package_file("templates", f"{name}.html").read_text(encoding="utf-8")


@cache
def static_files() -> dict[str, str]:
    """The files of ``static/`` a page loads, each with its content type: the only ones the server serves."""
    return {entry.name: CONTENT_TYPES[suffix] for entry in _package_file(STATIC_FOLDER).iterdir()
            if entry.is_file() and (suffix := "." + entry.name.rpartition(".")[2]) in CONTENT_TYPES}


def static_file(name: str) -> bytes:
    """The bytes of one of :func:`static_files` (a name listed there, never a path)."""
    if name not in static_files():
        raise KeyError(name)
    return _package_file(STATIC_FOLDER, name).read_bytes()


def json_text(value: Any) -> str:
    """``value`` as JSON a browser parses: a number JSON has no word for (NaN, infinity, a loss that diverged) is
    written as text, where ``json.dumps`` would write a bare ``NaN`` that ``JSON.parse`` refuses."""
    return json.dumps(_finite(value), default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _document(page: str, title: str, *, run: str = "", embedded: Any = None, base: str = "") -> str:
    exported = embedded is not None
    data_block = ""
    if exported:
        # "</" would end the script block early; JSON reads "<\/" as "</".
        data_block = ('<script type="application/json" id="data">'
                      + json_text(embedded).replace("</", "<\\/") + "</script>\n")
    policy = f'<meta http-equiv="Content-Security-Policy" content="{EXPORTED_POLICY}">\n' if exported else ""
    return string.Template(_template("page")).substitute(
        policy=policy, title=html.escape(title), page=page, mode="export" if exported else "served",
        run=html.escape(run), base=html.escape(base), refresh=REFRESH_S,
        assets=html.escape(f"{base}{STATIC_FOLDER}/" if exported else f"/{STATIC_FOLDER}/"),
        home=html.escape(f"{base}index.html" if exported else "/"), body=_template(page), data=data_block)


def runs_page(embedded: Any = None) -> str:
    """The runs page; with ``embedded``, its data inside it (an exported page)."""
    return _document("runs", "Runs", embedded=embedded)


def run_page(name: str, embedded: Any = None, base: str = "") -> str:
    """One run's page; exported, ``base`` leads from it back to the export's top folder."""
    return _document("run", name, run=name, embedded=embedded, base=base)


def compare_page(embedded: Any = None) -> str:
    """The page of runs side by side (which runs: the page's ``run=`` query parameters)."""
    return _document("compare", "Compare", embedded=embedded)


def pipeline_page(run_id: str, embedded: Any = None, base: str = "") -> str:
    """A pipeline run's page: its jobs' graph, each job linked to its run's page; exported, ``base`` leads back to the
    export's top folder."""
    return _document("pipeline", f"pipeline {run_id}", run=run_id, embedded=embedded, base=base)
