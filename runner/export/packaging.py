"""Packaging a runtime_env's local directories as Ray does and uploading them to S3.

KubeRay submits a job from inside the cluster, where the laptop's ``working_dir`` does
not exist. Ray itself can fetch a working_dir from ``s3://…zip``, so the directory is
zipped here with Ray's own packaging code (same excludes, same content-hash name
``_ray_pkg_<hash>.zip``) and put in a bucket. The same contents always get the same
name, so an unchanged directory is uploaded once.

A package is trusted by its name only when it is whole. The folder is hashed again once zipped, so a
file edited while it was zipped cannot give a name that does not match what was uploaded. It is
uploaded under a temporary key and copied to its name only once complete, so an interrupted upload
(Ctrl-C, a lost connection) never publishes a truncated zip; and an object already there is trusted
only when its zip's central directory, which is written last, is where it should be.

How the object store is reached (the AWS variables) is :mod:`rayjobs_agent.s3_access`'s.
"""

from __future__ import annotations

import copy
import logging
import os
import secrets
import struct
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rayjobs_agent import s3_access as object_store
from jobs.infra import ray_internals
from rayjobs_agent.s3_access import S3Settings
from rayjobs_agent.storage_location import StorageLocation
from jobs.submission import local_runtime_paths
from runner.errors import BadInput
from runner.storage import calling_storage


def upload_destination(text: str) -> StorageLocation:
    """Where packages go: ``s3://bucket[/prefix]``. Raises BadInput for anything else."""
    try:
        return StorageLocation.parse_s3(text)
    except ValueError as exc:
        raise BadInput(f"--upload-to {exc}") from None


