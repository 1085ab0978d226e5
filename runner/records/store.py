"""Reading run records where jobs left them: a local folder, or ``s3://`` with this machine's AWS variables."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rayjobs_agent.storage_location import StorageLocation
from rayjobs_agent.record_layout import RUN_FILE
from rayjobs_agent.wire import METADATA_PARENT, RECORD_ENV_VAR
from rayjobs_agent.record_layout import STACKS_FOLDER, event_folder, log_folder, unreadable_version
from runner.errors import BadInput, JobNotFound
from runner.storage import calling_storage

UNREADABLE = "UNREADABLE"
# Reading records in S3 is one request each; a few at a time hide most of the round trips.
_PARALLEL_READS = 16


class Folder(StorageLocation):
    """A folder of runs, or one run's folder: a local path (``~`` is this machine's) or ``s3://BUCKET/PREFIX``.

    The one storage type (:class:`StorageLocation`), a local path resolved, and what storage answers turned
    into the client's errors: refused credentials (7), no bucket (2), no answer (4).
    """

    __slots__ = ()

    def __init__(self, location: str) -> None:
        try:
            super().__init__(location)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if not self.is_s3:
            self.path = os.path.realpath(str(self.path))

    def child(self, name: str) -> Folder:
        """The folder ``name`` inside this one."""
        return self.joinpath(name)

    @property
    def name(self) -> str:
        """The folder's last path element (a bucket's name for a bucket)."""
        return self.location.rstrip("/").rpartition("/")[2]

    @property
    def location(self) -> str:
        """Where the folder is: its absolute path, or its ``s3://`` URI."""
        return self.uri

    def read(self, name: str = "") -> bytes | None:
        """The bytes of the file ``name`` (a path inside this folder), or None when there is none."""
        return calling_storage(lambda: super(Folder, self).read(name))

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` at ``name`` inside this folder (a local file is replaced whole)."""
        calling_storage(lambda: super(Folder, self).write(name, data))

    def subfolders(self) -> list[str]:
        """The names of the folders directly inside this one (none when it does not exist)."""
        return calling_storage(lambda: super(Folder, self).subfolders())

    def files(self, folder: str = "") -> list[str]:
        """The names of the files in ``folder`` (a path inside this one), sorted."""
        return calling_storage(lambda: super(Folder, self).files(folder))


def read_run(folder: Folder) -> dict[str, Any]:
    """A run's ``run.json``.

    Raises:
        JobNotFound: the folder holds no run record (exit code 6).
    """
    data = folder.read(RUN_FILE)
    if data is None:
        raise JobNotFound(f"no run record at {folder.location}: a run's folder holds {RUN_FILE} (for the built-in "
                          "workloads <storage_path>/<run_name>); list the runs of a folder with `rayjobs runs FOLDER`")
    return _parsed(data, folder)


def list_runs(location: Folder) -> list[tuple[Folder, dict[str, Any]]]:
    """Every run recorded directly inside ``location`` with its ``run.json``, newest first."""
    folders = [location.child(name) for name in location.subfolders()]
    with ThreadPoolExecutor(max_workers=_PARALLEL_READS) as pool:
        documents = list(pool.map(lambda folder: folder.read(RUN_FILE), folders))
    runs = []
    for folder, data in zip(folders, documents):
        if data is None:
            continue
        try:
            runs.append((folder, _parsed(data, folder)))
        except BadInput as exc:
            runs.append((folder, {"status": UNREADABLE, "error": str(exc)}))
    runs.sort(key=lambda run: run[1].get("started") or 0, reverse=True)
    return runs


def attempt_log(folder: Folder, submission_id: str) -> bytes:
    """The saved driver log of one attempt: its parts, in order."""
    directory = log_folder(submission_id)
    return b"".join(folder.read(f"{directory}/{part}") or b"" for part in folder.files(directory))


def attempt_events(folder: Folder, submission_id: str) -> list[dict[str, Any]]:
    """The progress events one attempt's log held.

    Read from their numbered parts (``events/ID/NNNNN.jsonl``), or from the one file that records written
    before parts existed hold (``events/ID.jsonl``).
    """
    directory = event_folder(submission_id)
    parts = folder.files(directory)
    if parts:
        data = b"".join(folder.read(f"{directory}/{part}") or b"" for part in parts)
    else:
        data = folder.read(f"{directory}.jsonl") or b""
    events = []
    for line in data.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut by an upload that a dying node did not finish
            continue
    return events


def _parsed(data: bytes, folder: Folder) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise BadInput(f"{folder.location}/{RUN_FILE} is not a run record ({exc})") from None
    if not isinstance(document, dict):
        raise BadInput(f"{folder.location}/{RUN_FILE} is not a run record (not a JSON object)")
    if (why := unreadable_version(document)) is not None:
        raise BadInput(f"{folder.location}/{RUN_FILE} cannot be read: {why}")
    return document


def record_location(info: dict[str, Any]) -> str | None:
    """Where a job keeps its run record, from its Ray job record (None for a job that keeps none).

    The same rule as the job's own (``rayjobs_agent/record.py``): the run's folder when the spec
    named one, else ``<base>/<name>-<first submission id>``.
    """
    text = ((info.get("runtime_env") or {}).get("env_vars") or {}).get(RECORD_ENV_VAR)
    try:
        config = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    if config.get("run_dir"):
        return str(config["run_dir"])
    first = (info.get("metadata") or {}).get(METADATA_PARENT) or info.get("submission_id")
    if not config.get("base") or not first:
        return None
    return f"{str(config['base']).rstrip('/')}/{config.get('name') or 'job'}-{first}"


def save_stacks(info: dict[str, Any], text: str, *, cluster_is_local: bool) -> str | None:
    """Keep a stalled job's stacks in its run record; returns where, or None when it keeps none this machine can
    reach (a local folder is the cluster's own, so only a cluster on this machine shares it)."""
    location = record_location(info)
    try:
        folder = Folder(location) if location is not None else None
    except BadInput:  # no folder the job could have written its record to either
        return None
    if folder is None or not (folder.is_s3 or cluster_is_local):
        return None
    name = f"{STACKS_FOLDER}/{info.get('submission_id') or 'job'}-{time.strftime('%Y%m%dT%H%M%S')}.txt"
    folder.write(name, text.encode())
    return f"{folder.location}/{name}"
