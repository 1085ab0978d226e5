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
