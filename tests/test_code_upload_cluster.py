"""Code larger than the dashboard takes runs all the same: it goes through object storage, once per content.

The cluster is the module's own, started through the CLI with the S3 server's variables in its
environment: Ray's runtime environment agent, not the job, downloads the package.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from tests.support.cli import cli_env, own_cluster, run_rayjobs
from tests.support.s3_server import aws_variables, create_bucket, object_keys

BUCKET = "team-code"
CODE_MIB = 150
CHECK_SCRIPT = """
import hashlib, pathlib
digest = hashlib.sha256()
with open("blob.bin", "rb") as handle:
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
print("blob", pathlib.Path("blob.bin").stat().st_size, digest.hexdigest(), flush=True)
"""


@pytest.fixture(scope="module")
def big_code(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A working_dir of 150 MiB of random bytes (zip cannot shrink it under the limit) and the blob's SHA-256."""
    code = tmp_path_factory.mktemp("big-code")
    digest = hashlib.sha256()
    with (code / "blob.bin").open("wb") as handle:
        for _ in range(CODE_MIB):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            handle.write(chunk)
    (code / "check.py").write_text(CHECK_SCRIPT)
    return code, digest.hexdigest()


@pytest.mark.cluster  # its own cluster: its nodes need the bucket's credentials in their environment
def test_a_150_mib_working_dir_runs_through_object_storage_and_is_uploaded_once(tmp_path, s3_endpoint, big_code):
    code, digest = big_code
    create_bucket(s3_endpoint, BUCKET)
    home = tmp_path / "home"
    env = cli_env(home, **aws_variables(s3_endpoint))
    spec = tmp_path / "big.yaml"
    # The job runs under the run record's keeper, which comes from the observer's package in S3 too: both
    # packages must unpack so that their modules import as they do from a direct upload.
    spec.write_text(f"name: big-code\nentrypoint: python check.py\ncode_path: s3://{BUCKET}/packages\n"
                    f"record_path: {tmp_path / 'records'}\nruntime_env:\n  working_dir: {code}\n")

    with own_cluster("code-from-s3", home, env):
        first = run_rayjobs("submit", str(spec), "--cluster", "code-from-s3", home=home, env=env, timeout=600)
        assert first.returncode == 0, first.stderr
        assert f"blob {CODE_MIB * 2**20} {digest}" in first.stdout, first.stdout + first.stderr
        uploaded = re.search(r"uploaded working_dir \S+ \([^)]*\) as (s3://\S+)", first.stderr)
        assert uploaded is not None, first.stderr
        package = uploaded.group(1)
        assert package.removeprefix(f"s3://{BUCKET}/") in object_keys(s3_endpoint, BUCKET, "packages/")

        second = run_rayjobs("submit", str(spec), "--cluster", "code-from-s3", home=home, env=env, timeout=600)
        assert second.returncode == 0, second.stderr
        assert f"blob {CODE_MIB * 2**20} {digest}" in second.stdout, second.stdout + second.stderr
        # The same contents, the same package: found there, neither zipped nor sent again.
        assert f"working_dir {code} is already uploaded as {package}" in second.stderr, second.stderr
        assert "uploaded working_dir" not in second.stderr, second.stderr
        records = sorted((tmp_path / "records").iterdir())
        assert len(records) == 2 and all((record / "run.json").is_file() for record in records), records
