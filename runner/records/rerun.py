"""``rayjobs rerun RUN``: a new run of the spec a run recorded, checked against what decides its result now.

A rerun is a new run. A workload's run gets a new folder beside the old one (``<run_name>-rerun-<n>``),
so the built-in training starts from scratch instead of finding the old run's last checkpoint and
training nothing; a job without a workload already gets a new record folder per submission. The two
records point at each other: the new ``run.json`` says ``rerun_of``, the old one lists it in
``reruns``. ``--continue`` keeps the run's name and folder, so a workload resumes where it stopped.

Before anything is submitted, what decides the result is compared with what the run recorded: the
working_dir's and the py_modules' code (Ray's content hash of each package), the spec itself (``--set``
overrides, or fields this rayjobs fills in differently), requirement files that no package covers,
and the cluster's Ray version (the caller asks the cluster). Python's and torch's versions on the
cluster would take a job of their own to read: the new run records them, and ``rayjobs show`` of each
run tells them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from jobs.errors import SpecError
from rayjobs_agent.record_layout import RUN_FILE
from rayjobs_agent.storage_location import StorageLocation
from rayjobs_agent.record_layout import RERUNS_FIELD, unreadable_version
from jobs.secrets import is_masked, masked_runtime_env
from rayjobs_agent.record_layout import DEFAULT_RECORD_PATH
from jobs.submission import METADATA_RERUN_OF, build_submission, local_runtime_paths, resolved_spec
from rayjobs_agent.package import is_agent_module
from jobs.workload_contract import workload_needs
from runner.errors import BadInput
from runner.reporter import say
from runner.records.store import Folder, read_run

if TYPE_CHECKING:
    from jobs.loader import LoadedSpec

RERUNS_KEY = RERUNS_FIELD
_RERUN_SUFFIX = re.compile(r"-rerun-\d+$")
_ID_ALPHABET = sorted(set(string.ascii_letters + string.digits) - set("IloO0"))
# A rerun that changed half the spec is not helped by a screenful of differences.
_SHOWN_SPEC_DIFFERENCES = 12


@dataclass
class Rerun:
    """What ``rerun`` will submit, where its run goes, and what differs from the recorded run."""

    loaded: LoadedSpec
    old: Folder  # the recorded run's folder, as given
    document: dict[str, Any]  # the recorded run's run.json
    old_run_dir: str  # the recorded run's folder as its record names it (the cluster's view)
    new_run_dir: str | None  # the new run's folder; None when it is the old one (--continue)
    code_changes: list[str] = field(default_factory=list)  # code not as recorded: refused without --force
    differences: list[str] = field(default_factory=list)  # the rest, said as warnings


def prepare_rerun(run: str, overrides: list[str], *, continue_run: bool) -> Rerun:
    """The recorded spec of ``run`` as a new run (or, with ``continue_run``, the same run again), ``--set``
    overrides applied, and what differs from what the run recorded.

    Secrets were masked in the record; their values come from this shell's environment, by name.

    Raises:
        BadInput: a secret's variable is not set here, or the recorded spec no longer validates.
    """
    folder = Folder(run)
    document = read_run(folder)
    spec = document.get("spec")
    if not isinstance(spec, dict):
        raise BadInput(f"the record at {folder.location} holds no spec to run again")
    spec = copy.deepcopy(spec)
    env_vars = (spec.get("runtime_env") or {}).get("env_vars") or {}
    masked_names = sorted(name for name, value in env_vars.items() if is_masked(value))
    missing = [name for name in masked_names if name not in os.environ]
    if missing:
        raise BadInput(f"the record keeps no secrets: set {', '.join(missing)} in this shell's environment (their "
                       f"values go to the job as the original run's did), then run `rayjobs rerun {run}` again")
    for name in masked_names:
        env_vars[name] = os.environ[name]
    old_run_dir = str(document.get("run_dir") or folder.location)
    loaded = _validated(copy.deepcopy(spec), overrides, folder)
    data = copy.deepcopy(spec)
    renamed: str | None = None
    if not continue_run:
        data["metadata"] = {**(data.get("metadata") or {}), METADATA_RERUN_OF: old_run_dir}
        run_name = run_name_parameter(loaded.workload)
        if run_name is not None:
            renamed, parent, leaf = run_name
            data["workload"][renamed] = free_run_name(parent, leaf)
    if spec.get("submission_id") or (not continue_run and renamed is None):
        # A fixed id would attach to the finished job; a job without a workload names its record after its id.
        data["submission_id"] = new_submission_id(spec.get("submission_id"))
    if data != spec:
        loaded = _validated(data, overrides, folder)
    new_run_dir = None if continue_run else new_record_location(loaded)
    if new_run_dir == old_run_dir:
        new_run_dir = None
    notes = uncovered_requirements(loaded)
    if document.get("status") == "RUNNING" and new_run_dir is not None:
        notes.append(f"the run at {folder.location} is still RUNNING as its record last said: its job rewrites "
                     "run.json as it goes, and may drop the link to this rerun")
    ignored = {"submission_id", f"metadata.{METADATA_RERUN_OF}", *([f"workload.{renamed}"] if renamed else [])}
    return Rerun(loaded, folder, document, old_run_dir, new_run_dir, code_changes=code_changes(document, loaded),
                 differences=spec_differences(document.get("spec") or {}, loaded, ignored) + notes)


def _validated(data: dict[str, Any], overrides: list[str], folder: Folder) -> LoadedSpec:
    from jobs.loader import validate_spec_data

    try:
        return validate_spec_data(data, None, None, overrides)
    except SpecError as exc:
        raise BadInput(f"the spec recorded at {folder.location} is not valid here (a path it names may be gone, "
                       f"or this rayjobs may read specs differently): {exc}") from None


def run_name_parameter(workload: Any) -> tuple[str, str, str] | None:
    """The workload parameter that names its run's folder, the folder's parent and its name; None for a
    workload whose run has no folder of its own.

    A workload declares its run's folder (``needs().run_location``), not which parameter names it: the
    parameter is the one whose value is the folder's name and whose change moves the folder.
    """
    location = workload_needs(workload).run_location
    if workload is None or not location:
        return None
    parent, _, leaf = location.rstrip("/").rpartition("/")
    probe = f"{leaf}-probe"
    for name, value in workload:
        if value != leaf:
            continue
        moved = workload_needs(workload.model_copy(update={name: probe})).run_location
        if moved is not None and moved.rstrip("/") == f"{parent}/{probe}":
            return name, parent, leaf
    return None


def free_run_name(parent: str, name: str) -> str:
    """``<name>-rerun-<n>`` with the smallest ``n`` no folder in ``parent`` has (a rerun's rerun counts on)."""
    base = _RERUN_SUFFIX.sub("", name)
    taken = set(Folder(parent).subfolders()) if parent else set()
    number = 1
    while f"{base}-rerun-{number}" in taken:
        number += 1
    return f"{base}-rerun-{number}"


def new_submission_id(fixed: str | None) -> str:
    """A fresh job id: the spec's fixed one with a new suffix, else one of the form Ray gives."""
    token = "".join(secrets.choice(_ID_ALPHABET) for _ in range(16))
    if fixed:
        return f"{_RERUN_SUFFIX.sub('', fixed)[:100]}-rerun-{token[:8]}"
    return f"raysubmit_{token}"


def new_record_location(loaded: LoadedSpec) -> str | None:
    """Where the run of ``loaded`` keeps its record (as the job will name it), or None when it keeps none."""
    spec = loaded.spec
    location = workload_needs(loaded.workload).run_location
    if location is None:
        if not spec.record or not spec.submission_id:
            return None
        location = f"{(spec.record_path or DEFAULT_RECORD_PATH).rstrip('/')}/{spec.name}-{spec.submission_id}"
    return StorageLocation.parse(location).absolute().uri  # as the job's record keeper names it (Store.at)


def link_rerun(old: Folder, new_run_dir: str) -> str | None:
    """Add ``new_run_dir`` to the old record's ``reruns``: read, add, write. Returns why it could not, or None.

    Nothing is written over a record that cannot be read whole: a link is not worth a record.
    """
    try:
        data = old.read(RUN_FILE)
        document = json.loads(data) if data is not None else None
        if not isinstance(document, dict):
            return f"{old.location}/{RUN_FILE} is not a run record any more"
        if (why := unreadable_version(document)) is not None:
            return f"{old.location}/{RUN_FILE} is left as it is: {why}"
        reruns = [entry for entry in document.get(RERUNS_KEY) or [] if entry != new_run_dir]
        document[RERUNS_KEY] = reruns + [new_run_dir]
        old.write(RUN_FILE, json.dumps(document, indent=1).encode())
    except Exception as exc:  # noqa: BLE001 - a read-only or unreachable old record must not stop the rerun
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return None


def code_changes(document: dict[str, Any], loaded: LoadedSpec) -> list[str]:
    """The packages of code (working_dir, py_modules) that are not what the run recorded, one line each."""
    from jobs.infra import ray_internals

    code = document.get("code") or {}
    submission = build_submission(loaded)
    runtime_env = submission.get("runtime_env") or {}
    changes = []
    with ray_internals.quieter(ray_internals.PACKAGING_LOGGER):
        working_dir = dict(local_runtime_paths(runtime_env)).get("working_dir")
        if code.get("working_dir_package") and working_dir:
            changes += _working_dir_change(code, code["working_dir_package"], working_dir,
                                           ray_internals.default_working_dir_excludes()
                                           + list(runtime_env.get("excludes") or []))
        recorded = code.get("py_modules_packages")
        if recorded:
            changes += _py_modules_changes(recorded, runtime_env)
    return changes


def _working_dir_change(code: dict[str, Any], recorded: str, working_dir: str, excludes: list[str]) -> list[str]:
    from jobs.infra import ray_internals
    from jobs.provenance import code_provenance

    if not Path(working_dir).is_dir():
        return [f"the working_dir {working_dir} the run uploaded is gone"]
    current = ray_internals.package_name(Path(working_dir), excludes)
    if current == recorded:
        return []
    then = code.get("git") or {}
    now = code_provenance(working_dir).get("git") or {}
    detail = ""
    if then.get("commit") and now.get("commit"):
        detail = (f" (recorded: commit {then['commit'][:12]}{' with changes' if then.get('dirty') else ''}; "
                  f"now: commit {now['commit'][:12]}{' with changes' if now.get('dirty') else ''})")
    return [f"the code in {working_dir} has changed since the run: its package is {current}, the run's was "
            f"{recorded}{detail}"]


def _py_modules_changes(recorded: list[str], runtime_env: dict[str, Any]) -> list[str]:
    """py_modules by position, as Ray uploads them; rayjobs' own agent is left out (it does not train)."""
    from jobs.infra import ray_internals

    modules = list(runtime_env.get("py_modules") or [])
    if len(modules) != len(recorded):
        return [f"the run shipped {len(recorded)} py_modules (rayjobs' own included), this spec ships {len(modules)}"]
    changes = []
    for module, then in zip(modules, recorded):
        if is_agent_module(module) or not isinstance(then, str):
            continue
        path = Path(module)
        if not local_runtime_paths({"py_modules": [module]}):
            now = module.rpartition("/")[2]
        elif path.is_dir():
            now = ray_internals.package_name(path, list(runtime_env.get("excludes") or []))
        elif path.exists():  # a single file or a wheel: Ray names it by other rules, which are not compared
            continue
        else:
            changes.append(f"the py_modules entry {module} the run uploaded is gone")
            continue
        if now != then:
            changes.append(f"the code in the py_modules entry {module} has changed since the run: its package is "
                           f"{now}, the run's was {then}")
    return changes


def spec_differences(recorded: dict[str, Any], loaded: LoadedSpec, ignored: set[str]) -> list[str]:
    """The fields where the spec to submit differs from the recorded one (``--set``, or defaults this
    rayjobs fills in), but for ``ignored`` (what the rerun itself changes); secrets stay masked."""
    then = _flat(recorded)
    now = _flat(masked_runtime_env(resolved_spec(loaded), loaded.spec.secret_env_vars))
    changed = [key for key in sorted(then.keys() | now.keys()) if key not in ignored and then.get(key) != now.get(key)]
    lines = [f"{key}: {then.get(key, '(not set)')} in the record, {now.get(key, '(not set)')} now"
             for key in changed[:_SHOWN_SPEC_DIFFERENCES]]
    if len(changed) > _SHOWN_SPEC_DIFFERENCES:
        lines.append(f"and {len(changed) - _SHOWN_SPEC_DIFFERENCES} more fields of the spec differ from the record")
    return [f"the spec differs from the recorded one: {line}" for line in lines]


def uncovered_requirements(loaded: LoadedSpec) -> list[str]:
    """Requirement files (pip, uv, conda) outside the working_dir: no recorded package covers their content."""
    runtime_env = loaded.spec.runtime_env
    if runtime_env is None:
        return []
    working_dir = runtime_env.working_dir
    notes = []
    for manager in ("pip", "uv", "conda"):
        value = getattr(runtime_env, manager)
        if not isinstance(value, str) or not value.endswith((".txt", ".yml", ".yaml", ".in")):
            continue
        inside = working_dir and Path(value).resolve().is_relative_to(Path(working_dir).resolve())
        if not inside:
            notes.append(f"{manager}: {value} is outside the working_dir, so the run kept nothing of its content to "
                         "compare with: check it is the file the run installed")
    return notes


def version_differences(document: dict[str, Any], cluster_ray_version: str | None) -> list[str]:
    """The cluster's Ray version against the one the run recorded (Python and torch are not asked for)."""
    recorded = (document.get("versions") or {}).get("ray")
    if not recorded or not cluster_ray_version or recorded == cluster_ray_version:
        return []
    return [f"the run ran on Ray {recorded}; the cluster runs Ray {cluster_ray_version}"]


def _flat(document: Any, prefix: str = "") -> dict[str, str]:
    if not isinstance(document, dict):
        return {prefix.rstrip("."): json.dumps(document, sort_keys=True, default=str)}
    flat: dict[str, str] = {}
    for key, value in document.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def checked_rerun(run: str, overrides: list[str], *, force: bool, continue_run: bool, dry_run: bool,
                  cluster_ray_version: Callable[[LoadedSpec], str | None],
                  say: Callable[[str], None] = say) -> LoadedSpec:
    """The spec ``rayjobs rerun`` submits: what differs from the recorded run said (changed code refused
    without ``force``), the cluster's Ray version compared, and the old record told of the new run.

    Args:
        run: the recorded run (a folder or ``s3://`` location).
        overrides: ``--set`` overrides of the recorded spec.
        force: run the code as it is now even when it differs from the recorded code.
        continue_run: continue the same run (its folder) instead of a new one.
        dry_run: say what would be done; the old record is left as it is.
        cluster_ray_version: the Ray version of the cluster the spec goes to (None: not known).
        say: where each of rayjobs' lines goes.

    Raises:
        BadInput: the record cannot be run again, or its code changed and ``force`` is not given.
    """
    plan = prepare_rerun(run, overrides, continue_run=continue_run)
    if plan.code_changes and not force:
        raise BadInput(f"{'; '.join(plan.code_changes)}; the rerun would not run the recorded code. Restore it (the "
                       "record names its commit: rayjobs show RUN), or pass --force to run the code as it is now")
    warnings = [f"{change}; running the code as it is now (--force)" for change in plan.code_changes]
    warnings += plan.differences
    if not dry_run:
        warnings += version_differences(plan.document, cluster_ray_version(plan.loaded))
    for warning in warnings:
        say(f"warning: {warning}")
    if plan.new_run_dir is None:
        say(f"rerun: continuing the run in {plan.old_run_dir}" if continue_run
             else "rerun: a new run (its job keeps no record to link)")
    elif dry_run:
        say(f"rerun: the new run would be {plan.new_run_dir} (rerun of {plan.old_run_dir})")
    else:
        problem = link_rerun(plan.old, plan.new_run_dir)
        say(f"rerun: a new run in {plan.new_run_dir} (rerun of {plan.old_run_dir}" + (
            ", whose record now lists it)" if problem is None else
            f"); its record could not be told of it ({problem}), and the rerun goes ahead"))
    return plan.loaded
