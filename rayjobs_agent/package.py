"""The agent's own package, as a client ships it beside each job: its folder, its zip and that zip's name.

Ray takes it as a ``py_modules`` entry under the package's own name, so that ``rayjobs_agent`` imports the same on
the cluster as here. The zip is built here, once per process, from the package's sources alone and with fixed
time stamps: the same files always give the same content-addressed name, so a cluster stores it once however many
jobs, orders and clients send it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# This package's folder: what a client ships beside each job.
AGENT_PACKAGE_DIR = Path(__file__).resolve().parent


def is_agent_module(module: Any) -> bool:
    """Whether a ``py_modules`` entry of a submission is the agent's own package (its local folder)."""
    return module == str(AGENT_PACKAGE_DIR)


@functools.lru_cache(maxsize=1)
def agent_package() -> tuple[str, bytes]:
    """The agent's package as Ray's py_modules expects it (its folder at the zip's top) and its content-addressed
    name (``_ray_pkg_<hash>.zip``)."""
    # Imported here: every process of a job imports this package, and only a client builds the zip.
    import hashlib
    import io
    import zipfile

    files = sorted(path for path in AGENT_PACKAGE_DIR.rglob("*.py") if "__pycache__" not in path.parts)
    buffer = io.BytesIO()
    digest = hashlib.sha256()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            name = f"{AGENT_PACKAGE_DIR.name}/{path.relative_to(AGENT_PACKAGE_DIR).as_posix()}"
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + data)
            # A fixed time stamp, so that the zip's bytes depend on the files alone.
            archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return f"_ray_pkg_{digest.hexdigest()[:32]}.zip", buffer.getvalue()


def agent_modules_sent(local_modules: Sequence[str], sent_modules: Sequence[str]) -> list[str]:
    """What a submission's ``py_modules`` became for the agent's package once sent (its uploaded URI), given the
    entries before (``local_modules``) and after (``sent_modules``) their upload, in the same order."""
    return [sent for local, sent in zip(local_modules, sent_modules) if is_agent_module(local)]


__all__ = ["AGENT_PACKAGE_DIR", "agent_modules_sent", "agent_package", "is_agent_module"]
