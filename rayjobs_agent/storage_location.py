"""Where rayjobs keeps things: a local folder or ``s3://bucket/prefix``, parsed by one rule and reached one way.

:class:`StorageLocation` is the one storage type and :meth:`StorageLocation.parse` the one parser:
the spec's checks, the run commands and packaging (through :mod:`rayjobs_agent.s3_access`), the
workloads (:mod:`workloads.storage`) and the run record's keeper (``record_store.py``) all use it,
so a location means the same to each, and S3 is opened with the same options everywhere.

It lives with the record keeper, not in ``jobs``, because the keeper is shipped alone to the
cluster and runs first in every job, before the user's entrypoint: so this module imports the
standard library only, and pyarrow's S3 filesystem only when an ``s3://`` location is read or
written. The client imports it as it imports ``masking.py`` (:mod:`rayjobs_agent.s3_access`).

How S3 is reached (the AWS variables, pyarrow's filesystem, errors in one paragraph) is
``s3_access.py``'s, re-exported here so that one import serves every side.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from .s3_access import (ObjectStoreAuthFailed, ObjectStoreError, ObjectStoreMissing, ObjectStoreUnreachable,
                        S3Settings, call_object_store, check_bucket, object_store_error, s3_filesystem)

__all__ = ["ObjectStoreAuthFailed", "ObjectStoreError", "ObjectStoreMissing", "ObjectStoreUnreachable", "S3Settings",
           "StorageLocation", "call_object_store", "check_bucket", "file_uri_path", "object_store_error",
           "s3_filesystem", "uri_scheme"]

S3_SCHEME = "s3"
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# ``scheme://``: what tells a URI from a local path (``C:\\`` has no ``//``).
URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# ``s3:/bucket``, ``s3:bucket``: slashes missing, which would otherwise make it a local folder named ``s3:``.
_SLASHES_MISSING = re.compile(r"^s3:(?!//)", re.IGNORECASE)

T = TypeVar("T")
L = TypeVar("L", bound="StorageLocation")
# One S3 filesystem per bucket and settings, opened on first use and kept for the process.
_FILESYSTEMS: dict[tuple[S3Settings, str], Any] = {}


def uri_scheme(text: str) -> str | None:
    """The scheme of a URI (``s3`` for ``s3://bucket/key``), or None for a local path."""
    match = URI_SCHEME.match(text)
    return match.group(1).lower() if match else None


def file_uri_path(uri: str) -> str:
    """The local path a ``file://`` URI names (``file:///data/runs``, ``file://localhost/data``).

    Raises ValueError for a URI that names another host: it is a path on this machine or nothing.
    """
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{uri!r} names the host {parsed.netloc!r}; a file:// URI is a path on this machine "
                         "(file:///PATH)")
    return unquote(parsed.path)


