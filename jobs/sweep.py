"""A spec's ``sweep`` block: which workload fields to try, how to search them, and what to choose by.

The block is checked on the client like the rest of the spec, before anything runs: every parameter
names a field of the workload that may be swept, and every value its distribution can produce is a
valid value of that field (a sweep that could produce ``batch_size: 0`` is refused before trial 1,
not discovered at trial 5). The job receives the checked block in ``RAYJOBS_SWEEP`` and runs it
with Ray Tune (see :mod:`workloads.ray_train.sweep`). Like the rest of ``jobs``, this imports
pydantic only, so a spec is checked without ray or torch.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from jobs.errors import did_you_mean
from jobs.strict import StrictModel, field_names_at
from jobs.workload_contract import Demand, workload_needs

# Spec paths of swept fields start with this: the sweep changes only the workload's parameters.
WORKLOAD_PREFIX = "workload."
INSTALL_OPTUNA = "pip install 'rayjobs[optuna]'"
# A point inside a continuous range that no integer field accepts: a float distribution on an
# integer field is caught by validating it (the ends of [1, 4] alone are whole numbers).
_INTERIOR_SHARE = 0.37


class Distribution(StrictModel):
    """Where one swept parameter's values come from: exactly one of the four forms."""

    choice: list[Any] | None = Field(None, min_length=1, description="These values (a grid axis with "
                                     "search: grid).")
    uniform: tuple[float, float] | None = Field(None, description="[low, high]: any number between, evenly.")
    loguniform: tuple[float, float] | None = Field(None, description="[low, high], both above 0: evenly on a "
                                                   "log scale (learning rates, weight decay).")
    randint: tuple[int, int] | None = Field(None, description="[low, high]: a whole number between, both "
                                            "included.")

    @model_validator(mode="after")
    def _one_form(self) -> Distribution:
        given = [name for name in ("choice", "uniform", "loguniform", "randint") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of choice, uniform, loguniform, randint"
                             + (f" (got {' and '.join(given)})" if given else ""))
        low_high = self.uniform or self.loguniform or self.randint
        if low_high is not None:
            low, high = low_high
            if not (math.isfinite(low) and math.isfinite(high)) or low > high or (low == high and not self.randint):
                raise ValueError(f"[{low}, {high}] is not a range: write [low, high] with low below high")
            if self.loguniform and low <= 0:
                raise ValueError("loguniform needs a low end above 0")
        return self

    @property
    def form(self) -> str:
        """Which of the four forms this is."""
        return next(name for name in ("choice", "uniform", "loguniform", "randint") if getattr(self, name) is not None)

    def values_to_check(self) -> list[Any]:
        """Values that stand for every value this can produce: all choices, a range's ends and a point inside."""
        if self.choice is not None:
            return list(self.choice)
        low, high = self.uniform or self.loguniform or self.randint  # type: ignore[misc]
        if self.randint is not None:
            return [low, high]
        return [low, high, low + (high - low) * _INTERIOR_SHARE]

    def describe(self) -> str:
        """``loguniform [0.0001, 0.01]`` or ``choice [0.0, 0.05]``, for the plan."""
        values = self.choice if self.choice is not None else list(getattr(self, self.form))
        return f"{self.form} {values}"


class AshaConfig(StrictModel):
    """Asynchronous successive halving: trials behind the others at a rung stop early."""

    grace_period: int = Field(1, ge=1, description="Epochs every trial runs before it can be stopped.")
    reduction_factor: float = Field(3.0, gt=1, description="About 1 in this many trials goes on at each rung.")


class SchedulerConfig(StrictModel):
    """How trials are stopped early."""

    asha: AshaConfig | None = Field(None, description="ASHA on the sweep's metric, by epoch.")


