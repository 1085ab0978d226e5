"""A spec's sweep, run with Ray Tune over a workload's ``TorchTrainer``: Train V2's pattern.

Each Tune trial is a function that builds and fits the workload's trainer with the trial's values,
under its own run folder ``<run>/trials/<trial>``; ``TuneReportCallback`` hands every epoch's report
to Tune, whose scheduler may stop the trial early (ASHA, by epoch). Tune keeps its own state in
``<run>/tune``, so a sweep submitted again continues: finished trials are not run again, and an
interrupted trial's trainer resumes from its latest checkpoint, since its run folder has the same name.

What the sweep leaves in the run folder: ``sweep.json`` (its definition: a sweep submitted again with
another one is refused, or started anew with ``on_change: restart``), ``trials.csv`` (one row per trial,
and the refit run's) and ``trials.png`` (every trial's curve of the metric, the best one marked). With
``refit`` (the default) the best values then train once more on the whole training split, as run
``<run>/refit``, and the workload goes on with that run; without, with the best trial.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from jobs.sweep import (SWEEP_DEFINITION, TUNE_DIR, Distribution, SweepDoesNotFit, SweepSpec, definition_changes,
                        stored_definition, sweep_concurrency)
from jobs.workload_contract import Demand
from workloads import storage
from jobs.errors import BadInput
from rayjobs_agent import EventKind, emit
from workloads.storage import StoragePath
from workloads.ray_train.metrics import METRICS_CSV, pyplot, read_metrics_csv, save_figure

TRIALS_CSV = "trials.csv"
TRIALS_PLOT = "trials.png"
TRIALS_DIR = "trials"
REFIT_RUN = "refit"


@dataclass
class TrialOutcome:
    """How one trial went, read from Tune's result and the trial's own ``metrics.csv``."""

    name: str
    values: dict[str, Any]
    status: str  # FINISHED, STOPPED_EARLY or FAILED
    epochs: int  # epochs it ran
    best: float | None  # its best value of the sweep's metric
    run_dir: StoragePath
    error: str | None = None
    curve: list[float] = field(default_factory=list)  # the metric, epoch by epoch


@dataclass
class RefitOutcome:
    """The best trial's values trained once more on the whole training split, and measured on the validation
    split: ``score`` is the sweep's metric at its last epoch, where nothing was chosen on that split."""

    values: dict[str, Any]
    run_dir: StoragePath
    epochs: int
    score: float | None


@dataclass
class SweepOutcome:
    """What a sweep did: every trial, the best, the refit run, and the files describing them."""

    trials: list[TrialOutcome]
    best: TrialOutcome | None
    trials_csv: StoragePath
    trials_plot: StoragePath | None
    refit: RefitOutcome | None = None
    checkpoint: StoragePath | None = None  # the one the workload goes on with (the refit's, else the best trial's)


def tune_space(sweep: SweepSpec) -> dict[str, Any]:
    """The sweep's parameters as Tune's search space, keyed by their spec paths."""
    from ray import tune

    def domain(distribution: Distribution) -> Any:
        if distribution.choice is not None:
            return tune.grid_search(distribution.choice) if sweep.search == "grid" else tune.choice(distribution.choice)
        if distribution.uniform is not None:
            return tune.uniform(*distribution.uniform)
        if distribution.loguniform is not None:
            return tune.loguniform(*distribution.loguniform)
        low, high = distribution.randint  # type: ignore[misc]
        return tune.randint(low, high + 1)  # Tune's upper end is excluded; the spec's is included

    return {path: domain(distribution) for path, distribution in sweep.parameters.items()}


def search_algorithm(sweep: SweepSpec, concurrency: int) -> Any:
    """Tune's searcher for ``sweep.search``, holding at most ``concurrency`` trials at once."""
    if sweep.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        # Tune turns the sweep's domains into Optuna's distributions; TPE draws each trial's values from
        # the results of the trials that finished before it, so fewer at once means better-informed draws.
        return ConcurrencyLimiter(OptunaSearch(sampler=optuna_sampler(sweep)), max_concurrent=concurrency)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # The generator keeps the limit itself: Tune ignores max_concurrent_trials beside it.
    return BasicVariantGenerator(random_state=sweep.seed, max_concurrent=concurrency)


def optuna_sampler(sweep: SweepSpec) -> Any:
    """The TPE sampler of ``search: optuna``: random draws for the sweep's first trials, TPE after them."""
    from optuna.samplers import TPESampler

    return TPESampler(seed=sweep.seed, n_startup_trials=sweep.random_trials_first())


