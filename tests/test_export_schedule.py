"""`rayjobs export kuberay --schedule`: a RayCronJob that KubeRay's own CRD accepts, and schedules KubeRay would refuse
refused here first, with the reason and exit 2."""

from __future__ import annotations

import copy
import socket
from typing import Any

import jsonschema
import pytest
import yaml

from runner.errors import BadInput
from runner.export.schedule import check_schedule, check_time_zone
from tests.support.kuberay import (KUBERAY_SAMPLES, RAYCRONJOB_CRD, assert_operator_rules, closed_schema, export,
                                   schema_errors)

REMOTE_WORKING_DIR = "runtime_env.working_dir=s3://bucket/_ray_pkg_0123456789abcdef.zip"
SPEC = "specs/food101.yaml"


@pytest.fixture(scope="session")
def raycronjob_schema() -> jsonschema.protocols.Validator:
    """The v1 RayCronJob schema of KubeRay's CRD, with unknown fields made errors (as kubeconform does)."""
    return closed_schema(RAYCRONJOB_CRD)


def assert_valid_raycronjob(manifest: dict[str, Any], schema: jsonschema.protocols.Validator) -> None:
    """A RayCronJob the CRD's schema accepts, whose job template passes the operator's RayJob rules."""
    errors = schema_errors(manifest, schema)
    assert not errors, "\n".join(errors)
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCronJob")
    # The operator validates the template as the spec of a RayJob of the same name.
    assert_operator_rules({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": manifest["metadata"],
                           "spec": manifest["spec"]["jobTemplate"]})


def test_a_schedule_wraps_the_same_rayjob_in_a_raycronjob_the_crd_accepts(raycronjob_schema):
    code, rayjob, _ = export(SPEC, "--set", REMOTE_WORKING_DIR)
    assert code == 0
    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", "0 3 * * mon-fri",
                                   "--time-zone", "Europe/Paris")
    assert code == 0, stderr
    assert_valid_raycronjob(cronjob, raycronjob_schema)
    assert cronjob["metadata"] == rayjob["metadata"]
    template = dict(cronjob["spec"]["jobTemplate"])
    runtime_env = yaml.safe_load(template.pop("runtimeEnvYAML"))
    assert runtime_env["env_vars"].pop("RAYJOBS_RUN_PER_SUBMISSION") == "1"
    assert runtime_env == yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert {key: value for key, value in cronjob["spec"].items() if key != "jobTemplate"} == \
        {"schedule": "0 3 * * mon-fri", "timeZone": "Europe/Paris"}
    assert template == {key: value for key, value in rayjob["spec"].items() if key != "runtimeEnvYAML"}
    assert "RayCronJob feature gate" in stderr and "--feature-gates=RayCronJob=true" in stderr


def test_without_a_time_zone_the_schedule_runs_in_the_operators_and_says_so(raycronjob_schema):
    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", "*/30   6-18 * * *")
    assert code == 0, stderr
    assert_valid_raycronjob(cronjob, raycronjob_schema)
    assert cronjob["spec"]["schedule"] == "*/30 6-18 * * *"
    assert "timeZone" not in cronjob["spec"]
    assert "time zone of the operator's pod" in stderr


def test_a_fixed_submission_id_is_not_repeated_by_every_scheduled_run(raycronjob_schema):
    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--set", "submission_id=nightly-food101",
                                   "--cluster", "shared-cluster", "--schedule", "0 3 * * *")
    assert code == 0, stderr
    assert_valid_raycronjob(cronjob, raycronjob_schema)
    assert "jobId" not in cronjob["spec"]["jobTemplate"]
    assert cronjob["spec"]["jobTemplate"]["clusterSelector"] == {"ray.io/cluster": "shared-cluster"}
    assert "submission_id (nightly-food101) is dropped" in stderr


def test_scheduled_runs_of_a_queued_spec_are_not_created_suspended_since_kueue_never_sees_them(raycronjob_schema):
    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--set", "queue=team-a", "--schedule",
                                   "0 3 * * *")
    assert code == 0, stderr
    assert_valid_raycronjob(cronjob, raycronjob_schema)
    # The RayCronJob controller labels the RayJobs it creates with its own name only: suspended, none would run.
    assert "suspend" not in cronjob["spec"]["jobTemplate"]
    assert "Kueue does not queue the scheduled runs" in stderr


