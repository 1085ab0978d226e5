"""Packaging a runtime_env's local directories as Ray does and uploading them to S3.

KubeRay submits a job from inside the cluster, where the laptop's ``working_dir`` does
not exist. Ray itself can fetch a working_dir from ``s3://…zip``, so the directory is
zipped here with Ray's own packaging code (same excludes, same content-hash name
``_ray_pkg_<hash>.zip``) and put in a bucket. The same contents always get the same
name, so an unchanged directory is uploaded once.

How the object store is reached (the AWS variables) is :mod:`jobs.infra.storage`'s.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jobs.infra import storage as object_store
from jobs.infra import ray_internals
from jobs.infra.storage import S3Settings, StorageLocation
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
                name = ray_internals.package_name(directory, patterns)
            if include_parent_dir:
                name = name.removesuffix(".zip") + MODULE_PACKAGE_SUFFIX
            package_location = location / name
            uri = package_location.uri
            # Named by a hash of its contents, and an S3 object appears whole or not at all: one that is
            # there is this very package, so it is neither zipped nor sent again.
            if object_exists(filesystem, package_location.fs_path, settings):
                say(f"{field_name} {directory} is already uploaded as {uri} (same contents)")
            else:
                _, package = package_directory(directory, patterns, include_parent_dir, Path(scratch))
                if include_parent_dir:
                    package = nested_one_level(package, Path(scratch) / name)
                upload_file(filesystem, package, package_location.fs_path, settings)
                say(f"uploaded {field_name} {directory} ({_size(package.stat().st_size)}) as {uri}")
            uploaded[str(directory)] = uri
    if result.get("working_dir") in uploaded:
        result["working_dir"] = uploaded[result["working_dir"]]
    if result.get("py_modules"):
        result["py_modules"] = [uploaded.get(module, module) for module in result["py_modules"]]
    result.pop("excludes", None)
    return result


def package_directory(directory: Path, excludes: list[str], include_parent_dir: bool,
                      scratch: Path) -> tuple[str, Path]:
    """Zip ``directory`` with Ray's packaging code; return the package's name (``_ray_pkg_<hash>.zip``) and file."""
    with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
        name = ray_internals.package_name(directory, excludes)
        target = scratch / name
        ray_internals.create_package(directory, target, excludes, include_parent_dir, _QUIET)
    return name, target


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


def object_exists(filesystem: Any, key: str, settings: S3Settings) -> bool:
    """Whether an object is stored at ``key``."""
    from pyarrow.fs import FileType

    found = calling_storage(lambda: object_store.call_object_store(lambda: filesystem.get_file_info(key),
                                                                    settings, key))
    return found.type == FileType.File


def upload_file(filesystem: Any, package: Path, key: str, settings: S3Settings) -> None:
    """Copy ``package`` to ``key``, in chunks (a package may be larger than memory allows at once)."""
    def copy_it() -> None:
        with package.open("rb") as source, filesystem.open_output_stream(key) as target:
            while chunk := source.read(8 * 1024 * 1024):
                target.write(chunk)

    calling_storage(lambda: object_store.call_object_store(copy_it, settings, key))


def _size(size_bytes: int) -> str:
    amount = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"
