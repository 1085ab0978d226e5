"""Which code a run ran: the git commit of its working_dir, and whether (and how) it differed from that commit."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

# Provenance must never hold up or fail a submission: a git that hangs on a huge repository is given up on.
_GIT_TIMEOUT_S = 20


def code_provenance(working_dir: str | None) -> dict[str, Any]:
    """``{"working_dir": …, "git": {"commit", "dirty", "changes_hash"}}`` for a local working_dir.

    ``git`` is None when the folder is not in a git work tree (or git is missing). ``changes_hash``
    hashes the diff against the commit and every untracked file's name and contents under the folder,
    so two runs with the same commit and the same hash ran the same code.
    """
    if not working_dir:
        return {}
    folder = Path(working_dir)
    found: dict[str, Any] = {"working_dir": str(folder), "git": None}
    if not folder.is_dir():
        return found
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return found
    status = _git(folder, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ".")
    git: dict[str, Any] = {"commit": commit.decode().strip(), "dirty": bool(status), "changes_hash": None}
    if status:
        digest = hashlib.sha256(_git(folder, "diff", "HEAD", "--binary", "--", ".") or b"")
        untracked = _git(folder, "ls-files", "--others", "--exclude-standard", "-z", "--", ".") or b""
        for name in sorted(filter(None, untracked.split(b"\0"))):
            digest.update(b"\0" + name + b"\0")
            try:
                digest.update((folder / name.decode(errors="surrogateescape")).read_bytes())
            except OSError:
                pass
        git["changes_hash"] = digest.hexdigest()[:16]
    found["git"] = git
    return found


def _git(folder: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=_GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
