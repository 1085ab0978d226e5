"""Where a job's code goes: through the dashboard, or through object storage when asked or when it must."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from jobs.errors import SpecError
from jobs.loader import load_spec
from jobs.submission import build_submission
from runner.run.code_upload import DASHBOARD_UPLOAD_LIMIT_BYTES, code_destination

TOO_LARGE = DASHBOARD_UPLOAD_LIMIT_BYTES + 1


def _spec(tmp_path: Path, extra: str = "") -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "main.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent("""\
        name: big
        entrypoint: python main.py
        runtime_env:
          working_dir: code
        """) + extra)
    return spec


def _destination(spec: Path, size: int, overrides: list[str] | None = None):
    loaded = load_spec(spec, overrides or [])
    return code_destination(loaded, build_submission(loaded), lambda directory, excludes: size)


def test_code_path_sends_any_local_code_through_object_storage(tmp_path):
    destination = _destination(_spec(tmp_path, "code_path: s3://team-code/jobs/\n"), size=10)
    assert destination is not None and destination.uri == "s3://team-code/jobs"


def test_a_working_dir_too_large_for_the_dashboard_goes_to_the_records_object_storage(tmp_path):
    destination = _destination(_spec(tmp_path, "record_path: s3://runs/records\n"), size=TOO_LARGE)
    assert destination is not None
    assert destination.uri == "s3://runs/records/rayjobs-code"
    assert "100 MiB" in destination.reason


def test_a_working_dir_the_dashboard_takes_goes_through_it(tmp_path):
    assert _destination(_spec(tmp_path, "record_path: s3://runs/records\n"),
                        size=DASHBOARD_UPLOAD_LIMIT_BYTES - 1) is None


def test_without_object_storage_a_large_working_dir_is_left_to_the_dashboards_own_refusal(tmp_path):
    assert _destination(_spec(tmp_path), size=TOO_LARGE) is None


def test_a_workloads_s3_storage_path_serves_as_the_code_location(tmp_path):
    quickstart = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"
    destination = _destination(quickstart, size=TOO_LARGE,
                               overrides=["workload.storage_path=s3://results/runs"])
    assert destination is not None and destination.uri == "s3://results/runs/rayjobs-code"


@pytest.mark.parametrize("value", ["/tmp/code", "gs://bucket/code", "s3://"])
def test_code_path_must_be_an_s3_location(tmp_path, value):
    with pytest.raises(SpecError, match="code_path"):
        load_spec(_spec(tmp_path), [f"code_path={value}"])


# --- packages stored in a real S3 server (moto's, on loopback): whole or not, and moved whole past S3's copy limit ---

BUCKET = "rayjobs-code"


@pytest.fixture
def bucket(s3_endpoint, aws_env):
    from rayjobs_agent.s3_access import S3Settings
    from rayjobs_agent.storage_location import StorageLocation
    from tests.support.s3_server import create_bucket

    create_bucket(s3_endpoint, BUCKET)
    settings = S3Settings.from_env(aws_env)
    return StorageLocation.parse(f"s3://{BUCKET}").filesystem(settings), settings


def _zip_of(path: Path, files: int) -> Path:
    """A zip of ``files`` empty files, written as Ray's packaging writes one (Python's zipfile)."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as package:
        for number in range(files):
            package.writestr(f"d{number // 1000}/f{number}.py", b"")
    return path


def _zip64_end_records(tail: bytes) -> bool:
    return tail[-22 - 20:-22].startswith(b"PK\x06\x07") and tail[-22 - 20 - 56:-22 - 20].startswith(b"PK\x06\x06")


