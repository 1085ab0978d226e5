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


def staging_dir(final: Path) -> Path:
    """A new hidden sibling of ``final`` to build a folder in; its name carries this process's id.

    A process killed while building leaves it behind; :func:`recover_dir` tells it from one still in use.
    """
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def replace_dir(staged: Path, final: Path) -> None:
    """Move the finished folder ``staged`` to ``final``, replacing whatever was there.

    The old folder is renamed aside before the new one takes its name, so a reader finds the
    old content or the new, never a mix; the old one is deleted afterwards. A process killed
    between the two renames leaves ``final`` absent and the old folder aside, whole:
    :func:`recover_dir` puts it back.
    """
    previous = None
    if final.exists():
        previous = final.with_name(f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(final, previous)
    os.replace(staged, final)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def recover_dir(final: Path) -> None:
    """Tidy what killed writers of ``final`` left: remove their half-built folders, and put back the
    previous folder when one was killed after moving it aside and before its replacement took its place."""
    for leftover in sorted(final.parent.glob(f".{final.name}.*-*-*")):
        kind, _, rest = leftover.name[len(final.name) + 2:].partition("-")
        writer = rest.split("-", 1)[0]
        if kind not in ("tmp", "old") or not writer.isdigit() or _alive(int(writer)):
            continue
        if kind == "old" and not final.exists():
            os.replace(leftover, final)
        else:
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # a PermissionError would mean someone else's live process
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