def test_kuberays_own_raycronjob_samples_pass_the_same_checks(raycronjob_schema):
    # Were the closed schema or the checks stricter than KubeRay, its own samples would fail them.
    samples = [(path.name, document) for path in sorted(KUBERAY_SAMPLES.glob("ray-cronjob*.yaml"))
               for document in yaml.safe_load_all(path.read_text()) if document and document["kind"] == "RayCronJob"]
    assert len(samples) == 2, f"expected KubeRay's RayCronJob samples in {KUBERAY_SAMPLES}"
    for name, sample in samples:
        assert_valid_raycronjob(sample, raycronjob_schema)
        assert check_schedule(sample["spec"]["schedule"]) == sample["spec"]["schedule"], name
        if "timeZone" in sample["spec"]:
            assert check_time_zone(sample["spec"]["timeZone"]) is None


def _without(*path: str):
    def mutate(manifest: dict[str, Any]) -> None:
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    return mutate


def _set(value: Any, *path: str):
    def mutate(manifest: dict[str, Any]) -> None:
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return mutate


@pytest.mark.parametrize(("mutate", "expected_error"), [
    pytest.param(_without("spec", "schedule"), "spec: 'schedule' is a required property", id="no schedule"),
    pytest.param(_without("spec", "jobTemplate"), "spec: 'jobTemplate' is a required property", id="no jobTemplate"),
    pytest.param(_set(300, "spec", "schedule"), "spec.schedule: 300 is not of type 'string'", id="schedule as a number"),
    pytest.param(_set("", "spec", "timeZone"), "spec.timeZone: '' should be non-empty", id="empty timeZone"),
    pytest.param(_set("yes", "spec", "suspend"), "spec.suspend: 'yes' is not of type 'boolean'", id="suspend as text"),
    pytest.param(_set("0 3 * * *", "spec", "scheduel"),
                 "spec: Additional properties are not allowed ('scheduel' was unexpected)", id="misspelled field"),
    # The job template is the RayJob schema itself, closed as deep as the RayJob's own.
    pytest.param(_set("python x.py", "spec", "jobTemplate", "entrypont"),
                 "spec.jobTemplate: Additional properties are not allowed ('entrypont' was unexpected)",
                 id="misspelled field in the job template"),
    pytest.param(_set("600", "spec", "jobTemplate", "ttlSecondsAfterFinished"),
                 "spec.jobTemplate.ttlSecondsAfterFinished: '600' is not of type 'integer'",
                 id="wrong type in the job template"),
])
def test_the_validator_rejects_a_raycronjob_with_one_field_broken(raycronjob_schema, mutate, expected_error):
    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", "0 3 * * *",
                                   "--time-zone", "UTC")
    assert code == 0, stderr
    assert_valid_raycronjob(cronjob, raycronjob_schema)  # intact, the same manifest passes
    broken = copy.deepcopy(cronjob)
    mutate(broken)
    assert expected_error in schema_errors(broken, raycronjob_schema)


@pytest.mark.parametrize("schedule", [
    "* * * * *", "0 3 * * *", "*/15 * * * *", "0 0-23/2 * * *", "5,35 9-17 * * 1-5", "0 3 1,15 * *",
    "0 3 * JAN-MAR,oct *", "30 6 * * mon-fri", "0 12 ? * SUN", "5/10 * * * *", "59 23 31 12 6",
])
def test_schedules_kuberay_parses_are_taken(schedule):
    assert check_schedule(schedule) == schedule


@pytest.mark.parametrize(("schedule", "reason"), [
    ("0 3 * *", "it has 4 fields, not 5"),
    ("0 0 3 * * *", "it has 6 fields, not 5 (a leading seconds field is not taken)"),
    ("60 * * * *", "the minute field (1st), '60', has 60, outside 0-59"),
    ("0 24 * * *", "the hour field (2nd), '24', has 24, outside 0-23"),
    ("0 3 0 * *", "the day of month field (3rd), '0', has 0, outside 1-31"),
    ("0 3 * 13 *", "the month field (4th), '13', has 13, outside 1-12"),
    ("0 3 * * 7", "the day of week field (5th), '7', has 7, outside 0-6 (Sunday is 0)"),
    ("0 3 * smarch *", "the month field (4th), 'smarch', has 'smarch', which is not a number or a month's first"),
    ("0 3 * * fri-mon", "the day of week field (5th), 'fri-mon', has the range fri-mon, which runs backwards"),
    ("*/0 * * * *", "the minute field (1st), '*/0', has a step of '0'"),
    ("0 3 1,,15 * *", "the day of month field (3rd), '1,,15', has an empty item in its list"),
    ("0 3 L * *", "the day of month field (3rd), 'L', has 'L', which is not a number"),
    ("0 3 * * 1#2", "the day of week field (5th), '1#2', is not a number, a range, a step or a list of them"),
    ("@daily", "@daily is \"0 0 * * *\" in five fields: give that"),
    ("CRON_TZ=Europe/Paris 0 3 * * *", "KubeRay takes no TZ= or CRON_TZ= in the schedule: give --time-zone"),
    ("", "it is empty"),
])
def test_a_schedule_kuberay_would_refuse_is_bad_input_naming_the_field(schedule, reason):
    code, manifest, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", schedule)
    assert code == 2 and manifest is None
    assert f"--schedule {schedule!r} is not a schedule KubeRay runs: {reason}" in stderr
    assert "A schedule is five fields" in stderr  # what a valid one looks like, in the same paragraph
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


