"""A KubeRay ``RayJob`` manifest for a spec: what ``rayjobs export kuberay`` prints.

Pure: a validated spec and its submission in, a manifest (a dict) and the notes and
warnings about it out. Nothing here prints, uploads or talks to a cluster. The
operator's own rules (``ray-operator/controllers/ray/utils/validation.go``) that the
CRD schema does not carry are kept here, so a manifest that leaves this module is one
the operator accepts.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from rayjobs_agent.wire import RECORD_ENV_VAR, RETRY_ENV_VAR
from jobs.kuberay import INT32_MAX, DeletionRule
from jobs.loader import LoadedSpec
from rayjobs_agent.storage_location import uri_scheme
from jobs.secrets import SecretMask, secret_names
from jobs.submission import local_runtime_paths
from jobs.sweep import SweepSpec
from jobs.workload_contract import Demand, workload_needs
from runner.errors import BadInput

RAYJOB_API_VERSION = "ray.io/v1"
CLUSTER_SELECTOR_KEY = "ray.io/cluster"
# The operator appends 6 characters to a RayJob's name for its RayCluster, whose names stop at 53.
MAX_RAYJOB_NAME_LENGTH = 47
MAX_RAYCLUSTER_NAME_LENGTH = 53
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kueue's labels: the LocalQueue a workload joins, and its WorkloadPriorityClass.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# The managedBy value that hands a RayJob to MultiKueue, which runs it on a worker cluster of its choosing.
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"
KUBERNETES_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

# Time to read logs and inspect the cluster after the job ends, before the operator deletes it.
TTL_AFTER_FINISHED_S = 600
HEAD_CPUS = 2  # GCS, dashboard and the job's driver process
HEAD_MEMORY_GIB = 8
# The spec says how many CPUs a worker takes, never how much memory: this is the rule used.
MEMORY_PER_CPU_GIB = 4
DEFAULT_WORKER_CPUS = 2
# Trials a sweep with max_concurrent: auto gets a cluster for, at most: a wider sweep waits its turn.
AUTO_SWEEP_TRIALS_SIZED = 8
GPU_RESOURCE = "nvidia.com/gpu"
HEAD_PORTS = [("gcs-server", 6379), ("dashboard", 8265), ("client", 10001)]


@dataclass(frozen=True)
class WorkerGroup:
    """One worker group: ``replicas`` pods of ``cpus`` CPUs, ``memory_gib`` GiB and ``gpus`` GPUs."""

    replicas: int
    cpus: int
    memory_gib: int
    gpus: int


@dataclass
class Export:
    """A RayJob manifest and what a user should know about it."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def ray_image(ray_version: str, python: tuple[int, int], gpu: bool) -> str:
    """The ``rayproject/ray`` image for a Ray and Python version, CUDA-enabled when ``gpu``."""
    return f"rayproject/ray:{ray_version}-py{python[0]}{python[1]}" + ("-gpu" if gpu else "")


