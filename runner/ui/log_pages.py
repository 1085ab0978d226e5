"""A saved log read a page at a time, by byte range from the record's parts, and searched line by line.

A log may be hundreds of megabytes (parts of 8 MiB each, in a folder or in S3): no page, search or export
holds more than one part of it in memory, and a browser is only ever sent one page.

The page shows the job's own lines: Ray's colour codes are taken out, and so are the agent's event lines
(``rayjobs-event {…}``, what the page draws as curves and decisions), which are no line of the job's. A page is
still addressed by its byte range in the saved log, which keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from rayjobs_agent.masking import cut_outside_url_userinfo
from rayjobs_agent.ray_lines import ANSI_ESCAPE
from rayjobs_agent.record_layout import log_folder
from rayjobs_agent.vocabulary import EVENT_MARKER, decode
from runner.records.report import masked_log
from runner.records.store import Folder

PAGE_BYTES = 256 * 1024
# A page ends at the first line start past its size; a line this much longer is cut where the page ends.
_LINE_SLACK = 64 * 1024
# How far around a cut inside a long line a URL is looked for (beyond the longest URL the masker holds back).
_URL_CONTEXT_BYTES = 8 * 1024
# A search answers with this many lines at most, so that a word found on every line is still one small answer.
MAX_MATCHES = 200


class Part(NamedTuple):
    """One part of a saved log: where it is inside the run's folder, where it starts in the log, its size."""

    name: str
    start: int
    size: int


def log_parts(folder: Folder, submission_id: str) -> list[Part]:
    """The parts of one attempt's saved log, in order, with their sizes (one listing, no part read)."""
    directory = log_folder(submission_id)
    parts, start = [], 0
    for name, size in folder.file_sizes(directory):
        parts.append(Part(f"{directory}/{name}", start, size))
        start += size
    return parts


def log_size(parts: list[Part]) -> int:
    """The log's length in bytes."""
    return parts[-1].start + parts[-1].size if parts else 0


def page_count(parts: list[Part]) -> int:
    """How many pages the log has (one, empty, when nothing was saved)."""
    return max(1, -(-log_size(parts) // PAGE_BYTES))


def read_range(folder: Folder, parts: list[Part], start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the log, read from the parts they fall in and nothing else."""
    chunks = []
    for part in parts:
        low, high = max(start, part.start), min(end, part.start + part.size)
        if low < high:
            chunks.append(folder.read_range(part.name, low - part.start, high - low))
    return b"".join(chunks)


def shown_line(line: str) -> str | None:
    """A line of the saved log as the page shows it, its colour codes taken out; None for the agent's event
    line, which is no line of the job's. Not yet masked."""
    plain = ANSI_ESCAPE.sub("", line) if "\x1b" in line else line
    if EVENT_MARKER in plain and decode(plain) is not None:
        return None
    return plain


def shown_text(raw: bytes) -> str:
    """A piece of the saved log (whole lines) as the page shows it: :func:`shown_line` for each, masked."""
    *lines, last = raw.decode("utf-8", errors="replace").split("\n")
    shown = [line + "\n" for line in map(shown_line, lines) if line is not None]
    if (tail := shown_line(last)) is not None:
        shown.append(tail)
    return masked_log("".join(shown))


def _page_start(folder: Folder, parts: list[Part], page: int) -> int:
    """Where page ``page`` starts: the first line that starts at or after ``page * PAGE_BYTES``."""
    size = log_size(parts)
    at = page * PAGE_BYTES
    if page <= 0:
        return 0
    if at >= size:
        return size
    window = read_range(folder, parts, at - 1, min(size, at + _LINE_SLACK))
    newline = window.find(b"\n")
    if newline >= 0:
        return at - 1 + newline + 1
    # A line longer than the slack is cut at the byte, but never inside a URL's credentials: each page is
    # masked on its own, and a password cut in two would be shown half on each.
    margin = _URL_CONTEXT_BYTES
    around = read_range(folder, parts, max(0, at - margin), min(size, at + margin))
    return max(0, at - margin) + cut_outside_url_userinfo(around, min(at, margin))


def log_page(folder: Folder, submission_id: str, page: int) -> dict[str, Any]:
    """Page ``page`` (from 0) of one attempt's saved log as :func:`shown_text` shows it: whole lines, about
    ``PAGE_BYTES`` of them; ``start`` and ``end`` are its byte range in the saved log."""
    parts = log_parts(folder, submission_id)
    pages = page_count(parts)
    page = min(max(0, page), pages - 1)
    start, end = _page_start(folder, parts, page), _page_start(folder, parts, page + 1)
    text = shown_text(read_range(folder, parts, start, end))
    return {"page": page, "pages": pages, "start": start, "end": end, "bytes": log_size(parts), "text": text}


def _lines(folder: Folder, parts: list[Part]) -> Iterator[tuple[int, bytes]]:
    """Every line of the log with the offset it starts at, one part in memory at a time."""
    carry, carry_start = b"", 0
    for part in parts:
        data = carry + (folder.read(part.name) or b"")
        offset, position = carry_start, 0
        while True:
            newline = data.find(b"\n", position)
            if newline < 0:
                break
            yield offset + position, data[position:newline]
            position = newline + 1
        carry, carry_start = data[position:], offset + position
    if carry:
        yield carry_start, carry


def search_log(folder: Folder, submission_id: str, query: str, limit: int = MAX_MATCHES) -> list[dict[str, Any]]:
    """The lines of one attempt's log that hold ``query`` (any case), as the page shows them (:func:`shown_line`,
    masked), each with its number in the saved log and its page.

    The shown line is searched, not the saved one: a search cannot tell whether a password was there, finds
    text that colour codes split, and never answers with one of the agent's event lines.
    """
    wanted = query.lower()
    found: list[dict[str, Any]] = []
    if not wanted:
        return found
    for line_number, (offset, raw) in enumerate(_lines(folder, log_parts(folder, submission_id)), start=1):
        if wanted.encode() not in raw.lower() and not _may_hold(raw, wanted):
            continue
        shown = shown_line(raw.decode("utf-8", errors="replace"))
        if shown is None:
            continue
        text = masked_log(shown)
        if wanted in text.lower():
            found.append({"line": line_number, "offset": offset, "page": offset // PAGE_BYTES, "text": text[:2000]})
            if len(found) >= limit:
                break
    return found


def _may_hold(raw: bytes, wanted: str) -> bool:
    # The byte test above is a shortcut for ASCII queries on lines without colour codes; a query beyond ASCII,
    # or a line whose codes may split it, is tested on decoded text.
    if wanted.isascii() and b"\x1b" not in raw:
        return False
    return wanted in ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace")).lower()
