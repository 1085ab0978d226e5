"""A pipeline file: jobs, each a spec file with its ``--set`` overrides, and the jobs each one runs after.

```yaml
pipeline: food101-nightly
jobs:
  prep:
    spec: specs/food101.yaml
    set: [workload.stages=[preprocess]]
  train-small:
    spec: specs/food101.yaml
    after: [prep]
    set: [workload.train.lr=0.001]
  evaluate:
    spec: specs/evaluate.yaml
    after: [train-small]
notify:                      # optional: one message when the whole run has ended
  - url: slack://TOKEN_A/TOKEN_B/TOKEN_C
    on: [failed, stopped]
```

It is checked as strictly as a spec before anything is sent: unknown fields and job names, a job that runs after
itself through any chain of others, and every spec with its overrides, each problem named with its file, line and
field. The cluster's queue runs the graph (``rayjobs_agent/queue/pipelines.py``); this module only reads the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from jobs.errors import FieldPath, SpecError, did_you_mean
from jobs.loader import LoadedSpec, Locator, load_spec
from jobs.notify import NotifyTarget
from jobs.strict import StrictModel
from jobs.yaml_reader import read_yaml_mapping
from rayjobs_agent.notify import END_EVENTS
from rayjobs_agent.queueing import ATTEMPT_ID_SUFFIX

# A pipeline's or a job's name: part of every job id of the pipeline (``PIPELINE-RUN-JOB``), which a Ray job id and a
# key of the cluster's store must hold, with room for the id of a next attempt.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
NAME_RULE = "1 to 40 lowercase letters, digits or '-', starting with a letter or digit"
# Enough for any graph a team writes by hand or generates; past it a file is more likely a mistake.
MAX_JOBS = 500

def _not_an_attempts_name(name: str) -> str:
    if (found := ATTEMPT_ID_SUFFIX.search(name)) is not None:
        raise ValueError(f"a job's name may not end like the id of a retried job's next attempt ({found.group()!r})")
    return name


def _a_run_end_event(target: NotifyTarget) -> NotifyTarget:
    # A run's end is all a pipeline notifies of: a job's own news (a stall, a retry) comes from its own spec.
    ends = list(END_EVENTS.values())
    others = [event for event in target.on if event not in ends]
    if others:
        raise ValueError(f"on: {', '.join(others)} {'is an event' if len(others) == 1 else 'are events'} of one job; a "
                         f"pipeline notifies once, when its run ends ({', '.join(ends)}): put it in the notify of "
                         "the job's spec")
    return target


JobName = Annotated[str, Field(pattern=NAME_PATTERN, description=f"The job's name in the pipeline: {NAME_RULE}, not "
                                                                  "ending in -attemptN or -attemptN-K."),
                    AfterValidator(_not_an_attempts_name)]


class PipelineJob(StrictModel):
    """One job of a pipeline: its spec, the overrides it runs with, and the jobs it runs after."""

    spec: str = Field(description="The job's spec file, relative to the pipeline file.")
    set: list[str] = Field(default_factory=list, description="Overrides, as `--set` takes them: `workload.train.lr=0.01`.")
    after: list[JobName] = Field(default_factory=list, description="The jobs that must have SUCCEEDED before this one "
                                 "starts. One that fails or is stopped ends this one without running.")


class PipelineFile(StrictModel):
    """A pipeline file's fields."""

    pipeline: str = Field(pattern=NAME_PATTERN, description=f"The pipeline's name: {NAME_RULE}. Its jobs without a "
                          "`queue:` of their own wait in a queue of this name.")
    jobs: dict[JobName, PipelineJob] = Field(min_length=1, max_length=MAX_JOBS,
                                             description="The jobs, by name.")
    notify: list[Annotated[NotifyTarget, AfterValidator(_a_run_end_event)]] | None = Field(
        None, description="Where one message goes when the whole run has ended (Apprise URLs, as a spec's `notify`), "
        "and on which ends: succeeded, failed (a job failed, or was not run for one that did), stopped. It names "
        "the run, each job that failed with its cause, and the jobs not run. Sent by the queue's keeper on the "
        "cluster, so it works with --no-wait; needs Apprise in the head node's Python (the cluster's image), where the "
        "keeper runs. Each job still sends its own spec's.")


@dataclass
class LoadedPipeline:
    """A validated pipeline: its file, its name, each job's loaded spec and what it runs after, in an order in which
    every job comes after the jobs it runs after."""

    path: Path
    name: str
    jobs: dict[str, LoadedSpec] = field(default_factory=dict)
    after: dict[str, list[str]] = field(default_factory=dict)
    notify: list[NotifyTarget] | None = None

    @property
    def order(self) -> list[str]:
        """The jobs' names, each after every job it runs after (ties by name)."""
        return topological_order(self.after)


class PipelineError(SpecError):
    """A pipeline that cannot be used: the problems of the pipeline file and of every spec it names, each with its
    own file."""

    def __init__(self, errors: list[SpecError]) -> None:
        super().__init__(errors[0].file, [problem for error in errors for problem in error.problems])
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)


