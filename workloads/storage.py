"""Folders on local disk or in S3: where a workload's dataset and runs are kept.

A location is a :data:`StoragePath`: a :class:`pathlib.Path` or an :class:`ObjectPath`
(``s3://bucket/prefix``, with the same ``/``, ``name`` and ``parent``). Both come from the one
parser of storage locations (:class:`StorageLocation`, ``rayjobs_agent/storage_location.py``,
which the client and the run record's keeper use too); local ones stay ``Path`` because training
code hands them to everything that takes a path. In the workloads this module is the only one that
tells the two apart: the functions below read, write and replace either kind,
and :func:`arrow_path` gives the path and filesystem that pyarrow, Ray Data and Ray Train
take. On local disk a file or folder is replaced atomically (:mod:`jobs.infra.atomic`); in S3 one
upload is atomic by itself, and a folder is replaced in place under a ``_writing`` marker.

S3 is configured from the standard AWS variables (see :mod:`rayjobs_agent.s3_access`); on a
cluster they come from the spec's ``runtime_env.env_vars``, so the driver and every
worker see them. Errors from the store are :class:`ObjectStoreError` with one paragraph
naming the path and the variables to check.

Imports only the standard library and :mod:`jobs` at module level: parameter models
import :class:`ObjectPath` without pyarrow.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar, Union

from jobs.infra import atomic
from rayjobs_agent.s3_access import ObjectStoreError, S3Settings, call_object_store, check_bucket
from rayjobs_agent.storage_location import StorageLocation

T = TypeVar("T")

# Marks an S3 prefix that :func:`replacing_folder` is filling (or was, when its writer failed).
WRITING_MARKER = "_writing"


class ObjectPath(StorageLocation):
    """A :class:`StorageLocation` in S3 (``s3://bucket/key``): joined with ``/``, with ``name`` and ``parent``, like
    a ``Path`` that is not local. Training code keeps local paths as ``pathlib.Path``; this is the other kind."""

    __slots__ = ()

    def __init__(self, uri: str | StorageLocation) -> None:
        super().__init__(str(uri))
        if not self.is_s3:
            raise ValueError(f"{str(uri)!r} is not in object storage (s3://BUCKET/PREFIX)")


StoragePath = Union[Path, ObjectPath]


def storage_path(value: str | os.PathLike | StorageLocation) -> StoragePath:
    """An :class:`ObjectPath` for an ``s3://`` URI, else a local ``Path`` with ``~`` expanded.

    Parsed by :meth:`StorageLocation.parse`: a ``file://`` URI is a local path, as the client takes it.
    Raises ValueError for a URI of another scheme, for ``s3:`` with slashes missing, and for a
    ``file://`` URI that names another host.
    """
    if isinstance(value, ObjectPath):
        return value
    location = value if isinstance(value, StorageLocation) else StorageLocation.parse(value)
    if location.is_s3:
        return ObjectPath.s3(str(location.bucket), location.key)
    return Path(str(location.path))


def resolved(value: str | os.PathLike | StorageLocation) -> StoragePath:
    """:func:`storage_path` made absolute: a local path resolved (symbolic links too), an S3 path as it is.

    Processes with other working directories find the same place by it.
    """
    where = storage_path(value)
    return where if isinstance(where, ObjectPath) else where.resolve()


def local_path(path: StoragePath) -> Path | None:
    """``path`` on this machine's disk, or None when it is in object storage."""
    return None if isinstance(path, ObjectPath) else Path(path)


# --------------------------------------------------------------------------- filesystems


def s3_settings() -> S3Settings:
    """The S3 settings of this process's AWS variables."""
    return S3Settings.from_env(os.environ)


def filesystem_and_path(path: str | os.PathLike | StorageLocation) -> tuple[Any, str]:
    """``(pyarrow.fs.FileSystem, path on it)`` for a local path or an ``s3://`` URI.

    S3: the location's ``S3FileSystem`` (:meth:`StorageLocation.filesystem`: endpoint from
    ``AWS_ENDPOINT_URL``, short timeouts, few retries), and ``bucket/key``. Local: the local
    filesystem and the absolute path.
    """
    where = storage_path(path)
    location = where if isinstance(where, ObjectPath) else StorageLocation.local(where)
    return location.filesystem(), location.fs_path


def arrow_path(path: StoragePath) -> tuple[str, Any]:
    """``(path, filesystem)`` as pyarrow, Ray Data and Ray Train take them: a local path as absolute text with
    no filesystem (each picks the local one), an S3 path as ``bucket/key`` with its ``S3FileSystem``."""
    if isinstance(path, ObjectPath):
        filesystem, fs_path = filesystem_and_path(path)
        return fs_path, filesystem
    return os.path.abspath(path), None


def arrow_paths(paths: list[StoragePath]) -> tuple[list[str], Any]:
    """:func:`arrow_path` of several paths in one store: their paths, and the filesystem they share (or None)."""
    located = [arrow_path(path) for path in paths]
    filesystem = next((filesystem for _, filesystem in located if filesystem is not None), None)
    return [text for text, _ in located], filesystem


def from_arrow_path(text: str, like: StoragePath) -> StoragePath:
    """The location of ``text``, a path as the filesystem of :func:`arrow_path` (``like``) names it."""
    if not isinstance(like, ObjectPath):
        return Path(text)
    bucket = str(like.bucket)
    return ObjectPath.s3(bucket, text[len(bucket) + 1:] if text.startswith(f"{bucket}/") else text)


def call_storage(path: StoragePath, call: Callable[[], T]) -> T:
    """``call()``; in S3, its ``OSError`` becomes an :class:`ObjectStoreError` naming ``path``."""
    if isinstance(path, ObjectPath):
        return path.calling(call)
    return call()


def check_storage(path: StoragePath, field: str) -> None:
    """Raise :class:`ObjectStoreError` naming ``field`` unless the bucket of ``path`` exists and answers.

    Nothing to check on local disk. Takes seconds at most: the filesystem's timeouts are short.
    """
    if not isinstance(path, ObjectPath):
        return
    settings = s3_settings()
    filesystem, fs_path = filesystem_and_path(path)
    try:
        check_bucket(filesystem, path, settings, f"create it, or set {field} to a bucket that exists")
        call_object_store(lambda: filesystem.get_file_info(fs_path), settings, str(path))
    except ObjectStoreError as exc:
        raise type(exc)(f"{field} {path}: {exc}") from None


# --------------------------------------------------------------------------- reading


def file_size(path: StoragePath) -> int | None:
    """The size of the file at ``path`` in bytes, or None when there is no file there."""
    from pyarrow.fs import FileType

    filesystem, fs_path = filesystem_and_path(path)
    info = call_storage(path, lambda: filesystem.get_file_info(fs_path))
    return info.size if info.type == FileType.File else None


def exists(path: StoragePath) -> bool:
    """Whether a file or folder (in S3: any object under the prefix) is at ``path``."""
    if not isinstance(path, ObjectPath):
        return Path(path).exists()
    return file_size(path) is not None or bool(list_files(path, recursive=True, limit=1))


def is_empty(folder: StoragePath) -> bool:
    """Whether nothing is at ``folder``: no file, and no folder with anything in it (in S3: no object under it)."""
    if not isinstance(folder, ObjectPath):
        folder = Path(folder)
        return not folder.exists() or (folder.is_dir() and next(folder.iterdir(), None) is None)
    return not exists(folder)


def read_bytes(path: StoragePath) -> bytes:
    """The whole content of the file at ``path``. Raises FileNotFoundError when there is none."""
    if not isinstance(path, ObjectPath):
        return Path(path).read_bytes()
    if file_size(path) is None:
        raise FileNotFoundError(f"no object at {path}")
    filesystem, fs_path = filesystem_and_path(path)

    def read() -> bytes:
        # A random-access file reads the object in one ranged GET; pyarrow's input stream reads it
        # in small chunks, one request each: a 134 MB checkpoint took 45 s that way, 0.3 s this way.
        with filesystem.open_input_file(fs_path) as file:
            return file.read()

    return call_storage(path, read)


def read_text(path: StoragePath) -> str:
    """The file at ``path`` as UTF-8 text."""
    return read_bytes(path).decode("utf-8")


def open_input_file(path: StoragePath) -> Any:
    """A random-access pyarrow file of ``path`` (for Parquet readers); a local path is returned as it is."""
    if not isinstance(path, ObjectPath):
        return path
    filesystem, fs_path = filesystem_and_path(path)
    return call_storage(path, lambda: filesystem.open_input_file(fs_path))


def list_files(folder: StoragePath, suffix: str = "", recursive: bool = False,
               limit: int | None = None) -> list[StoragePath]:
    """The files in ``folder`` (and its subfolders with ``recursive``) whose names end with ``suffix``, sorted."""
    from pyarrow.fs import FileSelector, FileType

    if not isinstance(folder, ObjectPath):
        pattern = f"*{suffix}"
        found = Path(folder).rglob(pattern) if recursive else Path(folder).glob(pattern)
        return sorted(path for path in found if path.is_file())[:limit]
    filesystem, fs_path = filesystem_and_path(folder)
    selector = FileSelector(fs_path, allow_not_found=True, recursive=recursive)
    infos = call_storage(folder, lambda: filesystem.get_file_info(selector))
    names = sorted(info.path for info in infos if info.type == FileType.File and info.path.endswith(suffix))
    return [from_arrow_path(name, folder) for name in names[:limit]]


# --------------------------------------------------------------------------- writing


def write_bytes(path: StoragePath, data: bytes) -> None:
    """Put ``data`` at ``path``: atomically on local disk (folders created), as one upload in S3."""
    if not isinstance(path, ObjectPath):
        atomic.replace_file(Path(path), lambda tmp: Path(tmp).write_bytes(data))
        return
    filesystem, fs_path = filesystem_and_path(path)

    def put() -> None:
        with filesystem.open_output_stream(fs_path) as stream:
            stream.write(data)

    call_storage(path, put)


def write_text(path: StoragePath, text: str) -> None:
    """Put ``text`` (UTF-8) at ``path``; see :func:`write_bytes`."""
    if not isinstance(path, ObjectPath):
        atomic.write_text(Path(path), text)
        return
    write_bytes(path, text.encode("utf-8"))


def write_with(path: StoragePath, write: Callable[[str], None]) -> None:
    """Build the file at ``path`` through ``write(local_file_name)``: in place atomically on local disk,
    or in a local temporary file uploaded when ``write`` is done."""
    if not isinstance(path, ObjectPath):
        atomic.replace_file(Path(path), write)
        return
    with tempfile.TemporaryDirectory(prefix="rayjobs-upload-") as scratch:
        local = os.path.join(scratch, path.name or "file")
        write(local)
        with open(local, "rb") as handle:
            write_bytes(path, handle.read())


def delete_file(path: StoragePath) -> None:
    """Remove the file at ``path`` if there is one."""
    if not isinstance(path, ObjectPath):
        Path(path).unlink(missing_ok=True)
        return
    if file_size(path) is not None:
        filesystem, fs_path = filesystem_and_path(path)
        call_storage(path, lambda: filesystem.delete_file(fs_path))


def delete_tree(folder: StoragePath) -> None:
    """Remove ``folder`` and everything under it, if it is there."""
    if not isinstance(folder, ObjectPath):
        shutil.rmtree(folder, ignore_errors=True)
        return
    filesystem, fs_path = filesystem_and_path(folder)
    if list_files(folder, recursive=True, limit=1):
        # Also removes the empty "folder" marker objects pyarrow leaves behind.
        call_storage(folder, lambda: filesystem.delete_dir(fs_path))


def make_folder(folder: StoragePath) -> None:
    """Create ``folder`` (and its parents) on local disk; S3 needs no folders."""
    if not isinstance(folder, ObjectPath):
        Path(folder).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def replacing_folder(folder: StoragePath, index: str | None = None) -> Iterator[StoragePath]:
    """Yield the folder to write the new content of ``folder`` in; it becomes ``folder`` when the block succeeds.

    Local disk: a hidden sibling, renamed into place at once (:func:`jobs.infra.atomic.replace_dir`) and
    removed when the block fails; what a killed writer left is tidied first, so a reader finds
    the old content or the new, never a mix.
    S3, where nothing is renamed: ``folder`` itself. The :data:`WRITING_MARKER` goes in first, then
    the old objects go, ``index`` (the file readers look for first, such as a manifest) before the
    rest; the marker goes when the block is done. A failed block leaves the marker, which tells the
    next writer that the prefix is one it may replace.
    """
    if isinstance(folder, ObjectPath):
        write_text(folder / WRITING_MARKER, "a writer is replacing this folder; left behind when it failed\n")
        if index is not None:
            delete_file(folder / index)
        for old in list_files(folder, recursive=True):
            if old.name != WRITING_MARKER:
                delete_file(old)
        yield folder
        delete_file(folder / WRITING_MARKER)
        return
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    atomic.recover_dir(folder)
    building = atomic.staging_dir(folder)
    try:
        yield building
        atomic.replace_dir(building, folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