@pytest.mark.parametrize(("zone", "expected"), [
    ("Europe/paris", "Did you mean Europe/Paris"),
    ("Mars/Olympus_Mons", "is not a time zone of the IANA database"),
    ("Europe", "is not a time zone of the IANA database"),
    ("Local", "leave --time-zone out to use the time zone of the operator's pod"),
])
def test_an_unknown_time_zone_is_bad_input(zone, expected):
    code, manifest, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", "0 3 * * *",
                                    "--time-zone", zone)
    assert code == 2 and manifest is None
    assert f"--time-zone {zone!r}" in stderr and expected in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_time_zone_without_a_schedule_is_bad_input():
    code, manifest, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--time-zone", "UTC")
    assert code == 2 and manifest is None
    assert "--time-zone UTC is given without --schedule" in stderr


def test_a_bad_schedule_is_refused_before_anything_is_uploaded(tmp_path, monkeypatch):
    # Were the upload tried first, this unreachable store would end the command with exit 4 instead.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    (tmp_path / "main.py").write_text("print('hello')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: nightly\nentrypoint: python main.py\nruntime_env:\n  working_dir: {tmp_path}\n")
    code, _, stderr = export(str(spec), "--upload-to", "s3://bucket/pkg", "--schedule", "0 3 * * 8")
    assert code == 2, stderr
    assert "the day of week field (5th)" in stderr and "object store" not in stderr


def test_check_time_zone_takes_iana_names():
    for zone in ("UTC", "Europe/Paris", "America/Argentina/Buenos_Aires", "Etc/GMT+3"):
        assert check_time_zone(zone) is None
    with pytest.raises(BadInput):
        check_time_zone(" Europe/Paris")


def test_each_scheduled_run_is_a_new_run_in_a_folder_of_its_own_for_the_workload_and_its_record(tmp_path,
                                                                                                 monkeypatch):
    """Two runs of the schedule, as the RayJobs KubeRay makes of its template: its variables, each its own id."""
    import json

    from jobs.loader import load_spec
    from jobs.submission import build_submission
    from workloads.params import load_params
    from rayjobs_agent.recorder import Recorder
    from workloads.vision.config import VisionParams

    code, cronjob, stderr = export(SPEC, "--set", REMOTE_WORKING_DIR, "--schedule", "0 3 * * *")
    assert code == 0, stderr
    scheduled = yaml.safe_load(cronjob["spec"]["jobTemplate"]["runtimeEnvYAML"])["env_vars"]
    # The same spec with its record kept (the exported one needs --upload-to for the record keeper's package).
    loaded = load_spec(SPEC, overrides=[f"workload.storage_path={tmp_path}"])
    env_vars = {**build_submission(loaded)["runtime_env"]["env_vars"],
                "RAYJOBS_RUN_PER_SUBMISSION": scheduled["RAYJOBS_RUN_PER_SUBMISSION"]}
    folders = []
    for submission in ("nightly-1", "nightly-2"):
        environ = {**env_vars, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"metadata": {"job_submission_id":
                                                                                          submission}})}
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        params = load_params(VisionParams)
        recorder = Recorder.from_environment(environ, json.loads(environ["RAYJOBS_RECORD"]))
        assert recorder is not None
        assert recorder.store.location == str(params.run_dir)
        folders.append(str(params.run_dir))
    assert folders[0] != folders[1] and folders[0].endswith("food101-lite-nightly-1")
    assert folders[1].endswith("food101-lite-nightly-2")