def is_pipeline_file(data: dict[str, Any]) -> bool:
    """Whether a parsed YAML file is a pipeline (it names a ``pipeline``, which no spec has) rather than a spec."""
    return "pipeline" in data


def load_pipeline(path: str | Path) -> LoadedPipeline:
    """Read and check a pipeline file and every spec it names.

    Raises:
        PipelineError: the file, a job's name or graph, or a spec with its overrides is invalid (every problem found,
            each naming its file, line and field; exit code 2).
    """
    path = Path(path)
    data, lines = read_yaml_mapping(path)
    locate = Locator(str(path), data, lines, {})
    try:
        pipeline = PipelineFile.model_validate(data)
    except ValidationError as exc:
        raise PipelineError([locate.error(exc, PipelineFile)]) from None
    problems = graph_problems({name: job.after for name, job in pipeline.jobs.items()})
    errors = [SpecError(str(path), [locate.problem(where, message) for where, message in problems])] if problems else []
    loaded = LoadedPipeline(path, pipeline.pipeline, notify=pipeline.notify,
                            after={name: list(job.after) for name, job in pipeline.jobs.items()})
    for name, job in pipeline.jobs.items():
        spec_path = (path.parent / job.spec)
        try:
            loaded.jobs[name] = load_spec(spec_path, job.set)
        except SpecError as exc:
            errors.append(exc)
            continue
        if loaded.jobs[name].spec.queue is None:
            # It waits in the queue named after its pipeline: a queued job, so it keeps its record (how long it
            # waited, and the pipeline it is a job of, from which the records alone draw the run's graph).
            loaded.jobs[name].spec = loaded.jobs[name].spec.model_copy(update={"queue": pipeline.pipeline})
        if loaded.jobs[name].spec.submission_id is not None:
            errors.append(SpecError(str(path), [locate.problem(
                ("jobs", name, "spec"), f"{job.spec} fixes submission_id {loaded.jobs[name].spec.submission_id!r}; a "
                "pipeline's job takes its id from the pipeline's run (PIPELINE-RUN-JOB), so that the pipeline can run "
                "again: remove it from the spec")]))
    if errors:
        raise PipelineError(errors)
    return loaded


def graph_problems(after: dict[str, list[str]]) -> list[tuple[FieldPath, str]]:
    """What is wrong with a graph of jobs (name -> the names it runs after): unknown names, a job after itself, a
    cycle through any number of jobs (named once, from its first job by name)."""
    problems: list[tuple[FieldPath, str]] = []
    for name, before in after.items():
        for index, other in enumerate(before):
            if other == name:
                problems.append((("jobs", name, "after", index), "a job cannot run after itself"))
            elif other not in after:
                problems.append((("jobs", name, "after", index),
                                 f"no job {other!r} in this pipeline{did_you_mean(other, list(after))}"))
    if problems:
        return problems
    cycle = _a_cycle(after)
    if cycle:
        problems.append((("jobs", cycle[0], "after"), "runs after itself through " + " → ".join(cycle + cycle[:1])))
    return problems


def topological_order(after: dict[str, list[str]]) -> list[str]:
    """The names, each after every name it runs after; ties by name (a graph without cycles)."""
    return [name for layer in topological_layers(after) for name in layer]


def topological_layers(after: dict[str, list[str]]) -> list[list[str]]:
    """The names in layers: each layer runs after the ones before it only, each name in the first layer it can be in;
    sorted by name within a layer.

    Raises:
        ValueError: some of the names run after each other in a cycle (or after a name not in ``after``).
    """
    layers: list[list[str]] = []
    done: set[str] = set()
    remaining = dict(after)
    while remaining:
        ready = sorted(name for name, before in remaining.items() if all(other in done for other in before))
        if not ready:
            raise ValueError(f"the jobs {sorted(remaining)} run after each other in a cycle")
        layers.append(ready)
        done.update(ready)
        for name in ready:
            del remaining[name]
    return layers


def _a_cycle(after: dict[str, list[str]]) -> list[str]:
    # Depth first, iteratively (a generated pipeline of hundreds of jobs must not reach Python's recursion limit).
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(after):
        if state.get(start):
            continue
        path: list[str] = [start]
        stack = [iter(after[start])]
        state[start] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(following) == 1:
                return path[path.index(following):]
            elif not state.get(following):
                state[following] = 1
                path.append(following)
                stack.append(iter(after[following]))
    return []


def job_id(run_id: str, name: str) -> str:
    """The Ray job id of job ``name`` in the pipeline run ``run_id``."""
    return f"{run_id}-{name}"


def is_name(text: str) -> bool:
    """Whether ``text`` may name a pipeline or one of its jobs."""
    return re.match(NAME_PATTERN, text) is not None


__all__ = ["LoadedPipeline", "MAX_JOBS", "NAME_RULE", "PipelineError", "PipelineFile", "PipelineJob",
           "graph_problems", "is_name", "is_pipeline_file", "job_id", "load_pipeline", "topological_layers",
           "topological_order"]
