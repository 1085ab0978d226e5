"""A saved log read a page at a time, by byte range from the record's parts, and searched line by line.

A log may be hundreds of megabytes (parts of 8 MiB each, in a folder or in S3): no page, search or export
holds more than one part of it in memory, and a browser is only ever sent one page.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from rayjobs_agent.record_layout import log_folder
from runner.records.report import masked_log
from runner.records.store import Folder
from runner.storage import calling_storage

PAGE_BYTES = 256 * 1024
# A page ends at the first line start past its size; a line this much longer is cut where the page ends.
_LINE_SLACK = 64 * 1024
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
    if not folder.is_s3:
        names = folder.files(directory)
        sizes = [os.path.getsize(os.path.join(str(folder.path), directory, name)) for name in names]
    else:
        from pyarrow.fs import FileSelector, FileType

        where = folder.joinpath(directory)
        filesystem = folder.filesystem()
        selector = FileSelector(where.fs_path, allow_not_found=True, recursive=False)
        infos = calling_storage(lambda: folder.calling(lambda: filesystem.get_file_info(selector)))
        found = sorted((info.base_name, info.size) for info in infos if info.type == FileType.File)
        names, sizes = [name for name, _ in found], [size for _, size in found]
    parts, start = [], 0
    for name, size in zip(names, sizes):
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
            chunks.append(_read_part_range(folder, part.name, low - part.start, high - low))
    return b"".join(chunks)


def _read_part_range(folder: Folder, name: str, offset: int, length: int) -> bytes:
    where = folder.joinpath(name)
    if not folder.is_s3:
        with open(str(where.path), "rb") as handle:
            handle.seek(offset)
            return handle.read(length)
    filesystem = folder.filesystem()

    def read() -> bytes:
        with filesystem.open_input_file(where.fs_path) as file:
            return file.read_at(length, offset)

    return calling_storage(lambda: where.calling(read))


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
    return at if newline < 0 else at - 1 + newline + 1


def log_page(folder: Folder, submission_id: str, page: int) -> dict[str, Any]:
    """Page ``page`` (from 0) of one attempt's saved log, masked: whole lines, about ``PAGE_BYTES`` of them."""
    parts = log_parts(folder, submission_id)
    pages = page_count(parts)
    page = min(max(0, page), pages - 1)
    start, end = _page_start(folder, parts, page), _page_start(folder, parts, page + 1)
    text = masked_log(read_range(folder, parts, start, end).decode("utf-8", errors="replace"))
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
    """The lines of one attempt's log that hold ``query`` (any case), masked, each with its page.

    The masked line is searched, not the saved one, so that a search cannot tell whether a password was there.
    """
    wanted = query.lower()
    found: list[dict[str, Any]] = []
    if not wanted:
        return found
    for line_number, (offset, raw) in enumerate(_lines(folder, log_parts(folder, submission_id)), start=1):
        if wanted.encode() not in raw.lower() and not _may_hold(raw, wanted):
            continue
        text = masked_log(raw.decode("utf-8", errors="replace"))
        if wanted in text.lower():
            found.append({"line": line_number, "offset": offset, "page": offset // PAGE_BYTES, "text": text[:2000]})
            if len(found) >= limit:
                break
    return found


def _may_hold(raw: bytes, wanted: str) -> bool:
    # The byte test above is a shortcut for ASCII queries; a query beyond ASCII is tested on decoded text.
    return not wanted.isascii() and wanted in raw.decode("utf-8", errors="replace").lower()