class SweepSpec(StrictModel):
    """A hyperparameter sweep of the workload, run as one Ray job with Ray Tune."""

    metric: str = Field(description="The metric trials are compared by; one the workload reports per epoch.")
    mode: Literal["max", "min"] = Field(description="Whether a higher (max) or lower (min) metric is better.")
    samples: int = Field(1, ge=1, le=10_000, description="Trials; with search: grid, repeats of each grid point.")
    search: Literal["random", "grid", "optuna"] = Field(
        "random", description="random: draw each trial's values; grid: every combination of the choice lists "
        "(ranges still drawn); optuna: Optuna's TPE sampler draws each trial's values from how the trials before "
        f"it did (needs {INSTALL_OPTUNA}, here and on the cluster).")
    scheduler: Literal["none"] | SchedulerConfig = Field("none", description="none, or {asha: {...}}.")
    max_concurrent: Literal["auto"] | int = Field("auto", description="Trials at once: auto (as many as the "
                                                  "cluster fits) or a number no larger than that.")
    seed: int | None = Field(None, description="Seed of the random draws, so that a sweep can be repeated.")
    holdout: float = Field(0.2, gt=0, lt=1, description="Share of each class of the training split held out to "
                           "compare trials on; the validation split takes no part in the choice, and measures "
                           "the best trial afterwards (the infer stage).")
    parameters: dict[str, Distribution] = Field(min_length=1, description="Swept fields by spec path "
                                                "(workload.train.lr) and where their values come from.")
    refit: bool = Field(True, description="After the trials, train the best trial's values once more on the whole "
                        "training split (scikit-learn's refit); that run's last checkpoint goes to inference. false: "
                        "the best trial's own best checkpoint by the sweep's metric does.")
    on_change: Literal["refuse", "restart"] = Field(
        "refuse", description="A sweep submitted again to the same run continues where it stopped; when its "
        "definition changed since, refuse: the job stops and names each changed field; restart: the earlier "
        "sweep's trials are deleted and the new sweep starts from its first trial.")

    @field_validator("search")
    @classmethod
    def _search_installed(cls, value: str) -> str:
        if value == "optuna" and importlib.util.find_spec("optuna") is None:
            raise ValueError(f"optuna is not installed here: {INSTALL_OPTUNA} (the cluster needs it as well, e.g. "
                             "in runtime_env.pip)")
        return value

    @model_validator(mode="after")
    def _concurrency(self) -> SweepSpec:
        if isinstance(self.max_concurrent, int) and (isinstance(self.max_concurrent, bool) or self.max_concurrent < 1):
            raise ValueError("max_concurrent must be auto or a number of trials, 1 or more")
        return self

    @model_validator(mode="after")
    def _optuna_choices(self) -> SweepSpec:
        if self.search != "optuna":
            return self
        for path, distribution in self.parameters.items():
            # Optuna's categorical distribution holds numbers, strings, booleans and null only.
            odd = [value for value in distribution.choice or [] if not isinstance(value, (str, int, float, bool))
                   and value is not None]
            if odd:
                raise ValueError(f"{path}: search: optuna chooses among numbers, strings, booleans and null "
                                 f"only, not {odd[0]!r}; use search: random or grid for this choice")
        return self

    @property
    def asha(self) -> AshaConfig | None:
        """The ASHA settings, when the sweep stops trials early."""
        return self.scheduler.asha if isinstance(self.scheduler, SchedulerConfig) else None

    def trial_count(self) -> int:
        """How many trials the sweep runs."""
        if self.search != "grid":
            return self.samples
        points = math.prod(len(d.choice) for d in self.parameters.values() if d.choice is not None)
        return self.samples * points

    def random_trials_first(self) -> int:
        """With ``search: optuna``, how many trials are drawn at random before TPE takes over.

        Optuna's default is ten, so a sweep of eight would never use TPE: half the sweep is drawn at
        random (at least one trial, at most Optuna's ten), the rest by TPE from their results.
        """
        return max(1, min(10, self.samples // 2))

    def grid(self) -> list[dict[str, Any]]:
        """The grid points (``search: grid``): every combination of the choice lists, by parameter path."""
        axes = {path: d.choice for path, d in self.parameters.items() if d.choice is not None}
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else [{}]


def trial_plan(sweep: SweepSpec, workload: Any) -> dict[str, Any]:
    """What ``submit --dry-run`` shows of a sweep of ``workload`` (validated parameters): its trials, what
    each reserves and trains at most (as the workload declares them), how many run at once."""
    needs = workload_needs(workload)
    per_trial = next((demand for demand in needs.demands if demand.phase == "training"), None)
    epochs = needs.epochs
    swept_epochs = sweep.parameters.get(WORKLOAD_PREFIX + "train.epochs")
    if swept_epochs is not None:
        epochs = max(int(value) for value in swept_epochs.values_to_check())
    plan: dict[str, Any] = {
        "trials": sweep.trial_count(),
        "choose_by": f"{sweep.metric} ({sweep.mode})",
        "chosen_on": f"{sweep.holdout:.0%} of each class of the training split, held out (the validation split "
                     "measures the best trial afterwards)",
        "search": (f"optuna (TPE; the first {sweep.random_trials_first()} trial(s) drawn at random)"
                   if sweep.search == "optuna" else sweep.search),
        "parameters": {path: ("grid " + str(d.choice) if sweep.search == "grid" and d.choice is not None
                              else d.describe()) for path, d in sweep.parameters.items()},
        "epochs_at_most": epochs,
        "scheduler": (f"asha (every trial runs {sweep.asha.grace_period} epoch(s) before it can be stopped)"
                      if sweep.asha else "none"),
        "at_once": (str(sweep.max_concurrent) if sweep.max_concurrent != "auto"
                    else "auto: as many as the cluster holds, worked out when the job starts"),
        "refit": ("yes: the best values train once more on the whole training split, and that run goes to inference"
                  if sweep.refit else "no: the best trial's own checkpoint goes to inference"),
    }
    if sweep.search == "grid":
        plan["grid_points"] = sweep.grid()
    if per_trial is not None:
        plan["per_trial"] = (f"{per_trial.count} workers × {per_trial.cpus:g} CPU"
                             + (f" and {per_trial.gpus} GPU" if per_trial.gpus else ""))
    return plan


def plan_text(plan: dict[str, Any]) -> str:
    """The trial plan as comment lines, for the YAML ``submit --dry-run`` prints."""
    lines = [f"# sweep: {plan['trials']} trial(s), choosing by {plan['choose_by']}, search {plan['search']}"]
    lines += [f"#   {path}: {described}" for path, described in plan["parameters"].items()]
    for point in plan.get("grid_points", []):
        lines.append("#   grid point: " + ", ".join(f"{path.removeprefix(WORKLOAD_PREFIX)}={value}"
                                                   for path, value in point.items()))
    if plan.get("per_trial"):
        lines.append(f"#   each trial: {plan['per_trial']}, at most {plan['epochs_at_most']} epoch(s)")
    lines.append(f"#   scheduler: {plan['scheduler']}; at once: {plan['at_once']}")
    lines.append(f"#   trials compared on: {plan['chosen_on']}")
    lines.append(f"#   refit: {plan['refit']}")
    return "\n".join(lines) + "\n"


# In a sweep's run folder: its definition, and Ray Tune's state (which a sweep submitted again continues).
SWEEP_DEFINITION = "sweep.json"
TUNE_DIR = "tune"
# What a sweep submitted again may change: both take effect on the continued sweep.
_CHANGEABLE_ON_RESTORE = ("refit", "on_change")


def stored_definition(sweep: SweepSpec) -> dict[str, Any]:
    """What a sweep keeps of itself in its run folder, to tell a later submission whether it is the same sweep."""
    dumped = sweep.model_dump(mode="json", exclude_none=True)
    return {key: value for key, value in dumped.items() if key not in _CHANGEABLE_ON_RESTORE}


def definition_changes(stored: dict[str, Any], sweep: SweepSpec) -> list[str]:
    """Each field of ``sweep`` that differs from the ``stored`` definition, as ``sweep.FIELD: OLD -> NEW``."""
    current = stored_definition(sweep)
    changes = []
    for key in sorted(set(stored) | set(current)):
        if key == "parameters":
            old, new = stored.get(key) or {}, current.get(key) or {}
            changes += [f"sweep.parameters.{path}: {old.get(path, 'absent')} -> {new.get(path, 'absent')}"
                        for path in sorted(set(old) | set(new)) if old.get(path) != new.get(path)]
        elif stored.get(key) != current.get(key):
            changes.append(f"sweep.{key}: {stored.get(key)!r} -> {current.get(key)!r}")
    return changes


def workload_field(path: str) -> tuple[str, ...]:
    """``workload.train.lr`` as the workload's own field path, ``("train", "lr")``."""
    return tuple(path[len(WORKLOAD_PREFIX):].split("."))


@dataclass(frozen=True)
class SweepProblem:
    """One thing wrong with a sweep: where in the spec, and what."""

    path: tuple[str, ...]
    message: str


def check_sweep(sweep: SweepSpec, raw_workload: dict[str, Any], model: type[BaseModel],
                sweepable: tuple[str, ...], metrics: tuple[str, ...], context: dict[str, Any]) -> list[SweepProblem]:
    """Everything wrong with ``sweep`` for a workload validated by ``model`` from ``raw_workload``.

    ``sweepable`` are the workload's sections (``train``) whose fields a sweep may change; ``metrics``
    the metrics it reports, one of which the sweep chooses by. Every value a parameter's distribution
    can produce is validated as that field's value, with the rest of the workload as written.
    """
    problems: list[SweepProblem] = []
    if not sweepable:
        return [SweepProblem(("sweep",), "this workload does not run sweeps")]
    if metrics and sweep.metric not in metrics:
        problems.append(SweepProblem(("sweep", "metric"), f"{sweep.metric!r} is not a metric the workload "
                                     f"reports{did_you_mean(sweep.metric, metrics)}; it reports "
                                     + ", ".join(metrics)))
    for path, distribution in sweep.parameters.items():
        where = ("sweep", "parameters", path)
        if not path.startswith(WORKLOAD_PREFIX):
            problems.append(SweepProblem(where, f"{path!r} is not a workload field: write workload.SECTION.FIELD"))
            continue
        fields = workload_field(path)
        if fields[0] not in sweepable:
            allowed = ", ".join(f"workload.{section}.*" for section in sweepable)
            problems.append(SweepProblem(where, f"only {allowed} can be swept: the rest of the workload (its data "
                                         "above all, preprocessed once for every trial) is the same in each trial"))
            continue
        unknown = _unknown_field(model, fields)
        if unknown is not None:
            problems.append(SweepProblem(where, unknown))
            continue
        for value in distribution.values_to_check():
            refused = _refusal(model, raw_workload, fields, value, context)
            if refused is not None:
                problems.append(SweepProblem(where, f"{distribution.describe()} can produce {value!r}, which "
                                             f"{path} does not accept: {refused}"))
                break
    return problems


def apply_values(raw_workload: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``raw_workload`` with each ``workload.…`` path of ``values`` set to its value."""
    document = copy.deepcopy(raw_workload)
    for path, value in values.items():
        node = document
        *parents, last = workload_field(path)
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[last] = value
    return document


def _unknown_field(model: type[BaseModel], fields: tuple[str, ...]) -> str | None:
    for depth, part in enumerate(fields):
        names = field_names_at(model, fields[:depth])
        if part not in names:
            at = "workload." + ".".join(fields[:depth]) if depth else "workload"
            return f"{at} has no field {part!r}{did_you_mean(part, names)}"
    return None


def _refusal(model: type[BaseModel], raw_workload: dict[str, Any], fields: tuple[str, ...], value: Any,
             context: dict[str, Any]) -> str | None:
    try:
        model.model_validate(apply_values(raw_workload, {WORKLOAD_PREFIX + ".".join(fields): value}), context=context)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        own = [e for e in errors if tuple(str(p) for p in e["loc"])[:len(fields)] == fields] or errors
        message = own[0]["msg"]
        return message.removeprefix("Value error, ")
    return None


class SweepDoesNotFit(ValueError):
    """The cluster holds no trial of a sweep, or fewer at once than its ``max_concurrent``; the message has the figures."""


def trials_that_fit(per_trial: Demand, resources: dict[str, float]) -> int:
    """How many trials of ``per_trial`` (a training run's workers) the cluster's ``resources`` hold at once."""
    fits = [math.floor(resources.get("CPU", 0) / (per_trial.count * per_trial.cpus))] if per_trial.cpus else []
    if per_trial.gpus:
        fits.append(math.floor(resources.get("GPU", 0) / (per_trial.count * per_trial.gpus)))
    for name, amount in per_trial.resources.items():
        if amount:
            fits.append(math.floor(resources.get(name, 0) / (per_trial.count * amount)))
    return min(fits) if fits else 1


def trial_needs_text(per_trial: Demand) -> str:
    """``8 CPUs (8 workers × 1 CPU; the trial's Train controller reserves none)``: what one trial reserves."""
    parts = [f"{per_trial.count * per_trial.cpus:g} CPUs"]
    if per_trial.gpus:
        parts.append(f"{per_trial.count * per_trial.gpus:g} GPUs")
    each = f"{per_trial.cpus:g} CPU" + (f" and {per_trial.gpus:g} GPU" if per_trial.gpus else "")
    return f"{' and '.join(parts)} ({per_trial.count} workers × {each}; the trial's Train controller reserves none)"


def sweep_concurrency(sweep: SweepSpec, per_trial: Demand, resources: dict[str, float]) -> int:
    """Trials to run at once on a cluster of ``resources`` (summed over its nodes).

    Raises:
        SweepDoesNotFit: no trial fits, or ``max_concurrent`` asks for more than fit at once.
    """
    fits = trials_that_fit(per_trial, resources)
    needs = trial_needs_text(per_trial)
    has = f"{resources.get('CPU', 0):g} CPUs" + (f" and {resources.get('GPU', 0):g} GPUs" if per_trial.gpus else "")
    if fits < 1:
        raise SweepDoesNotFit(f"one trial of the sweep needs {needs}, and the cluster has {has}: no trial fits")
    if sweep.max_concurrent == "auto":
        return min(fits, sweep.trial_count())
    if sweep.max_concurrent > fits:
        raise SweepDoesNotFit(f"sweep.max_concurrent is {sweep.max_concurrent}, and the cluster holds {fits} "
                              f"trial(s) at once: one trial needs {needs}, the cluster has {has}")
    return sweep.max_concurrent
