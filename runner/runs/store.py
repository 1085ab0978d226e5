"""Reading run records where jobs left them: a local folder, or ``s3://`` with this machine's AWS variables."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobs import object_store
from jobs.keys import METADATA_PARENT, RECORD_DIR, RECORD_ENV_VAR, RUN_FILE
from runner.errors import BadInput, JobNotFound
from runner.storage import calling_storage

UNREADABLE = "UNREADABLE"
# Reading records in S3 is one request each; a few at a time hide most of the round trips.
_PARALLEL_READS = 16


class Folder:
    """A folder of runs, or one run's folder: a local path (``~`` is this machine's) or ``s3://BUCKET/PREFIX``."""

    def __init__(self, location: str, *, _filesystem: Any = None, _settings: Any = None) -> None:
        self.is_s3 = location.startswith("s3://")
        if not self.is_s3:
            self.location = str(Path(location).expanduser().resolve())
            return
        try:
            parsed = object_store.S3Location.parse(location.rstrip("/"))
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        self.location = parsed.uri()
        self.settings = _settings or object_store.S3Settings.from_env()
        self.filesystem = _filesystem or calling_storage(
            lambda: object_store.s3_filesystem(self.settings, parsed.bucket))
        self.key = parsed.key()

    def child(self, name: str) -> Folder:
        """The folder ``name`` inside this one."""
        if not self.is_s3:
            return Folder(os.path.join(self.location, name))
        return Folder(f"{self.location}/{name}", _filesystem=self.filesystem, _settings=self.settings)

    @property
    def name(self) -> str:
        """The folder's last path element."""
        return self.location.rstrip("/").rpartition("/")[2]

    def read(self, name: str) -> bytes | None:
        """The bytes of the file ``name`` (a path inside this folder), or None when there is none."""
        if not self.is_s3:
            try:
                return Path(self.location, name).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        from pyarrow.fs import FileType

        path = f"{self.key}/{name}"

        def read() -> bytes | None:
            if self.filesystem.get_file_info(path).type == FileType.NotFound:
                return None
            with self.filesystem.open_input_stream(path) as stream:
                return stream.read()

        return self._calling(read, path)

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` at ``name`` inside this folder (a local file is replaced whole)."""
        if not self.is_s3:
            target = Path(self.location, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            scratch.write_bytes(data)
            scratch.replace(target)
            return
        path = f"{self.key}/{name}"

        def write() -> None:
            with self.filesystem.open_output_stream(path) as stream:
                stream.write(data)

        self._calling(write, path)

    def subfolders(self) -> list[str]:
        """The names of the folders directly inside this one (none when it does not exist)."""
        if not self.is_s3:
            try:
                return sorted(entry.name for entry in os.scandir(self.location) if entry.is_dir())
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow.fs import FileSelector, FileType

        selector = FileSelector(self.key, allow_not_found=True, recursive=False)
        infos = self._calling(lambda: self.filesystem.get_file_info(selector), self.key)
        return sorted(info.base_name for info in infos if info.type == FileType.Directory)

    def files(self, folder: str) -> list[str]:
        """The names of the files in ``folder`` (a path inside this one), sorted."""
        if not self.is_s3:
            try:
                return sorted(entry.name for entry in os.scandir(Path(self.location, folder)) if entry.is_file())
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow.fs import FileSelector, FileType

        selector = FileSelector(f"{self.key}/{folder}", allow_not_found=True, recursive=False)
        infos = self._calling(lambda: self.filesystem.get_file_info(selector), f"{self.key}/{folder}")
        return sorted(info.base_name for info in infos if info.type == FileType.File)

    def _calling(self, call: Any, what: str) -> Any:
        return calling_storage(lambda: object_store.call_object_store(call, self.settings, f"s3://{what}"))


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
    directory = f"{RECORD_DIR}/logs/{submission_id}"
    return b"".join(folder.read(f"{directory}/{part}") or b"" for part in folder.files(directory))


def attempt_events(folder: Folder, submission_id: str) -> list[dict[str, Any]]:
    """The progress events one attempt's log held.

    Read from their numbered parts (``events/ID/NNNNN.jsonl``), or from the one file that records written
    before parts existed hold (``events/ID.jsonl``).
    """
    directory = f"{RECORD_DIR}/events/{submission_id}"
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
    return document


def record_location(info: dict[str, Any]) -> str | None:
    """Where a job keeps its run record, from its Ray job record (None for a job that keeps none).

    The same rule as the job's own (``workloads/rayjobs_observe/record.py``): the run's folder when the spec
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
    if location is None or not (location.startswith("s3://") or cluster_is_local):
        return None
    name = f"{RECORD_DIR}/stacks/{info.get('submission_id') or 'job'}-{time.strftime('%Y%m%dT%H%M%S')}.txt"
    folder = Folder(location)
    folder.write(name, text.encode())
    return f"{folder.location}/{name}"
