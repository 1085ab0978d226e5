"""KubeRay's CRDs, kept in tests/data/kuberay, as strict validators, and the operator's rules the schema does not hold."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from typer.testing import CliRunner

from runner.cli.app import app

# KubeRay's CRDs and samples, copied into the project (SOURCE.md there says from where).
KUBERAY_DIR = Path(__file__).resolve().parents[1] / "data" / "kuberay"
RAYJOB_CRD = KUBERAY_DIR / "ray.io_rayjobs.yaml"
RAYCRONJOB_CRD = KUBERAY_DIR / "ray.io_raycronjobs.yaml"
KUBERAY_SAMPLES = KUBERAY_DIR / "samples"
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MANAGERS = {"ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DELETION_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")


@lru_cache(maxsize=None)  # parsing a CRD takes over a second
def closed_schema(crd: Path) -> jsonschema.protocols.Validator:
    """The v1 schema of a KubeRay CRD, with unknown fields made errors (as kubeconform does)."""
    document = yaml.load(crd.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schema = next(v for v in document["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    _close_objects(schema)
    return jsonschema.Draft7Validator(schema)


def _close_objects(node: Any) -> None:
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)


def schema_errors(manifest: dict[str, Any], schema: jsonschema.protocols.Validator) -> list[str]:
    """Every schema error as `dotted.path: message`, in path order."""
    errors = sorted(schema.iter_errors(manifest), key=lambda error: list(map(str, error.absolute_path)))
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors]


def assert_valid_rayjob(manifest: dict[str, Any], schema: jsonschema.protocols.Validator) -> None:
    """A v1 RayJob that passes the CRD's schema, then the checks made outside it (`assert_operator_rules`)."""
    errors = schema_errors(manifest, schema)
    assert not errors, "\n".join(errors)
    assert_operator_rules(manifest)


def assert_operator_rules(manifest: dict[str, Any]) -> None:
    """What the API server and KubeRay's operator check beyond the schema before the operator acts on a RayJob."""
    # The schema types both as plain strings, yet the API server routes on them: a wrong pair never reaches KubeRay.
    # Checked here rather than with the schema so that the exports tested without it check them too.
    assert (manifest.get("apiVersion"), manifest.get("kind")) == ("ray.io/v1", "RayJob")
    name = manifest["metadata"]["name"]
    assert len(name) <= 47 and DNS_1035_LABEL.match(name)
    spec = manifest["spec"]
    selected = (spec.get("clusterSelector") or {}).get("ray.io/cluster")
    assert ("rayClusterSpec" in spec) != bool(selected), "exactly one of rayClusterSpec and clusterSelector"
    if spec.get("ttlSecondsAfterFinished", 0) > 0:
        assert spec.get("shutdownAfterJobFinishes") is True
    if "activeDeadlineSeconds" in spec:
        assert spec["activeDeadlineSeconds"] > 0
    if spec.get("backoffLimit", 0) > 0:
        assert not selected and spec.get("submissionMode") != "InteractiveMode"
    if spec.get("suspend"):
        assert spec.get("shutdownAfterJobFinishes") and not selected
    assert spec.get("submissionMode", "K8sJobMode") in SUBMISSION_MODES
    # The CRD's x-kubernetes-validations (CEL), which a JSON-Schema validator skips.
    if "managedBy" in spec:
        assert spec["managedBy"] in MANAGERS, f"managedBy {spec['managedBy']} is not a manager KubeRay knows"
    if "deletionStrategy" in spec:
        _assert_deletion_rules(spec, bool(selected))
    _assert_kueue_rules(manifest)
    if "runtimeEnvYAML" in spec:
        assert isinstance(yaml.safe_load(spec["runtimeEnvYAML"]), dict)
    if "entrypointResources" in spec:
        resources = json.loads(spec["entrypointResources"])
        assert all(isinstance(amount, (int, float)) for amount in resources.values())
    if "rayClusterSpec" in spec:
        cluster = spec["rayClusterSpec"]
        assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
        names = [group["groupName"] for group in cluster.get("workerGroupSpecs", [])]
        assert len(names) == len(set(names))
        for group in cluster.get("workerGroupSpecs", []):
            assert group["template"]["spec"]["containers"]
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def _assert_deletion_rules(spec: dict[str, Any], selected: bool) -> None:
    """The CRD's CEL rules on ``deletionStrategy`` and the operator's ``validateDeletionRules``."""
    strategy = spec["deletionStrategy"]
    legacy = "onSuccess" in strategy or "onFailure" in strategy
    assert legacy != ("deletionRules" in strategy), "either onSuccess and onFailure, or deletionRules"
    if legacy:
        assert "onSuccess" in strategy and "onFailure" in strategy
        return
    assert spec.get("shutdownAfterJobFinishes") is not True, "shutdownAfterJobFinishes and deletionRules exclude"
    ttls: dict[tuple[str, str], dict[str, int]] = {}
    for rule in strategy["deletionRules"]:
        condition = rule["condition"]
        assert ("jobStatus" in condition) != ("jobDeploymentStatus" in condition), "one condition per rule"
        assert not (selected and rule["policy"] in ("DeleteWorkers", "DeleteCluster"))
        by_policy = ttls.setdefault((condition.get("jobStatus", ""), condition.get("jobDeploymentStatus", "")), {})
        assert rule["policy"] not in by_policy, f"duplicate rule {rule}"
        by_policy[rule["policy"]] = condition.get("ttlSeconds", 0)
    for by_policy in ttls.values():
        ordered = [by_policy[policy] for policy in DELETION_ORDER if policy in by_policy]
        assert ordered == sorted(ordered), f"TTLs out of KubeRay's deletion order: {by_policy}"


def _assert_kueue_rules(manifest: dict[str, Any]) -> None:
    """What Kueue's RayJob webhook refuses, and what no controller would ever run."""
    spec = manifest["spec"]
    queued = KUEUE_QUEUE_LABEL in (manifest["metadata"].get("labels") or {})
    if queued and "rayClusterSpec" in spec:
        assert spec.get("shutdownAfterJobFinishes") is True, "a kueue managed job should delete the cluster"
    if spec.get("managedBy") == "kueue.x-k8s.io/multikueue":
        # KubeRay leaves it alone; only Kueue, through its queue, and with a cluster of the job's own, runs it.
        assert queued and "rayClusterSpec" in spec, "a MultiKueue RayJob needs a queue and a cluster of its own"


def export(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run `rayjobs export kuberay ARGS…` in-process: exit code, the parsed manifest (if any), stderr."""
    result = CliRunner().invoke(app, ["export", "kuberay", *args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    manifest = yaml.safe_load(result.stdout) if result.exit_code == 0 else None
    return result.exit_code, manifest, result.stderr