def trial_name(trial: Any) -> str:
    """``trial-0003``: a trial's number in the order Tune made it, the same when the sweep is restored."""
    number = int(str(trial.experiment_tag).split("_", 1)[0])
    # Tune's experiment tag starts with the trial's number: counted from 0 by the generator of random and
    # grid search (whose trial ids end in _NNNNN), from 1 by the generator that asks a searcher (Optuna).
    counted_from_one = "_" not in str(trial.trial_id)
    return f"trial-{number - counted_from_one:04d}"


def check_definition(sweep: SweepSpec, run_dir: StoragePath) -> None:
    """Make ``run_dir`` hold ``sweep``: refuse (:class:`BadInput`, naming each changed field) a sweep that differs
    from the one whose trials are there, or with ``on_change: restart`` delete those trials; then store ``sweep``."""
    from ray import tune

    stored_file = run_dir / SWEEP_DEFINITION
    path, filesystem = storage.arrow_path(run_dir)
    restorable = tune.Tuner.can_restore(f"{path.rstrip('/')}/{TUNE_DIR}", storage_filesystem=filesystem)
    changes = (definition_changes(json.loads(storage.read_text(stored_file)), sweep)
               if restorable and storage.exists(stored_file) else [])
    if changes and sweep.on_change == "refuse":
        raise BadInput(f"the sweep in {run_dir} was started with another definition, and a sweep submitted again "
                       f"continues the one there, so these changes would be ignored: {'; '.join(changes)}. Set "
                       "sweep.on_change: restart to delete its trials and start this sweep from its first trial, "
                       "use a new run_name, or submit the sweep as it was")
    if changes:
        print(f"The sweep's definition changed ({'; '.join(changes)}): on_change is restart, so the earlier "
              f"sweep's trials in {run_dir} are deleted and this one starts from its first trial.", flush=True)
        for folder in (TUNE_DIR, TRIALS_DIR, REFIT_RUN):
            storage.delete_tree(run_dir / folder)
        for name in (TRIALS_CSV, TRIALS_PLOT):
            storage.delete_file(run_dir / name)
    storage.write_text(stored_file, json.dumps(stored_definition(sweep), indent=2) + "\n")


def run_sweep(sweep: SweepSpec, run_trial: Callable[[dict[str, Any], str, StoragePath, list[Any]], None],
              run_dir: StoragePath, per_trial: Demand, epochs: int,
              run_refit: Callable[[dict[str, Any], str, StoragePath], None] | None = None) -> SweepOutcome:
    """Run ``sweep`` under ``run_dir`` on the connected cluster, or continue it there; return how it went.

    ``run_trial(values, name, storage, callbacks)`` fits one trial's trainer as run ``name`` under
    ``storage`` with ``values`` (spec path -> value) applied and ``callbacks`` in its ``RunConfig``.
    ``run_refit(values, name, storage)`` fits the same on the whole training split, measured on the
    validation split: with ``sweep.refit``, it runs once for the best trial's values (see :func:`refit_best`).
    Raises :class:`BadInput` when no trial fits the cluster, or when ``run_dir`` holds another sweep
    (:func:`check_definition`); a trial that fails is reported and the sweep goes on (a sweep whose
    every trial failed has no ``best``: the caller says what that means).
    """
    import ray
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    try:
        concurrency = sweep_concurrency(sweep, per_trial, ray.cluster_resources())
    except SweepDoesNotFit as refused:  # the cluster changed since the submit's pre-flight
        raise BadInput(str(refused)) from None
    check_definition(sweep, run_dir)
    trials_root = run_dir / TRIALS_DIR

    def trainable(config: dict[str, Any]) -> None:
        name = tune.get_context().get_trial_name()  # trial_name_creator gave it
        run_trial(dict(config), name, trials_root, [TuneReportCallback()])

    # The trial's function only waits on its trainer, whose workers hold the trial's resources (its
    # controller, like Train's own, takes no CPU). Tune refuses an empty request: one byte of memory.
    resources = tune.with_resources(trainable, {"cpu": 0, "memory": 1})
    path, filesystem = storage.arrow_path(run_dir)
    tune_path = f"{path.rstrip('/')}/{TUNE_DIR}"
    reporter = trial_lines(sweep.metric, epochs)
    if tune.Tuner.can_restore(tune_path, storage_filesystem=filesystem):
        print(f"Continuing the sweep in {run_dir / TUNE_DIR}: finished and failed trials are not run again.",
              flush=True)
        tuner = tune.Tuner.restore(tune_path, resources, resume_unfinished=True, resume_errored=False,
                                   restart_errored=False, storage_filesystem=filesystem)
    else:
        scheduler = None
        if sweep.asha is not None:
            from ray.tune.schedulers import ASHAScheduler

            # max_t past the last epoch: a trial that reaches it ends on its own, and its trainer removes its
            # workers' placement group, where a stop from Tune would kill the trainer mid-way through that.
            scheduler = ASHAScheduler(time_attr="epoch", max_t=epochs + 1, grace_period=sweep.asha.grace_period,
                                      reduction_factor=sweep.asha.reduction_factor)
        tuner = tune.Tuner(
            resources,
            param_space=tune_space(sweep),
            tune_config=tune.TuneConfig(
                metric=sweep.metric, mode=sweep.mode, num_samples=sweep.samples, scheduler=scheduler,
                search_alg=search_algorithm(sweep, concurrency),
                trial_name_creator=trial_name, trial_dirname_creator=trial_name,
                # A trial stopped early ends its process, and with it its trainer, whose placement group
                # Ray then removes; a reused process would keep both.
                reuse_actors=False),
            run_config=tune.RunConfig(name=TUNE_DIR, storage_path=path, storage_filesystem=filesystem,
                                      callbacks=[reporter], verbose=0),
        )
    print(f"Sweep: {sweep.trial_count()} trial(s), {concurrency} at a time, up to {epochs} epoch(s) each, "
          f"choosing by {sweep.metric} ({sweep.mode}).", flush=True)
    grid = tuner.fit()
    trials = [_trial_outcome(result, sweep, trials_root, epochs) for result in grid]
    trials.sort(key=lambda trial: trial.name)
    finished = [trial for trial in trials if trial.best is not None]
    best = None
    if finished:
        pick = max if sweep.mode == "max" else min
        best = pick(finished, key=lambda trial: trial.best)
    trials_csv = run_dir / TRIALS_CSV
    write_trials_csv(trials_csv, trials, sweep)
    plot = plot_trials(trials, best, sweep.metric, run_dir / TRIALS_PLOT) if finished else None
    outcome = SweepOutcome(trials, best, trials_csv, plot)
    if run_refit is not None:
        outcome.refit = refit_best(sweep, outcome, run_refit, run_dir)
    return outcome