class StorageLocation:
    """A file or folder in storage: a local path, or a key in an S3 bucket (``s3://bucket/key``).

    Built by :meth:`parse` (or ``StorageLocation(text)``), joined with ``/`` or :meth:`joinpath`,
    written back by ``str()``. The kind is :attr:`kind`; the reads and writes below work on either.
    """

    __slots__ = ("bucket", "key", "path")

    def __init__(self, text: str | os.PathLike[str]) -> None:
        self.bucket, self.key, self.path = _parse(os.fspath(text))

    @classmethod
    def parse(cls: type[L], text: str | os.PathLike[str]) -> L:
        """The location ``text`` names: ``s3://BUCKET[/KEY]``, ``file:///PATH``, or a local path (``~`` expanded).

        Raises:
            ValueError: a URI of another scheme, an ``s3://`` URI without a valid bucket, a ``file://`` URI
                naming another host, or ``s3:`` without both slashes; the message quotes ``text``.
        """
        return cls(text)

    @classmethod
    def parse_s3(cls: type[L], text: str) -> L:
        """:meth:`parse` for a place that only object storage will do. Raises ValueError for anything else."""
        location = cls.parse(text) if uri_scheme(text) == S3_SCHEME else None
        if location is None:
            raise ValueError(_not_s3(text))
        return location

    @classmethod
    def s3(cls: type[L], bucket: str, key: str = "") -> L:
        """The location ``key`` in ``bucket``."""
        return cls._of(bucket, key.strip("/"), None)

    @classmethod
    def local(cls: type[L], path: str | os.PathLike[str]) -> L:
        """The local ``path``, taken as it is (no URI is read in it, no ``~`` expanded)."""
        return cls._of(None, "", os.fspath(path))

    @classmethod
    def _of(cls: type[L], bucket: str | None, key: str, path: str | None) -> L:
        location = object.__new__(cls)
        location.bucket, location.key, location.path = bucket, key, path
        return location

    @property
    def is_s3(self) -> bool:
        """Whether this is in object storage."""
        return self.bucket is not None

    @property
    def kind(self) -> str:
        """``"s3"`` or ``"local"``."""
        return S3_SCHEME if self.is_s3 else "local"

    @property
    def uri(self) -> str:
        """``s3://bucket/key``, or the local path as parsed."""
        return f"s3://{self.fs_path}" if self.is_s3 else str(self.path)

    @property
    def fs_path(self) -> str:
        """The path pyarrow's filesystem takes: ``bucket/key`` in S3, the absolute path on local disk."""
        if self.is_s3:
            return "/".join(part for part in (self.bucket, self.key) if part)
        return os.path.abspath(str(self.path))

    @property
    def name(self) -> str:
        """The last part of the path ('' for a bucket)."""
        return self.key.rpartition("/")[2] if self.is_s3 else os.path.basename(os.path.normpath(str(self.path)))

    @property
    def parent(self: L) -> L:
        """One level up (a bucket is its own parent)."""
        if self.is_s3:
            return self._of(self.bucket, self.key.rpartition("/")[0], None)
        return self._of(None, "", os.path.dirname(os.path.normpath(str(self.path))))

    def joinpath(self: L, *names: Any) -> L:
        """The location of ``names`` (each may hold ``/``) under this one."""
        if self.is_s3:
            parts = [self.key] + [str(name).strip("/") for name in names]
            return self._of(self.bucket, "/".join(part for part in parts if part), None)
        return self._of(None, "", os.path.join(str(self.path), *(str(name) for name in names)))

    def __truediv__(self: L, name: Any) -> L:
        return self.joinpath(name)

    def absolute(self: L) -> L:
        """A local path made absolute (``..`` folded, links kept); an S3 location as it is."""
        return self if self.is_s3 else self._of(None, "", os.path.abspath(str(self.path)))

    def resolved(self: L) -> L:
        """A local path made absolute with its symbolic links resolved; an S3 location as it is."""
        return self if self.is_s3 else self._of(None, "", os.path.realpath(str(self.path)))

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        if self.is_s3:
            raise TypeError(f"{self.uri} is in object storage, not a path on this machine")
        return str(self.path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorageLocation) and (other.bucket, other.key, other.path) == \
            (self.bucket, self.key, self.path)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key, self.path))

    # ----------------------------------------------------------------- S3 access

    def filesystem(self, settings: S3Settings | None = None) -> Any:
        """pyarrow's filesystem of this location: the S3 one of the AWS variables (opened once), else the local."""
        from pyarrow import fs

        if not self.is_s3:
            return fs.LocalFileSystem()
        settings = settings or S3Settings.from_env()
        cache_key = (settings, str(self.bucket))
        if cache_key not in _FILESYSTEMS:
            _FILESYSTEMS[cache_key] = call_object_store(lambda: s3_filesystem(settings, str(self.bucket)),
                                                        settings, self.uri)
        return _FILESYSTEMS[cache_key]

    def calling(self, call: Callable[[], T]) -> T:
        """``call()``; in S3, its ``OSError`` becomes an :class:`ObjectStoreError` naming this location."""
        if self.is_s3:
            return call_object_store(call, S3Settings.from_env(), self.uri)
        return call()

    # ----------------------------------------------------------------- reading and writing

    def read(self, name: str = "") -> bytes | None:
        """The bytes of the file ``name`` under this location (or of this file), or None when there is none."""
        where = self.joinpath(name) if name else self
        if not self.is_s3:
            try:
                with open(str(where.path), "rb") as handle:
                    return handle.read()
            except (FileNotFoundError, NotADirectoryError):  # a file where a folder should be holds nothing either
                return None
        from pyarrow.fs import FileType

        filesystem = self.filesystem()

        def read() -> bytes | None:
            if filesystem.get_file_info(where.fs_path).type == FileType.NotFound:
                return None
            # One ranged GET; pyarrow's input stream reads in small chunks, one request each.
            with filesystem.open_input_file(where.fs_path) as file:
                return file.read()

        return where.calling(read)

    def write(self, name: str, data: bytes) -> None:
        """Put ``data`` at ``name`` under this location: a local file is replaced whole, never half-written."""
        where = self.joinpath(name)
        if not self.is_s3:
            target = str(where.path)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            scratch = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{os.getpid()}.tmp")
            with open(scratch, "wb") as handle:
                handle.write(data)
            os.replace(scratch, target)
            return
        filesystem = self.filesystem()

        def write() -> None:
            with filesystem.open_output_stream(where.fs_path) as stream:
                stream.write(data)

        where.calling(write)

    def subfolders(self) -> list[str]:
        """The names of the folders directly under this location, sorted (none when it does not exist)."""
        return self._entries(folders=True)

    def files(self, folder: str = "") -> list[str]:
        """The names of the files directly in ``folder`` under this location (or in this one), sorted."""
        return (self.joinpath(folder) if folder else self)._entries(folders=False)

    def _entries(self, folders: bool) -> list[str]:
        if not self.is_s3:
            try:
                return sorted(entry.name for entry in os.scandir(str(self.path))
                              if (entry.is_dir() if folders else entry.is_file()))
            except (FileNotFoundError, NotADirectoryError):
                return []
        from pyarrow.fs import FileSelector, FileType

        wanted = FileType.Directory if folders else FileType.File
        selector = FileSelector(self.fs_path, allow_not_found=True, recursive=False)
        filesystem = self.filesystem()
        infos = self.calling(lambda: filesystem.get_file_info(selector))
        return sorted(info.base_name for info in infos if info.type == wanted)


def _parse(text: str) -> tuple[str | None, str, str | None]:
    """``(bucket, key, None)`` for an ``s3://`` URI, ``(None, "", path)`` for a local one."""
    if _SLASHES_MISSING.match(text):
        raise ValueError(f"{text!r} looks like an s3:// URI with slashes missing; give s3://BUCKET/PREFIX "
                         f"(for a local folder of that name, write ./{text})")
    scheme = uri_scheme(text)
    if scheme == S3_SCHEME:
        parsed = urlparse(text)
        if not BUCKET_NAME.match(parsed.netloc or ""):
            raise ValueError(_not_s3(text))
        return parsed.netloc, parsed.path.strip("/"), None
    if scheme == "file":
        return None, "", file_uri_path(text)
    if scheme is not None:
        raise ValueError(f"{text!r}: {scheme}:// is not supported; give s3://BUCKET/PREFIX or a local path")
    return None, "", os.path.expanduser(text)


def _not_s3(text: str) -> str:
    return (f"{text!r} is not s3://BUCKET[/PREFIX] (a bucket name is 3-63 lowercase letters, digits, "
            "'.' and '-')")