def build_rayjob(loaded: LoadedSpec, submission: dict[str, Any], *, cluster: str | None = None,
                 image: str | None = None, priority_class: str | None = None, multikueue: bool = False) -> Export:
    """The RayJob manifest for a validated spec and the submission ``build_submission`` made of it.

    Args:
        loaded: the validated spec.
        submission: its submission, with every local path in the runtime_env already replaced by a URI.
        cluster: an existing RayCluster to run on (``clusterSelector``); default: a cluster of the job's own.
        image: the container image of that own cluster; default: ``rayproject/ray`` for this Ray and Python.
        priority_class: the Kueue WorkloadPriorityClass of a queued spec (``kueue.x-k8s.io/priority-class``).
        multikueue: hand the queued RayJob to MultiKueue (``managedBy: kueue.x-k8s.io/multikueue``).

    Returns:
        The manifest, with notes (choices made) and warnings (spec fields KubeRay cannot honour).

    Raises:
        BadInput: the runtime_env still names local paths, a name KubeRay refuses, or a combination of queue,
            deletion rules, --cluster and --multikueue that Kueue or KubeRay would refuse or never run.
    """
    spec = loaded.spec
    check_rayjob_name(spec.name)
    if cluster is not None:
        check_cluster_name(cluster)
    check_queue_and_cleanup(loaded, on_existing_cluster=cluster is not None, multikueue=multikueue)
    deletion_rules = spec.kuberay.deletion_rules if spec.kuberay is not None else None
    runtime_env = copy.deepcopy(submission.get("runtime_env") or {})
    unshipped = local_runtime_paths(runtime_env)
    if unshipped:
        listed = ", ".join(f"{name} {path}" for name, path in unshipped)
        raise BadInput(f"KubeRay cannot upload local files, and this spec's runtime_env names {listed}. "
                       "Give --upload-to s3://BUCKET/PREFIX to package and upload them as Ray does, or set "
                       "them to remote URIs (e.g. --set runtime_env.working_dir=s3://BUCKET/pkg.zip)")

    result = Export({})
    job: dict[str, Any] = {"entrypoint": submission["entrypoint"]}
    env_vars = runtime_env.get("env_vars") or {}
    secret_values = {name: env_vars[name] for name in secret_names(env_vars, spec.secret_env_vars)}
    secrets = _replace_secrets(runtime_env, set(spec.secret_env_vars))
    if secrets:
        result.warnings.append(
            f"secret environment variables {', '.join(secrets)} are written as placeholders "
            f"(${{{secrets[0]}}}), which Ray fills from the environment of the pods it runs in: give the head "
            "and worker containers these variables from a Kubernetes Secret before applying")
    if runtime_env:
        # Wide lines keep the workload's JSON on one line.
        job["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=False, default_flow_style=False, width=2**20)
    if "submission_id" in submission:
        job["jobId"] = submission["submission_id"]
    job["metadata"] = dict(submission["metadata"])
    _refuse_copied_secrets(job, secret_values)
    if spec.entrypoint_num_cpus is not None:
        job["entrypointNumCpus"] = _number(spec.entrypoint_num_cpus)
    if spec.entrypoint_num_gpus is not None:
        job["entrypointNumGpus"] = _number(spec.entrypoint_num_gpus)
    if spec.entrypoint_resources:
        job["entrypointResources"] = json.dumps(spec.entrypoint_resources, sort_keys=True)
    if spec.timeout_s is not None:
        job["activeDeadlineSeconds"] = _seconds(spec.timeout_s)
    if spec.start_timeout_s is not None:
        job["preRunningDeadlineSeconds"] = _seconds(spec.start_timeout_s)
    deadlines = [name for name in ("activeDeadlineSeconds", "preRunningDeadlineSeconds") if name in job]
    if deadlines:
        result.notes.append(f"{' and '.join(deadlines)} count{'s' if len(deadlines) == 1 else ''} from the "
                            "RayJob's start, so the time its cluster takes to come up is included")

    retried_in_place = RETRY_ENV_VAR in (runtime_env.get("env_vars") or {})
    if retried_in_place:
        result.notes.append(f"a failed attempt whose cause is in retry_on runs again inside the same RayJob (up to "
                            f"max_retries, {spec.max_retries}), with nothing watching it; backoffLimit is left out, "
                            "since it would also retry failures no attempt can get past, each on a new cluster")
    if cluster is not None:
        job["clusterSelector"] = {CLUSTER_SELECTOR_KEY: cluster}
        if spec.max_retries and not retried_in_place:
            result.warnings.append(
                f"max_retries ({spec.max_retries}) is dropped: KubeRay allows backoffLimit only for a RayJob "
                "with a cluster of its own (leave out --cluster)")
    else:
        if spec.max_retries and not retried_in_place:
            job["backoffLimit"] = spec.max_retries
        # KubeRay refuses shutdownAfterJobFinishes (and so a TTL) beside deletion rules: the rules replace both.
        if not deletion_rules:
            job["shutdownAfterJobFinishes"] = True
            job["ttlSecondsAfterFinished"] = TTL_AFTER_FINISHED_S
        job["rayClusterSpec"] = _cluster_spec(loaded, image, result)
        if (where := _local_record_location(runtime_env)) is not None:
            when = "as kuberay.deletion_rules say" if deletion_rules else f"{TTL_AFTER_FINISHED_S} s after the job ends"
            result.warnings.append(f"the run record goes to {where} in the head pod, which is deleted with the "
                                   f"cluster {when}: set record_path (or the workload's storage_path) to "
                                   "s3://BUCKET/PREFIX to keep it")
    if deletion_rules:
        job["deletionStrategy"] = deletion_strategy(deletion_rules, cluster is not None, result)
    job.update(kueue_control(loaded, cluster is not None, multikueue, result))
    result.warnings += _unmapped_fields(loaded, cluster is not None, retried_in_place)
    result.notes += _workload_path_notes(loaded)
    result.manifest = {
        "apiVersion": RAYJOB_API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": spec.name, **kueue_labels(loaded, priority_class, result, cluster is not None)},
        "spec": job,
    }
    return result


def kueue_labels(loaded: LoadedSpec, priority_class: str | None, result: Export,
                 on_existing_cluster: bool = False) -> dict[str, Any]:
    """Where Kueue reads a spec's queue: ``labels`` with the LocalQueue and, if given, the priority class.

    On Kubernetes, Kueue admits a RayJob (it creates it suspended and lets it go when its queue has room);
    a spec's numeric ``priority`` has no meaning there, since Kueue orders by WorkloadPriorityClass.
    """
    spec = loaded.spec
    if spec.queue is None:
        if priority_class is not None:
            raise BadInput("--priority-class needs a queued spec: set queue: NAME (the Kueue LocalQueue) in it")
        return {}
    if priority_class is not None and not KUBERNETES_NAME.match(priority_class):
        raise BadInput(f"--priority-class {priority_class!r} is not a Kubernetes object name (lowercase letters, "
                       "digits and '-', at most 63)")
    labels = {KUEUE_QUEUE_LABEL: spec.queue}
    if priority_class is not None:
        labels[KUEUE_PRIORITY_LABEL] = priority_class
    elif spec.priority:
        result.warnings.append(f"priority {spec.priority} is not exported: Kueue orders by a WorkloadPriorityClass; "
                               "give its name with --priority-class")
    if on_existing_cluster:
        result.warnings.append(f"Kueue does not queue a RayJob that runs on an existing cluster (--cluster): it "
                               f"starts at once, whatever LocalQueue {spec.queue} holds")
    else:
        result.notes.append(f"Kueue admits this RayJob through LocalQueue {spec.queue} (label {KUEUE_QUEUE_LABEL})")
    return {"labels": labels}


def check_queue_and_cleanup(loaded: LoadedSpec, *, on_existing_cluster: bool, multikueue: bool) -> None:
    """Raise BadInput where the spec's queue, its ``kuberay.deletion_rules``, ``--cluster`` and ``--multikueue``
    make a RayJob that Kueue or KubeRay would refuse, or that nothing would ever run.

    Cheap and local, so the command runs it before uploading anything.
    """
    spec = loaded.spec
    deletion_rules = spec.kuberay.deletion_rules if spec.kuberay is not None else None
    if multikueue and spec.queue is None:
        raise BadInput("--multikueue needs a queued spec: set queue: NAME in it (the Kueue LocalQueue whose "
                       "ClusterQueue has the MultiKueue admission check). KubeRay leaves alone a RayJob that names "
                       "another manager, so without a queue nothing would ever run it")
    if multikueue and on_existing_cluster:
        raise BadInput("--multikueue cannot go with --cluster: Kueue does not manage a RayJob that runs on an "
                       "existing cluster, and KubeRay leaves alone one that names another manager, so nothing would "
                       "ever run it. Leave out --cluster (the worker cluster MultiKueue picks then gets a RayJob "
                       "with a cluster of its own) or --multikueue")
    if deletion_rules and spec.queue is not None and not on_existing_cluster:
        raise BadInput(f"kuberay.deletion_rules cannot go with queue ({spec.queue}): Kueue admits a RayJob only "
                       "with shutdownAfterJobFinishes: true, so that the cluster's quota is freed when the job ends, "
                       "and KubeRay refuses shutdownAfterJobFinishes beside deletionRules. Remove one of the two "
                       "from the spec")
    if deletion_rules and on_existing_cluster:
        owned = sorted({rule.policy for rule in deletion_rules if rule.policy in ("DeleteWorkers", "DeleteCluster")})
        if owned:
            raise BadInput(f"kuberay.deletion_rules say {' and '.join(owned)}, which KubeRay refuses for a RayJob on "
                           "an existing cluster (--cluster): that cluster is not the RayJob's to delete. Keep only "
                           "DeleteSelf and DeleteNone rules, or leave out --cluster")


def deletion_strategy(rules: list[DeletionRule], on_existing_cluster: bool, result: Export) -> dict[str, Any]:
    """The RayJob's ``deletionStrategy`` for a spec's ``kuberay.deletion_rules`` (checked by the spec model)."""
    written = []
    for rule in rules:
        condition: dict[str, Any] = ({"jobStatus": rule.job_status} if rule.job_status is not None
                                     else {"jobDeploymentStatus": rule.job_deployment_status})
        written.append({"condition": {**condition, "ttlSeconds": rule.after_s}, "policy": rule.policy})
    result.notes.append("deletionRules take effect only where KubeRay's operator has its RayJobDeletionPolicy "
                        "feature gate on (--feature-gates=RayJobDeletionPolicy=true): without it, the operator "
                        "refuses the RayJob")
    if not on_existing_cluster:
        # A RayJob's deployment fails when its Ray job fails, so a job_deployment_status rule covers FAILED too.
        ends = {"SUCCEEDED": [rule for rule in rules if rule.job_status == "SUCCEEDED"],
                "FAILED": [rule for rule in rules if rule.job_status == "FAILED" or rule.job_deployment_status]}
        kept = [end for end, covering in ends.items()
                if not any(rule.policy in ("DeleteCluster", "DeleteSelf") for rule in covering)]
        if kept:
            result.warnings.append(f"no deletion rule deletes the cluster of a job that ends {' or '.join(kept)}: "
                                   "its pods (and what they cost) stay until you delete the RayJob")
    return {"deletionRules": written}


def kueue_control(loaded: LoadedSpec, on_existing_cluster: bool, multikueue: bool, result: Export) -> dict[str, Any]:
    """The RayJob fields through which Kueue takes a queued spec over: ``suspend``, and ``managedBy`` on request.

    Kueue lets a suspended RayJob go when its queue admits it; created suspended, the RayJob cannot start
    outside the quota even for a moment. With ``multikueue``, the RayJob applied on a MultiKueue manager cluster
    is left alone by KubeRay there and runs on the worker cluster MultiKueue picks. Kueue does not manage a RayJob
    on an existing cluster (and KubeRay cannot suspend one), so that gets neither.
    """
    spec = loaded.spec
    if spec.queue is None or on_existing_cluster:
        return {}
    fields: dict[str, Any] = {"suspend": True}
    result.notes.append(f"the RayJob is created suspended: Kueue lets it go when LocalQueue {spec.queue} admits it "
                        "(where Kueue does not manage RayJobs, it stays suspended)")
    if multikueue:
        fields["managedBy"] = MULTIKUEUE_MANAGER
        result.notes.append(f"managedBy {MULTIKUEUE_MANAGER}: apply it on the MultiKueue manager cluster, where the "
                            f"ClusterQueue of LocalQueue {spec.queue} has a MultiKueue admission check; it runs on "
                            "the worker cluster MultiKueue picks, and managedBy cannot change after creation")
    return fields


def check_rayjob_name(name: str) -> None:
    """Raise BadInput unless the operator accepts ``name`` for a RayJob."""
    if len(name) > MAX_RAYJOB_NAME_LENGTH or not DNS_1035_LABEL.match(name):
        raise BadInput(f"name {name!r} cannot name a RayJob: KubeRay wants at most {MAX_RAYJOB_NAME_LENGTH} "
                       "characters, lowercase letters, digits and '-', starting with a letter (change it, or "
                       "--set name=NEW-NAME)")


def check_cluster_name(name: str) -> None:
    """Raise BadInput unless ``name`` can be a RayCluster's name."""
    if len(name) > MAX_RAYCLUSTER_NAME_LENGTH or not DNS_1035_LABEL.match(name):
        raise BadInput(f"--cluster {name!r} is not a RayCluster name: at most {MAX_RAYCLUSTER_NAME_LENGTH} "
                       "characters, lowercase letters, digits and '-', starting with a letter")


def size_worker_group(demands: list[Demand]) -> WorkerGroup:
    """Pods big enough for the largest bundle, as many as the hungriest phase needs.

    Phases run one after another, so the group fits each in turn rather than all at once.
    """
    cpus = max(1, math.ceil(max(demand.cpus for demand in demands)))
    gpus = max(demand.gpus for demand in demands)
    replicas = 1
    for demand in demands:
        per_pod = math.floor(cpus / demand.cpus) if demand.cpus else demand.count
        if demand.gpus:
            per_pod = min(per_pod, gpus // demand.gpus)
        replicas = max(replicas, math.ceil(demand.count / max(1, per_pod)))
    return WorkerGroup(replicas, cpus, MEMORY_PER_CPU_GIB * cpus, gpus)


def sweep_demand(training: Demand, sweep: SweepSpec, result: Export) -> Demand:
    """The training phase of a sweep: as many trials' workers at once as the sweep runs at once.

    ``max_concurrent: auto`` runs as many trials as fit the cluster, so the cluster is sized for all of
    them (capped at 8, and said); a number sizes it for that many.
    """
    at_once = sweep.max_concurrent if sweep.max_concurrent != "auto" else min(sweep.trial_count(),
                                                                                AUTO_SWEEP_TRIALS_SIZED)
    if sweep.max_concurrent == "auto":
        result.notes.append(f"the sweep's max_concurrent is auto: the worker group is sized for {at_once} trial(s) "
                            f"at once (of {sweep.trial_count()}); set sweep.max_concurrent to size it otherwise")
    return replace(training, count=training.count * at_once)


def _cluster_spec(loaded: LoadedSpec, image: str | None, result: Export) -> dict[str, Any]:
    spec = loaded.spec
    demands = list(workload_needs(loaded.workload).demands)
    if spec.sweep is not None:
        demands = [sweep_demand(demand, spec.sweep, result) if demand.phase == "training" else demand
                   for demand in demands]
    if demands:
        group = size_worker_group(demands)
        sized_by = "; ".join(f"{d.phase} {d.count} x {_number(d.cpus)} CPU" + (f" + {d.gpus} GPU" if d.gpus else "")
                             for d in demands)
        result.notes.append(f"worker group: {group.replicas} pods of {group.cpus} CPU, {group.memory_gib}Gi"
                            + (f", {group.gpus} GPU" if group.gpus else "") + f" (from the workload: {sized_by}; "
                            f"memory is {MEMORY_PER_CPU_GIB}Gi per CPU, the spec does not say)")
    else:
        group = WorkerGroup(1, DEFAULT_WORKER_CPUS, MEMORY_PER_CPU_GIB * DEFAULT_WORKER_CPUS, 0)
        what = f"workload '{loaded.workload_kind}'" if loaded.workload_kind else "this spec"
        result.notes.append(f"{what} does not say how many workers it needs: one worker pod of {group.cpus} CPU "
                            f"and {group.memory_gib}Gi; edit workerGroupSpecs to change that")
    for demand in demands:
        if demand.resources:
            asked = f"workload.{demand.resources_parameter}" if demand.resources_parameter else \
                f"the workload's {demand.phase}"
            result.warnings.append(f"{asked} {json.dumps(demand.resources)} is not given to the worker pods: add "
                                   "those resources to the worker group's rayStartParams")

    head_cpus = math.ceil(spec.entrypoint_num_cpus or 0)
    head_gpus = math.ceil(spec.entrypoint_num_gpus or 0)
    ray_version = version("ray")
    if image is None:
        image = ray_image(ray_version, sys.version_info[:2], gpu=bool(group.gpus or head_gpus))
        if loaded.workload_kind not in (None, "hello"):
            result.notes.append(f"image {image} holds Ray and its own dependencies only: what the workload imports "
                                "beyond them (e.g. torch) must come from runtime_env pip/uv or an --image built "
                                "with them")
    # The head only runs the driver: Ray Train workers and actors land on the worker pods
    # the group was sized for, not on spare head CPUs.
    head_params = {"num-cpus": str(head_cpus)}
    if spec.entrypoint_resources:
        # The value reaches `ray start --resources=` through a shell: quoted whole, so the shell reads no part of it.
        head_params["resources"] = shlex.quote(json.dumps(spec.entrypoint_resources, sort_keys=True))
    head_container = {
        "name": "ray-head",
        "image": image,
        "ports": [{"containerPort": port, "name": name} for name, port in HEAD_PORTS],
        "resources": _pod_resources(HEAD_CPUS + head_cpus, HEAD_MEMORY_GIB, head_gpus),
    }
    worker_container = {"name": "ray-worker", "image": image,
                        "resources": _pod_resources(group.cpus, group.memory_gib, group.gpus)}
    return {
        "rayVersion": ray_version,
        "headGroupSpec": {"rayStartParams": head_params, "template": {"spec": {"containers": [head_container]}}},
        "workerGroupSpecs": [{
            "groupName": "workers",
            "replicas": group.replicas,
            "minReplicas": group.replicas,
            "maxReplicas": group.replicas,
            "rayStartParams": {},
            "template": {"spec": {"containers": [worker_container]}},
        }],
    }


def _pod_resources(cpus: int, memory_gib: int, gpus: int) -> dict[str, dict[str, str]]:
    amounts = {"cpu": str(cpus), "memory": f"{memory_gib}Gi"}
    if gpus:
        amounts[GPU_RESOURCE] = str(gpus)
    # Requests equal to limits: Ray schedules by what it was told a node has, so the pod must really have it.
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _replace_secrets(runtime_env: dict[str, Any], marked: set[str]) -> list[str]:
    """Swap secret env var values for ``${NAME}`` placeholders in place; return their names."""
    env_vars = runtime_env.get("env_vars") or {}
    names = secret_names(env_vars, marked)
    for name in names:
        env_vars[name] = f"${{{name}}}"
    return names


def _refuse_copied_secrets(job: dict[str, Any], secret_values: dict[str, str]) -> None:
    """Raise BadInput when a secret's value, swapped for a placeholder in env_vars, is still written elsewhere
    in the RayJob (its entrypoint, another variable): a manifest is a file, often committed."""
    written = [job["entrypoint"], job.get("runtimeEnvYAML") or ""]
    copied = [name for name, value in secret_values.items()
              if any(form in text for form in SecretMask([value]).values for text in written)]
    if copied:
        raise BadInput(f"the value of secret environment variable {', '.join(copied)} is also written elsewhere in "
                       "the spec (its entrypoint or another variable), so the manifest would hold it in plain text. "
                       f"Refer to the variable instead (${copied[0]} in the entrypoint: Ray sets the job's "
                       "environment variables for it), then export again")


def _local_record_location(runtime_env: dict[str, Any]) -> str | None:
    """Where the job keeps its run record, when that is a folder of the node it runs on (None otherwise)."""
    text = (runtime_env.get("env_vars") or {}).get(RECORD_ENV_VAR)
    if not text:
        return None
    config = json.loads(text)
    where = config.get("run_dir") or config.get("base")
    return None if not where or uri_scheme(str(where)) else str(where)


def _unmapped_fields(loaded: LoadedSpec, on_existing_cluster: bool, retried_in_place: bool) -> list[str]:
    """Warnings for the spec fields a RayJob has no place for."""
    spec = loaded.spec
    warnings = []
    if spec.entrypoint_memory is not None:
        warnings.append(f"entrypoint_memory ({spec.entrypoint_memory} bytes) has no RayJob field: the driver's "
                        "memory is not reserved")
    if spec.entrypoint_label_selector:
        warnings.append(f"entrypoint_label_selector {json.dumps(spec.entrypoint_label_selector)} has no RayJob "
                        "field: the driver may run on any node")
    if spec.address is not None:
        warnings.append(f"address ({spec.address}) is not used: the RayJob runs where it is applied")
    if spec.max_retries and not on_existing_cluster and spec.retry_on and not retried_in_place:
        warnings.append(f"retry_on ({', '.join(spec.retry_on)}) has no RayJob field: KubeRay retries after any "
                        "failure, up to backoffLimit times, each on a new cluster")
    return warnings


def _workload_path_notes(loaded: LoadedSpec) -> list[str]:
    if loaded.workload is None:
        return []
    paths = _paths_in(loaded.workload.model_dump(), ())
    if not paths:
        return []
    listed = ", ".join(f"{'.'.join(where)}={path}" for where, path in paths)
    return [f"workload paths were resolved on this machine ({listed}): they must exist in the pods too "
            "(a mounted volume), or be remote URIs"]


def _paths_in(value: Any, where: tuple[str, ...]) -> list[tuple[tuple[str, ...], Path]]:
    if isinstance(value, Path):
        return [(where, value)]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _paths_in(item, (*where, str(key)))]
    return []


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _seconds(value: float) -> int:
    return min(INT32_MAX, max(1, math.ceil(value)))


class _BlockStrings(yaml.SafeDumper):
    """Multi-line strings (the runtimeEnvYAML) as ``|`` blocks, so the manifest reads like hand-written YAML."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockStrings.add_representer(str, _represent_str)


def manifest_yaml(manifest: dict[str, Any]) -> str:
    """The manifest as YAML for ``kubectl apply -f -``."""
    return yaml.dump(manifest, Dumper=_BlockStrings, sort_keys=False, default_flow_style=False, width=120)
