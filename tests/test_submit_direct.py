"""A job that Ray's client has nothing to do for (no upload, no runtime_env to check) is sent
straight to the job API, without importing ray: the same request body, the same Ctrl-C accounting."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from runner.client.connection import Connection
from runner.errors import ClusterRequestFailed
from runner.client.submission import SubmitInterrupted, job_request, needs_ray_client, submit_job
from tests.support.cli import REPO_ROOT

ID = "raysubmit_directdirectdire"
META = {"rayjobs.name": "demo", "rayjobs.spec_hash": "0123456789abcdef"}
CONNECTION = Connection(address="http://127.0.0.1:1", source="test")

SUBMISSIONS = {
    "bare": {"entrypoint": "echo hi", "metadata": META},
    "env_vars": {"entrypoint": "echo hi", "runtime_env": {"env_vars": {"A": "1", "B": "two"}}, "metadata": META},
    "empty_env_vars": {"entrypoint": "echo hi", "runtime_env": {"env_vars": {}}, "metadata": {}},
    "resources": {"entrypoint": "echo hi", "entrypoint_num_cpus": 0.5, "entrypoint_num_gpus": 0,
                  "entrypoint_memory": 2**30, "entrypoint_resources": {"custom": 1.0},
                  "entrypoint_label_selector": {"zone": "a"}, "metadata": META},
}


class Rest:
    """The two calls the direct path makes, recorded; either may raise what ``fail`` names."""

    def __init__(self, ray_version: str = "2.60.0", fail: dict[str, BaseException] | None = None) -> None:
        self.ray_version = ray_version
        self.fail = fail or {}
        self.calls: list[tuple[str, Any]] = []

    def version(self) -> dict[str, Any]:
        self.calls.append(("version", None))
        if "version" in self.fail:
            raise self.fail["version"]
        return {"ray_version": self.ray_version}

    def create_job(self, request: dict[str, Any]) -> str:
        self.calls.append(("create_job", request))
        if "create_job" in self.fail:
            raise self.fail["create_job"]
        return request["submission_id"]


@pytest.mark.parametrize("name", list(SUBMISSIONS))
def test_the_request_body_is_the_one_rays_client_sends(name, monkeypatch):
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient
    from ray.job_submission import JobSubmissionClient

    sent: list[dict[str, Any]] = []

    class Answer:
        status_code = 200

        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        def json(self) -> dict[str, Any]:
            return self.body

        def raise_for_status(self) -> None:
            pass

    def do_request(self, method, endpoint, *, data=None, json_data=None, **kwargs):
        if method == "GET":
            return Answer({"ray_version": "2.60.0"})
        sent.append(json_data)
        return Answer({"submission_id": json_data["submission_id"], "job_id": json_data["submission_id"]})

    monkeypatch.setattr(SubmissionClient, "_do_request", do_request)
    submission = {**SUBMISSIONS[name], "submission_id": ID}
    JobSubmissionClient(CONNECTION.address).submit_job(**submission)

    assert not needs_ray_client(submission)
    assert sent == [job_request(submission)]


def test_a_runtime_env_beyond_env_vars_goes_through_rays_client():
    for runtime_env in ({"working_dir": "/tmp/x"}, {"pip": ["requests"]}, {"env_vars": {"A": "1"}, "py_modules": []},
                        {"config": {"setup_timeout_seconds": 60}}):
        assert needs_ray_client({"entrypoint": "echo hi", "runtime_env": runtime_env})


def test_direct_submission_sends_the_request_and_returns_the_id():
    rest = Rest()
    job_id = submit_job(CONNECTION, dict(SUBMISSIONS["env_vars"]), rest=rest)
    assert job_id.startswith("raysubmit_")
    assert rest.calls == [("create_job", job_request({**SUBMISSIONS["env_vars"], "submission_id": job_id}))]


def test_fields_newer_than_the_cluster_are_refused_as_rays_client_does():
    # Ray's client asks the cluster's version only when such a field is set (see the test above).
    for fields, old_version in (({"entrypoint_num_cpus": 1}, "2.1.0"), ({"entrypoint_memory": 2**30}, "2.7.2")):
        rest = Rest(ray_version=old_version)
        with pytest.raises(ClusterRequestFailed, match=f"Ray version {old_version} is running on the cluster"):
            submit_job(CONNECTION, {"entrypoint": "echo hi", **fields}, rest=rest)
        assert [call for call, _ in rest.calls] == ["version"]
    rest = Rest(ray_version="2.8.0")
    submit_job(CONNECTION, {"entrypoint": "echo hi", "entrypoint_memory": 2**30, "entrypoint_num_cpus": 1}, rest=rest)
    assert [call for call, _ in rest.calls] == ["version", "version", "create_job"]


def test_ctrl_c_before_the_job_request_submitted_nothing():
    rest = Rest(fail={"version": KeyboardInterrupt()})
    with pytest.raises(SubmitInterrupted) as interrupted:
        submit_job(CONNECTION, {"entrypoint": "echo hi", "entrypoint_num_cpus": 1}, rest=rest)
    assert interrupted.value.submission_id is None


def test_ctrl_c_during_the_job_request_names_the_job_it_may_have_created():
    rest = Rest(fail={"create_job": KeyboardInterrupt()})
    with pytest.raises(SubmitInterrupted) as interrupted:
        submit_job(CONNECTION, {"entrypoint": "echo hi", "submission_id": ID}, rest=rest)
    assert interrupted.value.submission_id == ID and not interrupted.value.answered


def test_direct_submission_does_not_import_ray():
    script = (
        "import sys\n"
        "from runner.client.connection import Connection\n"
        "from runner.client.submission import submit_job\n"
        "class Rest:\n"
        "    def version(self): return {'ray_version': '2.60.0'}\n"
        "    def create_job(self, request): return request['submission_id']\n"
        "submit_job(Connection(address='http://127.0.0.1:1', source='test'),\n"
        "           {'entrypoint': 'echo hi', 'runtime_env': {'env_vars': {'A': '1'}}, 'entrypoint_num_cpus': 1},\n"
        "           rest=Rest())\n"
        "print(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


class PackageRest(Rest):
    """The direct path's calls, with a cluster's package store: names it holds, and the bytes sent to it."""

    def __init__(self) -> None:
        super().__init__()
        self.packages: dict[str, bytes] = {}

    def ensure_package(self, name: str, data: bytes) -> bool:
        self.calls.append(("ensure_package", name))
        if name in self.packages:
            return False
        self.packages[name] = data
        return True


def test_a_job_that_only_keeps_a_record_ships_the_observer_without_rays_client(tmp_path):
    import io
    import zipfile

    from jobs.loader import load_spec
    from jobs.submission import AGENT_PACKAGE_DIR, build_submission

    spec = tmp_path / "plain.yaml"
    spec.write_text(f"name: plain\nentrypoint: echo hi\nrecord_path: {tmp_path / 'records'}\n")
    submission = build_submission(load_spec(spec, []))
    assert submission["runtime_env"]["py_modules"] == [str(AGENT_PACKAGE_DIR)]
    assert not needs_ray_client(submission), "the record alone keeps a job on the direct path"
    rest = PackageRest()
    for _ in range(2):
        submit_job(CONNECTION, submission, rest=rest)
    (name,) = rest.packages
    sent = [request for call, request in rest.calls if call == "create_job"]
    assert [request["runtime_env"]["py_modules"] for request in sent] == [[f"gcs://{name}"]] * 2
    assert [call for call, _ in rest.calls].count("ensure_package") == 2 and len(rest.packages) == 1
    names = zipfile.ZipFile(io.BytesIO(rest.packages[name])).namelist()
    assert "rayjobs_agent/supervisor.py" in names and not any("__pycache__" in entry for entry in names)


def test_the_agent_ships_one_package_under_one_content_addressed_name():
    import io
    import zipfile

    from rayjobs_agent.package import AGENT_PACKAGE_DIR, agent_modules_sent, agent_package

    name, data = agent_package()
    assert agent_package() == (name, data) and name.startswith("_ray_pkg_") and name.endswith(".zip")
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "rayjobs_agent/package.py" in names and "rayjobs_agent/queue/keeper.py" in names
    assert not [entry for entry in names if "__pycache__" in entry or not entry.startswith("rayjobs_agent/")]
    sent = agent_modules_sent(["/code/lib", str(AGENT_PACKAGE_DIR)], ["gcs://_ray_pkg_lib.zip", f"gcs://{name}"])
    assert sent == [f"gcs://{name}"]
