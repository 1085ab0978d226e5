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
from rayjobs_agent.wording import format_bytes


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
                say(f"uploaded {field_name} {directory} ({format_bytes(package.stat().st_size)}) as {package_location.uri}")
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
# S3's documented limits: one CopyObject copies at most 5 GiB; a multipart upload has at most 10,000 parts, each
# at least 5 MiB but the last.
S3_SINGLE_COPY_LIMIT_BYTES = 5 * 1024**3
S3_MIN_PART_BYTES = 5 * 1024**2
S3_MAX_PARTS = 10_000
# Parts of a copy above the limit: a 6 GiB package is copied in 12.
COPY_PART_BYTES = 512 * 1024**2
# How long one part's copy may keep the store silent (S3 copies inside the request).
_PART_COPY_TIMEOUT_S = 300
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


def upload_file(filesystem: Any, package: Path, key: str, settings: S3Settings, *,
                single_copy_limit_bytes: int = S3_SINGLE_COPY_LIMIT_BYTES, part_bytes: int = COPY_PART_BYTES) -> None:
    """Copy ``package`` to ``key``, in chunks (a package may be larger than memory allows at once), through a
    temporary key: ``key`` itself appears only once the whole package is stored.

    An upload stopped half-way (Ctrl-C, a lost connection) would otherwise leave a truncated object under the
    package's name, which every later submission trusts: pyarrow completes an output stream on close, even
    one closed by an exception. The move from the temporary key is one copy up to ``single_copy_limit_bytes``
    (S3's limit for one), and a copy in parts of ``part_bytes`` above it (:func:`move_in_parts`).
    """
    partial = f"{key}.partial-{secrets.token_hex(6)}"
    size = package.stat().st_size

    def send() -> None:
        with package.open("rb") as source, filesystem.open_output_stream(partial) as target:
            while chunk := source.read(UPLOAD_CHUNK_BYTES):
                target.write(chunk)

    try:
        calling_storage(lambda: object_store.call_object_store(send, settings, key))
        # Either way a copy on S3: the key appears complete or not at all.
        if size <= single_copy_limit_bytes:
            calling_storage(lambda: object_store.call_object_store(lambda: filesystem.move(partial, key), settings,
                                                                   key))
            return
        calling_storage(lambda: move_in_parts(settings, partial, key, size, part_bytes))
    except BaseException:
        try:
            filesystem.delete_file(partial)
        except Exception:  # noqa: BLE001 - what is left under a temporary key is never trusted anyway
            pass
        raise


def move_in_parts(settings: S3Settings, source: str, destination: str, size: int,
                  part_bytes: int = COPY_PART_BYTES) -> None:
    """Move the object at ``source`` (``bucket/key``, ``size`` bytes) to ``destination``, copied in parts with S3's
    UploadPartCopy (one CopyObject copies at most 5 GiB), then deleted.

    ``destination`` appears only when the last part is in (S3 publishes a multipart upload whole, on completion),
    and a copy that fails or is interrupted is aborted, so that S3 keeps none of its parts. Parts are
    ``part_bytes`` (at least S3's 5 MiB), more where S3's 10,000 parts would not hold the object.

    Raises:
        ObjectStoreError: of the kind the store's answer amounts to (:mod:`rayjobs_agent.s3_access`).
    """
    import botocore.exceptions

    source_bucket, source_key = source.split("/", 1)
    bucket, key = destination.split("/", 1)
    part = max(part_bytes, S3_MIN_PART_BYTES, -(-size // S3_MAX_PARTS))
    try:
        client = _s3_client(settings)
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, part), start=1):
                answer = client.upload_part_copy(
                    Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                    CopySource={"Bucket": source_bucket, "Key": source_key},
                    CopySourceRange=f"bytes={start}-{min(start + part, size) - 1}")
                parts.append({"PartNumber": number, "ETag": answer["CopyPartResult"]["ETag"]})
            client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                             MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            except Exception:  # noqa: BLE001 - S3 drops an upload never completed by its lifecycle rules, if any
                pass
            raise
        try:
            client.delete_object(Bucket=source_bucket, Key=source_key)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            pass  # the package is whole under its name; what is left under a temporary key is never trusted
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise object_store.object_store_error(str(exc), settings, destination) from None


def _s3_client(settings: S3Settings) -> Any:
    """boto3's S3 client for ``settings`` (pyarrow's filesystem has no copy in parts), with the same short timeouts
    to connect and few retries; a part's copy may take the store a while to answer."""
    import boto3
    from botocore.config import Config

    endpoint = settings.endpoint
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=settings.region or (object_store.DEFAULT_REGION if endpoint else None),
        aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.session_token,
        config=Config(connect_timeout=object_store.CONNECT_TIMEOUT_S, read_timeout=_PART_COPY_TIMEOUT_S,
                      retries={"max_attempts": object_store.MAX_ATTEMPTS, "mode": "standard"}))


def whole_zip_stored(filesystem: Any, key: str, settings: S3Settings) -> bool:
    """Whether a whole zip is stored at ``key``: its central directory, written last, ends it where it says (in the
    ZIP64 end record of a package of more than 65,535 files or past 4 GiB).

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


# A zip ends with its end-of-central-directory record (22 bytes and a comment of at most 64 KiB). One of more than
# 65,535 files, or past 4 GiB, has its directory's size and place in a ZIP64 end record (56 bytes) instead, which a
# locator (20 bytes) just before the end record points at.
_ZIP_END_BYTES = 22
_ZIP64_LOCATOR_BYTES = 20
_ZIP64_END_BYTES = 56
_ZIP_END_SEARCH_BYTES = _ZIP64_END_BYTES + _ZIP64_LOCATOR_BYTES + _ZIP_END_BYTES + 65535
_ZIP_END_SIGNATURE = b"PK\x05\x06"
_ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
_ZIP64_END_SIGNATURE = b"PK\x06\x06"


def _ends_a_whole_zip(tail: bytes, size: int) -> bool:
    """Whether ``tail``, the last bytes of an object of ``size`` bytes, ends a whole zip: its end record ends the
    object, and the central directory it names (in the ZIP64 end record where there is one) ends where the end
    records begin."""
    at = tail.rfind(_ZIP_END_SIGNATURE)
    if at < 0 or len(tail) - at < _ZIP_END_BYTES:
        return False
    directory_size, directory_offset, comment = struct.unpack("<IIH", tail[at + 12:at + _ZIP_END_BYTES])
    if at + _ZIP_END_BYTES + comment != len(tail):
        return False
    starts_at = size - len(tail)  # where the tail begins in the object
    locator = at - _ZIP64_LOCATOR_BYTES
    if locator >= 0 and tail[locator:locator + 4] == _ZIP64_LOCATOR_SIGNATURE:
        (record_offset,) = struct.unpack("<Q", tail[locator + 8:locator + 16])
        record = record_offset - starts_at
        if 0 <= record <= locator - _ZIP64_END_BYTES and tail[record:record + 4] == _ZIP64_END_SIGNATURE:
            (record_size,) = struct.unpack("<Q", tail[record + 4:record + 12])
            directory_size, directory_offset = struct.unpack("<QQ", tail[record + 40:record + 56])
            return record + 12 + record_size == locator and directory_offset + directory_size == record_offset
    return directory_offset + directory_size == starts_at + at


