"""Reading run records where jobs left them: a local folder, or ``s3://`` with this machine's AWS variables."""

from __future__ import annotations

import json
import math
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rayjobs_agent.storage_location import StorageLocation
from rayjobs_agent.record_layout import RUN_FILE
from rayjobs_agent.vocabulary import TIME_FIELD, EventKind, kind_of
from rayjobs_agent.wire import METADATA_PARENT, RECORD_ENV_VAR
from rayjobs_agent.record_layout import STACKS_FOLDER, event_folder, log_folder, unreadable_version
from runner.errors import BadInput, JobNotFound
from runner.records.model import path_problem, record_problem, too_deep
from runner.storage import calling_storage

UNREADABLE = "UNREADABLE"
# Reading records in S3 is one request each; a few at a time hide most of the round trips.
_PARALLEL_READS = 16


class Folder(StorageLocation):
    """A folder of runs, or one run's folder: a local path (``~`` is this machine's) or ``s3://BUCKET/PREFIX``.

    The one storage type (:class:`StorageLocation`), a local path resolved, and what storage answers turned
    into the client's errors: refused credentials (7), no bucket (2), no answer (4).

    Every name read or listed inside it is checked to stay inside it before anything is opened
    (:meth:`inside`): a record names its own files (an attempt's log is under its submission id), and a record
    is data anyone who can write the bucket or the folder wrote.
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

    def inside(self, name: str) -> Folder:
        """The file or folder ``name`` (``a/b``, a path inside this folder), or this folder for ``""``.

        Raises:
            BadInput: ``name`` could lead elsewhere (``..``, a leading ``/``, an empty part, a backslash, a
                control character), or, in a local folder, a link on its way leads out of it (exit code 2).
        """
        if not name:
            return self
        if (problem := path_problem(name)) is not None:
            raise BadInput(f"{name!r} is no path inside {self.location} ({problem})")
        where = self.joinpath(name)
        if not self.is_s3:
            self._contains(os.path.realpath(str(where.path)), where)
        return where

    def _contains(self, real: str, where: Folder) -> None:
        root = os.path.realpath(str(self.path))
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise BadInput(f"{where.location} leads out of {self.location} (through a link); it is not read")

    def read(self, name: str = "") -> bytes | None:
        """The bytes of the file ``name`` (a path inside this folder), or None when there is none.

        Raises:
            BadInput: ``name`` leads out of this folder, or is there but cannot be read (not a file, no
                permission) (exit code 2).
        """
        where = self.inside(name)
        if self.is_s3:
            return calling_storage(lambda: StorageLocation.read(where))
        with self._opened(where) as handle:
            return None if handle is None else handle.read()

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the file ``name`` from ``offset`` (fewer at its end; none when it is gone)."""
        where = self.inside(name)
        if not self.is_s3:
            with self._opened(where) as handle:
                if handle is None:
                    return b""
                handle.seek(offset)
                return handle.read(length)
        filesystem = self.filesystem()

        def read() -> bytes:
            with filesystem.open_input_file(where.fs_path) as file:
                return file.read_at(length, offset)

        return calling_storage(lambda: where.calling(read))

    def _opened(self, where: Folder) -> Any:
        """The local file ``where`` opened for reading (None when there is none), checked once open to be a
        plain file inside this folder: a link swapped in after :meth:`inside` looked is caught, and a FIFO
        never blocks the reader."""
        import contextlib

        try:
            descriptor = os.open(str(where.path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            return contextlib.nullcontext(None)
        except OSError as exc:
            raise BadInput(f"{where.location} cannot be read ({exc.strerror or exc})") from None
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise BadInput(f"{where.location} is not a file")
            opened = f"/proc/self/fd/{descriptor}"
            self._contains(os.path.realpath(opened) if os.path.islink(opened) else
                           os.path.realpath(str(where.path)), where)
            return os.fdopen(descriptor, "rb")
        except BaseException:
            os.close(descriptor)
            raise

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` at ``name`` inside this folder (a local file is replaced whole)."""
        self.inside(name)
        calling_storage(lambda: StorageLocation.write(self, name, data))

    def subfolders(self) -> list[str]:
        """The names of the folders directly inside this one (none when it does not exist)."""
        return self._listed(lambda: StorageLocation.subfolders(self))

    def files(self, folder: str = "") -> list[str]:
        """The names of the files in ``folder`` (a path inside this one), sorted."""
        where = self.inside(folder)
        return self._listed(lambda: StorageLocation.files(where))

    def file_sizes(self, folder: str = "") -> list[tuple[str, int]]:
        """The files in ``folder`` (a path inside this one) with their sizes, sorted by name: one listing.

        Raises:
            BadInput: a local file among them is a link that leads out of this folder (exit code 2).
        """
        where = self.inside(folder)
        if not self.is_s3:
            found = []
            for name in self.files(folder):
                path = os.path.join(str(where.path), name)
                self._contains(os.path.realpath(path), where.joinpath(name))
                try:
                    found.append((name, os.path.getsize(path)))
                except FileNotFoundError:  # gone since the listing
                    continue
            return found
        from pyarrow.fs import FileSelector, FileType

        filesystem = self.filesystem()
        selector = FileSelector(where.fs_path, allow_not_found=True, recursive=False)
        infos = calling_storage(lambda: where.calling(lambda: filesystem.get_file_info(selector)))
        return sorted((info.base_name, info.size) for info in infos if info.type == FileType.File)

    def _listed(self, listing: Any) -> list[str]:
        try:
            return calling_storage(listing)
        except OSError as exc:  # a local folder that cannot be listed (no permission, not a folder)
            raise BadInput(f"{self.location} cannot be listed ({exc.strerror or exc})") from None


def read_run(folder: Folder) -> dict[str, Any]:
    """A run's ``run.json``, every field checked against the record's model (:mod:`runner.records.model`).

    Raises:
        JobNotFound: the folder holds no run record (exit code 6).
        BadInput: it holds one this version cannot read: not JSON, a newer major layout, a field that holds what
            it may not (the reason names it), or a ``run.json`` that leads out of the folder (exit code 2).
    """
    data = folder.read(RUN_FILE)
    if data is None:
        raise JobNotFound(f"no run record at {folder.location}: a run's folder holds {RUN_FILE} (for the built-in "
                          "workloads <storage_path>/<run_name>); list the runs of a folder with `rayjobs runs FOLDER`")
    return _parsed(data, folder)


def list_runs(location: Folder) -> list[tuple[Folder, dict[str, Any]]]:
    """Every run recorded directly inside ``location`` with its ``run.json``, newest first; a record that cannot
    be read is listed as ``{"status": UNREADABLE, "error": why}`` and does not stop the others."""
    with ThreadPoolExecutor(max_workers=_PARALLEL_READS) as pool:
        listed = list(pool.map(lambda name: _listed_run(location, name), location.subfolders()))
    runs = [run for run in listed if run is not None]
    runs.sort(key=lambda run: run[1].get("started") or 0, reverse=True)
    return runs


def _listed_run(location: Folder, name: str) -> tuple[Folder, dict[str, Any]] | None:
    folder = location.child(name)
    try:
        # A run folder that is a link leading out of the location is listed, never read: whoever can write a
        # link into a shared folder must not make its pages serve what lies elsewhere.
        folder = location.inside(name)
        return folder, read_run(folder)
    except JobNotFound:
        return None
    except BadInput as exc:
        return folder, {"status": UNREADABLE, "error": str(exc)}


def attempt_log(folder: Folder, submission_id: str) -> bytes:
    """The saved driver log of one attempt: its parts, in order."""
    directory = log_folder(submission_id)
    return b"".join(folder.read(f"{directory}/{part}") or b"" for part in folder.files(directory))


def attempt_events(folder: Folder, submission_id: str) -> list[dict[str, Any]]:
    """The progress events one attempt's log held, with its resource samples in the order they were taken.

    Read from their numbered parts (``events/ID/NNNNN.jsonl``), or from the one file that records written
    before parts existed hold (``events/ID.jsonl``). A line that is no JSON object (or one nested past
    :data:`~runner.records.model.MAX_DEPTH`) is skipped.
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
            event = json.loads(line)
        except ValueError:  # a line cut by an upload that a dying node did not finish
            continue
        if isinstance(event, dict) and not too_deep(event):
            events.append(event)
    return _samples_in_time_order(events)


def _samples_in_time_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with their resource samples sorted by when each was taken, every other event where it was.

    A sample taken while the job's log was in the middle of a line goes to the record alone, at once; the ones
    before it in the log reach the record only when the log is next read. Kept in arrival order, the samples
    would run back in time.
    """
    places = [index for index, event in enumerate(events) if kind_of(event) == EventKind.RESOURCES]
    samples = sorted((events[index] for index in places), key=_taken_at)
    ordered = list(events)
    for index, sample in zip(places, samples):
        ordered[index] = sample
    return ordered


def _taken_at(sample: dict[str, Any]) -> float:
    taken = sample.get(TIME_FIELD)
    if isinstance(taken, (int, float)) and not isinstance(taken, bool) and math.isfinite(taken):
        return float(taken)
    return math.inf  # a sample that says no time cannot be placed: after the rest


def _parsed(data: bytes, folder: Folder) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{folder.location}/{RUN_FILE} is not a run record ({exc})") from None
    if not isinstance(document, dict):
        raise BadInput(f"{folder.location}/{RUN_FILE} is not a run record (not a JSON object)")
    if (why := unreadable_version(document)) is not None:
        raise BadInput(f"{folder.location}/{RUN_FILE} cannot be read: {why}")
    if (why := record_problem(document)) is not None:
        raise BadInput(f"{folder.location}/{RUN_FILE} cannot be read: {why}")
    return document


def record_location(info: dict[str, Any]) -> str | None:
    """Where a job keeps its run record, from its Ray job record (None for a job that keeps none).

    The same rule as the job's own (``rayjobs_agent/supervisor.py``): the run's folder when the spec
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