# A py_modules package in object storage: named apart from Ray's flat ``_ray_pkg_<hash>.zip`` of the same files,
# since its entries sit one folder deeper (see nested_one_level).
MODULE_PACKAGE_SUFFIX = "-module.zip"
# Ray's packaging reports each file it skips; rayjobs says what it uploaded itself.
_QUIET = logging.getLogger("rayjobs.package")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def upload_local_paths(runtime_env: dict[str, Any], destination: str, *, env: Mapping[str, str] = os.environ,
                       say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """A copy of ``runtime_env`` whose local working_dir and py_modules directories are uploaded packages.

    Args:
        runtime_env: a submission's runtime_env (its ``excludes`` already hold rayjobs' defaults).
        destination: ``s3://bucket/prefix`` for the packages.
        env: where the AWS variables are read.
        say: receives one line per package (its URI, uploaded or already there).

    Returns:
        The runtime_env with ``s3://…/_ray_pkg_<hash>.zip`` URIs, and without ``excludes`` (applied here).

    Raises:
        BadInput: a malformed destination, a missing bucket, or a py_modules entry that is not a directory.
        StorageUnreachable: no answer from the endpoint, or an error from it.
        StorageAuthFailed: the credentials were refused.
    """
    location = upload_destination(destination)
    result = copy.deepcopy(runtime_env)
    excludes = list(result.get("excludes") or [])
    jobs: list[tuple[str, Path, bool, list[str]]] = []
    for field_name, path in local_runtime_paths(result):
        if field_name == "working_dir":
            # Ray adds its own defaults to the working_dir's excludes (not to py_modules').
            jobs.append((field_name, Path(path), False, ray_internals.default_working_dir_excludes() + excludes))
            continue
        if not Path(path).is_dir():
            raise BadInput(f"py_modules entry {path} is a file: only directories are packaged for KubeRay; "
                           "upload it yourself and give its URI")
        jobs.append((field_name, Path(path), True, excludes))
    if not jobs:
        return result

    settings = S3Settings.from_env(env)
    filesystem = calling_storage(lambda: location.filesystem(settings))
    check_bucket(filesystem, location, settings)
    uploaded: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rayjobs-package-") as scratch:
        for field_name, directory, include_parent_dir, patterns in jobs:
            with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
                folder_name = ray_internals.package_name(directory, patterns)
            package_location = location / stored_name(folder_name, include_parent_dir)
            # Named by a hash of its contents: one there whole is this very package, neither zipped nor sent again.
            if whole_zip_stored(filesystem, package_location.fs_path, settings):
                say(f"{field_name} {directory} is already uploaded as {package_location.uri} (same contents)")
            else:
                zipped, package = package_directory(directory, patterns, include_parent_dir, Path(scratch))
                package_location = location / stored_name(zipped, include_parent_dir)
                if include_parent_dir:
                    package = nested_one_level(package, Path(scratch) / package_location.name)
                upload_file(filesystem, package, package_location.fs_path, settings)
                say(f"uploaded {field_name} {directory} ({_size(package.stat().st_size)}) as {package_location.uri}")
            uri = package_location.uri
            uploaded[str(directory)] = uri
    if result.get("working_dir") in uploaded:
        result["working_dir"] = uploaded[result["working_dir"]]
    if result.get("py_modules"):
        result["py_modules"] = [uploaded.get(module, module) for module in result["py_modules"]]
    result.pop("excludes", None)
    return result


def stored_name(package_name: str, include_parent_dir: bool) -> str:
    """The object's name of a package: Ray's ``_ray_pkg_<hash>.zip``, or for py_modules the nested one's name."""
    return package_name.removesuffix(".zip") + MODULE_PACKAGE_SUFFIX if include_parent_dir else package_name


def package_directory(directory: Path, excludes: list[str], include_parent_dir: bool,
                      scratch: Path) -> tuple[str, Path]:
    """Zip ``directory`` with Ray's packaging code; return the package's name (``_ray_pkg_<hash>.zip``) and file.

    The folder is hashed as Ray names it before and after it is zipped, and zipped again if the two differ:
    a file edited while it was zipped must not give a name that does not match what was uploaded.

    Raises:
        BadInput: the folder kept changing while it was zipped.
    """
    for _ in range(_PACKAGING_TRIES):
        with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
            before = ray_internals.package_name(directory, excludes)
            target = scratch / before
            ray_internals.create_package(directory, target, excludes, include_parent_dir, _QUIET)
            if ray_internals.package_name(directory, excludes) == before:
                return before, target
        target.unlink(missing_ok=True)
    raise BadInput(f"{directory} kept changing while it was packaged ({_PACKAGING_TRIES} tries): its package would "
                   "not hold what its name says; send it again once nothing writes into it")


# A package is read and sent in pieces of this size (it may be larger than memory allows at once).
UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024
# How often a folder that changes while it is zipped is zipped again before its upload is refused.
_PACKAGING_TRIES = 3


def nested_one_level(package: Path, target: Path) -> Path:
    """A copy of the zip ``package`` with every entry one folder deeper, written to ``target``.

    Ray unpacks a remote py_modules zip without its single top-level folder and puts what is left on
    the path: the module's own folder must therefore sit one level down, or its files would be imported
    as top-level modules (and one named like a standard module would shadow it in every worker).
    """
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as nested:
        for entry in source.infolist():
            data = b"" if entry.is_dir() else source.read(entry)
            entry.filename = f"module/{entry.filename}"
            nested.writestr(entry, data)
    return target


def check_bucket(filesystem: Any, location: StorageLocation, settings: S3Settings) -> None:
    """Raise unless the bucket exists and answers."""
    calling_storage(lambda: object_store.check_bucket(filesystem, location, settings,
                                                       "create it, or name another with --upload-to"))


def upload_file(filesystem: Any, package: Path, key: str, settings: S3Settings) -> None:
    """Copy ``package`` to ``key``, in chunks (a package may be larger than memory allows at once), through a
    temporary key: ``key`` itself appears only once the whole package is stored.

    An upload stopped half-way (Ctrl-C, a lost connection) would otherwise leave a truncated object under the
    package's name, which every later submission trusts: pyarrow completes an output stream on close, even
    one closed by an exception.
    """
    partial = f"{key}.partial-{secrets.token_hex(6)}"

    def copy_it() -> None:
        with package.open("rb") as source, filesystem.open_output_stream(partial) as target:
            while chunk := source.read(UPLOAD_CHUNK_BYTES):
                target.write(chunk)
        filesystem.move(partial, key)  # on S3 a copy of the whole object: the key appears complete or not at all

    try:
        calling_storage(lambda: object_store.call_object_store(copy_it, settings, key))
    except BaseException:
        try:
            filesystem.delete_file(partial)
        except Exception:  # noqa: BLE001 - what is left under a temporary key is never trusted anyway
            pass
        raise


def whole_zip_stored(filesystem: Any, key: str, settings: S3Settings) -> bool:
    """Whether a whole zip is stored at ``key``: its central directory, written last, ends it where it says.

    A truncated zip (an upload cut off by an earlier version) has no such end, and is uploaded again.
    """
    from pyarrow.fs import FileType

    def read_end() -> bytes | None:
        info = filesystem.get_file_info(key)
        if info.type != FileType.File:
            return None
        with filesystem.open_input_file(key) as stored:
            size = stored.size()
            start = max(0, size - _ZIP_END_SEARCH_BYTES)
            stored.seek(start)
            return stored.read(size - start) + struct.pack("<Q", size)

    ending = calling_storage(lambda: object_store.call_object_store(read_end, settings, key))
    return ending is not None and _ends_a_whole_zip(ending[:-8], struct.unpack("<Q", ending[-8:])[0])


# A zip ends with its end-of-central-directory record (22 bytes and a comment of at most 64 KiB).
_ZIP_END_SEARCH_BYTES = 22 + 65535
_ZIP_END_SIGNATURE = b"PK\x05\x06"


def _ends_a_whole_zip(tail: bytes, size: int) -> bool:
    at = tail.rfind(_ZIP_END_SIGNATURE)
    if at < 0 or len(tail) - at < 22:
        return False
    directory_size, directory_offset, comment = struct.unpack("<IIH", tail[at + 12:at + 22])
    end_at = size - (len(tail) - at)
    return directory_offset + directory_size == end_at and at + 22 + comment == len(tail)


def _size(size_bytes: int) -> str:
    amount = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"