def refit_best(sweep: SweepSpec, outcome: SweepOutcome, run_refit: Callable[[dict[str, Any], str, StoragePath], None],
               run_dir: StoragePath) -> RefitOutcome | None:
    """With ``sweep.refit`` and a best trial: train its values once more on the whole training split as run
    ``<run_dir>/refit`` (``run_refit(values, "refit", run_dir)``), and add that run to ``trials.csv``.

    The score is the sweep's metric at the refit's last epoch, on the validation split; the best trial's own
    (on the held-out share) is what chose the values. A refit that already finished is only read again.
    """
    if not sweep.refit or outcome.best is None:
        return None
    print(f"Refit: {outcome.best.name}'s values train once more on the whole training split, as run "
          f"{run_dir / REFIT_RUN}.", flush=True)
    run_refit(dict(outcome.best.values), REFIT_RUN, run_dir)
    folder = run_dir / REFIT_RUN
    rows = read_metrics_csv(folder / METRICS_CSV) if storage.exists(folder / METRICS_CSV) else []
    scores = [row[sweep.metric] for row in rows if sweep.metric in row]
    refit = RefitOutcome(dict(outcome.best.values), folder, len(rows), scores[-1] if scores else None)
    write_trials_csv(outcome.trials_csv, outcome.trials, sweep, refit)
    return refit


def refit_line(outcome: SweepOutcome, sweep: SweepSpec) -> str | None:
    """The refit run's score beside the selection score that chose its values; None without a refit."""
    refit, best = outcome.refit, outcome.best
    if refit is None or best is None or best.best is None:
        return None
    shown = "-" if refit.score is None else f"{refit.score:.4f}"
    return (f"Refit on the whole training split: {sweep.metric} {shown} on the validation split after "
            f"{refit.epochs} epoch(s); {best.name} was chosen with {sweep.metric} {best.best:.4f} on the held-out "
            f"share. Run folder {refit.run_dir}")


def _trial_outcome(result: Any, sweep: SweepSpec, trials_root: StoragePath, epochs: int) -> TrialOutcome:
    name = _result_trial_name(result)
    run_dir = trials_root / name
    rows = read_metrics_csv(run_dir / METRICS_CSV) if storage.exists(run_dir / METRICS_CSV) else []
    curve = [row[sweep.metric] for row in rows if sweep.metric in row]
    values = {path: (result.config or {}).get(path) for path in sweep.parameters}
    ran = len(rows)
    if result.error is not None:
        status, error = "FAILED", _first_line(result.error)
    else:
        status, error = ("FINISHED" if ran >= _planned_epochs(values, epochs) else "STOPPED_EARLY"), None
    best = None
    if curve:
        best = max(curve) if sweep.mode == "max" else min(curve)
    return TrialOutcome(name, values, status, ran, best, run_dir, error, curve)