def test_a_package_of_more_than_65535_files_stored_whole_is_trusted_and_a_cut_one_is_not(tmp_path, bucket,
                                                                                        s3_endpoint):
    from runner.export.packaging import upload_file, whole_zip_stored
    from tests.support.s3_server import s3_client

    filesystem, settings = bucket
    package = _zip_of(tmp_path / "many.zip", 65_536)
    whole = package.read_bytes()
    assert _zip64_end_records(whole), "more than 65,535 entries: zipfile writes the ZIP64 end records"
    upload_file(filesystem, package, f"{BUCKET}/many.zip", settings)
    assert whole_zip_stored(filesystem, f"{BUCKET}/many.zip", settings), "uploaded again at every submission"
    for cut in (whole[:-1], whole[:len(whole) // 2], whole[:-22]):
        s3_client(s3_endpoint).put_object(Bucket=BUCKET, Key="cut.zip", Body=cut)
        assert not whole_zip_stored(filesystem, f"{BUCKET}/cut.zip", settings)


def test_a_package_past_4_gib_is_trusted_by_its_zip64_end_record(tmp_path):
    """The central directory starts past 4 GiB (a sparse file ahead of the zip, as a self-extracting archive has):
    the plain end record cannot hold its place, and says 0xFFFFFFFF."""
    import struct
    import zipfile

    from pyarrow.fs import LocalFileSystem

    from rayjobs_agent.s3_access import S3Settings
    from runner.export.packaging import whole_zip_stored

    path = tmp_path / "past-4-gib.zip"
    with path.open("wb") as handle:
        handle.truncate(4 * 2**30 + 1)
    if path.stat().st_blocks * 512 > 2**20:
        pytest.skip(f"{tmp_path} has no sparse files: the test would write 4 GiB")
    with zipfile.ZipFile(path, "a") as package:  # after data that is not a zip: appended, as to an executable
        package.writestr("main.py", b"print('hi')\n")
    with path.open("rb") as handle:
        handle.seek(-200, 2)
        tail = handle.read()
    assert _zip64_end_records(tail) and struct.unpack("<I", tail[-22 + 16:-22 + 20]) == (0xFFFFFFFF,)
    with zipfile.ZipFile(path) as package:
        assert package.read("main.py") == b"print('hi')\n"
    settings = S3Settings.from_env({})
    assert whole_zip_stored(LocalFileSystem(), str(path), settings)
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size - 1)
    assert not whole_zip_stored(LocalFileSystem(), str(path), settings)


def test_a_package_over_s3s_single_copy_limit_is_moved_in_parts_byte_for_byte(tmp_path, bucket, s3_endpoint):
    """S3's CopyObject stops at 5 GiB; here the limit is lowered to 1 MiB, the parts are S3's least (5 MiB)."""
    import os

    from runner.export.packaging import S3_MIN_PART_BYTES, upload_file
    from tests.support.s3_server import object_keys, s3_client

    filesystem, settings = bucket
    package = tmp_path / "big.zip"
    package.write_bytes(os.urandom(2 * S3_MIN_PART_BYTES + 123_457))
    upload_file(filesystem, package, f"{BUCKET}/big/pkg.zip", settings, single_copy_limit_bytes=2**20,
                part_bytes=S3_MIN_PART_BYTES)
    s3 = s3_client(s3_endpoint)
    stored = s3.get_object(Bucket=BUCKET, Key="big/pkg.zip")
    assert stored["Body"].read() == package.read_bytes()
    assert stored["ETag"].endswith('-3"'), "copied in three parts (5 MiB, 5 MiB, the rest)"
    assert object_keys(s3_endpoint, BUCKET, "big/") == ["big/pkg.zip"], "the temporary key is gone"
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_a_copy_in_parts_cut_off_publishes_nothing_and_leaves_no_parts(tmp_path, bucket, s3_endpoint, monkeypatch):
    import os

    from runner.export import packaging
    from tests.support.s3_server import object_keys, s3_client

    filesystem, settings = bucket
    package = tmp_path / "big.zip"
    package.write_bytes(os.urandom(2 * packaging.S3_MIN_PART_BYTES + 1))
    real_client = packaging._s3_client

    class CutAtSecondPart:
        """The store's client, interrupted (Ctrl-C) as the second part's copy is asked for."""

        def __init__(self, client):
            self.client, self.parts = client, 0

        def upload_part_copy(self, **request):
            self.parts += 1
            if self.parts == 2:
                raise KeyboardInterrupt
            return self.client.upload_part_copy(**request)

        def __getattr__(self, name):
            return getattr(self.client, name)

    monkeypatch.setattr(packaging, "_s3_client", lambda settings: CutAtSecondPart(real_client(settings)))
    with pytest.raises(KeyboardInterrupt):
        packaging.upload_file(filesystem, package, f"{BUCKET}/cut/pkg.zip", settings, single_copy_limit_bytes=2**20,
                              part_bytes=packaging.S3_MIN_PART_BYTES)
    left = [name for name in object_keys(s3_endpoint, BUCKET, "cut/") if not name.endswith("/")]
    assert left == [], "neither the package's name nor the temporary key"
    assert not s3_client(s3_endpoint).list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "the parts are dropped"
