"""Replacing files and folders so that a reader sees the old version or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable


def replace_file(path: Path, write: Callable[[str], None], durable: bool = False) -> None:
    """Build ``path`` through ``write(tmp_name)`` on a temporary file beside it, then rename it into place.

    Args:
        path: the file to create or replace; its folder is created if missing.
        write: called with the temporary file's name; it writes the whole content there.
        durable: fsync the content before the rename (for state a crash must not lose).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, tmp_name = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=path.suffix, dir=path.parent)
    os.close(descriptor)
    try:
        write(tmp_name)
        if durable:
            with open(tmp_name, "rb+") as written:
                os.fsync(written.fileno())
        os.replace(tmp_name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)


def write_text(path: Path, text: str, durable: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`replace_file`."""
    replace_file(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), durable=durable)


def replace_dir(staged: Path, final: Path) -> None:
    """Move the finished folder ``staged`` to ``final``, replacing whatever was there.

    The old folder is renamed aside before the new one takes its name, so a reader finds the
    old content or the new, never a mix; the old one is deleted afterwards.
    """
    previous = None
    if final.exists():
        previous = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, previous)
    os.replace(staged, final)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