def _result_trial_name(result: Any) -> str:
    # Tune's result carries its trial folder, named by trial_dirname_creator: trial-NNNN.
    return str(result.path).rstrip("/").rsplit("/", 1)[-1]


def _planned_epochs(values: dict[str, Any], epochs: int) -> int:
    swept = values.get("workload.train.epochs")
    return int(swept) if isinstance(swept, int) else epochs


def _first_line(error: BaseException) -> str:
    from workloads.ray_train.trainer import root_cause

    return root_cause(error)[:300]


def write_trials_csv(path: StoragePath, trials: list[TrialOutcome], sweep: SweepSpec,
                     refit: RefitOutcome | None = None) -> None:
    """``trials.csv``: trial, each parameter, status, epochs run, stopped early or not, best metric on the held-out
    share, error; and a last row ``refit`` whose ``validation_<metric>`` is the refit run's on the validation split."""
    handle = io.StringIO(newline="")
    columns = ["trial", *sweep.parameters, "status", "epochs", "stopped_early", f"best_{sweep.metric}",
               f"validation_{sweep.metric}", "error"]
    writer = csv.DictWriter(handle, fieldnames=columns)
    writer.writeheader()
    for trial in trials:
        writer.writerow({"trial": trial.name, **trial.values, "status": trial.status, "epochs": trial.epochs,
                         "stopped_early": trial.status == "STOPPED_EARLY",
                         f"best_{sweep.metric}": "" if trial.best is None else f"{trial.best:.6g}",
                         "error": trial.error or ""})
    if refit is not None:
        writer.writerow({"trial": REFIT_RUN, **refit.values, "status": "FINISHED", "epochs": refit.epochs,
                         "stopped_early": False,
                         f"validation_{sweep.metric}": "" if refit.score is None else f"{refit.score:.6g}"})
    storage.write_text(path, handle.getvalue())


def plot_trials(trials: list[TrialOutcome], best: TrialOutcome | None, metric: str,
                out_path: StoragePath) -> StoragePath:
    """Every trial's ``metric`` by epoch in one PNG, the best trial drawn bold and named in the legend."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(7, 4))
    for trial in trials:
        if not trial.curve:
            continue
        is_best = best is not None and trial.name == best.name
        axis.plot(range(1, len(trial.curve) + 1), trial.curve, marker="o", linewidth=2.5 if is_best else 1,
                  alpha=1 if is_best else 0.5, label=f"{trial.name} (best)" if is_best else trial.name)
    axis.set_xlabel("epoch")
    axis.set_ylabel(metric)
    axis.set_title(f"{metric} of every trial")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    save_figure(fig, out_path)
    plt.close(fig)
    return out_path


def trial_table(outcome: SweepOutcome, sweep: SweepSpec) -> str:
    """The trials as a text table, best first by the sweep's metric (failed trials last)."""
    def order(trial: TrialOutcome) -> tuple[int, float]:
        if trial.best is None:
            return (1, 0.0)
        return (0, -trial.best if sweep.mode == "max" else trial.best)

    headers = ["trial", *(path.removeprefix("workload.") for path in sweep.parameters), "status", "epochs",
               sweep.metric]
    rows = [[trial.name, *(_short(trial.values.get(path)) for path in sweep.parameters), trial.status,
             str(trial.epochs), "-" if trial.best is None else f"{trial.best:.4f}"]
            for trial in sorted(outcome.trials, key=order)]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in [headers, *rows])


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_lines(metric: str, epochs: int) -> Any:
    """A Tune callback that prints one line per trial event and sends it as a progress event."""
    from ray.tune import Callback

    class TrialLines(Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            values = ", ".join(f"{path.removeprefix('workload.')}={_short(value)}"
                               for path, value in sorted(trial.config.items()))
            print(f"Trial {trial_name(trial)} started: {values}", flush=True)
            emit(EventKind.TRIAL, trial=trial_name(trial), state="started", values=dict(trial.config))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            value = result.get(metric)
            number = value if isinstance(value, (int, float)) else None
            shown = "-" if number is None else f"{number:.4f}"
            print(f"Trial {trial_name(trial)}: epoch {result.get('epoch', '?')}/{epochs}, {metric} {shown}",
                  flush=True)
            emit(EventKind.TRIAL, trial=trial_name(trial), state="running", epoch=result.get("epoch"), metric=number)

        def on_trial_complete(self, iteration, trials, trial, **info):
            print(f"Trial {trial_name(trial)} ended", flush=True)
            emit(EventKind.TRIAL, trial=trial_name(trial), state="ended")

        def on_trial_error(self, iteration, trials, trial, **info):
            print(f"Trial {trial_name(trial)} failed; the sweep goes on", flush=True)
            emit(EventKind.TRIAL, trial=trial_name(trial), state="failed")

    return TrialLines()
