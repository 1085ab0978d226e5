"""What a job's input can fail with, how it reads to a person, and the exit status each outcome gives.

The exit statuses and the bad-input error are one rule for both sides: the ``rayjobs`` command exits with them,
and so does a workload's entry point on the cluster (``workloads/entry.py``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class ExitCode(IntEnum):
    """What a ``rayjobs`` command, or a workload's entry point, exits with; "Exit codes" in
    docs/troubleshooting.md explains each."""

    SUCCEEDED = 0
    FAILED = 1  # the job ran and failed (or, for `stop`, could not be stopped); a workload's stage failed
    BAD_INPUT = 2  # a spec, flag, argument or a workload's parameters are wrong; nothing was submitted or done
    STOPPED = 3  # the job was stopped (by a user, or by rayjobs on request)
    CLUSTER_UNREACHABLE = 4  # no answer from the cluster, or the job's state is unknown
    TIMEOUT = 5  # timeout_s / start_timeout_s ran out and rayjobs stopped the job
    NOT_FOUND = 6  # no job with that id
    AUTH_FAILED = 7  # the cluster refused our credentials (or wanted some)
    INTERRUPTED = 130  # Ctrl-C while following: rayjobs detached, the job keeps running


class RayJobsError(Exception):
    """Base class: a problem with a one-paragraph message and an exit code."""

    exit_code: ExitCode = ExitCode.FAILED


class BadInput(RayJobsError, ValueError):
    """Input that cannot be used as given: a spec, flag, argument or request the cluster refused as malformed, or
    a workload's parameters or data; the message names it and says why. Nothing was submitted, or done."""

    exit_code = ExitCode.BAD_INPUT


FieldPath = tuple[str | int, ...]


def format_field_path(path: Sequence[str | int]) -> str:
    """``("workload", "train", "epochs")`` → ``workload.train.epochs``; list items as ``pip[0]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


# Names people reach for that spelling distance alone would not find.
_COMMON_MISNAMINGS = {
    "pypi": "pip",
    "requirements": "pip",
    "packages": "pip",
    "env": "env_vars",
    "environment": "env_vars",
    "workdir": "working_dir",
    "cwd": "working_dir",
    "command": "entrypoint",
    "cmd": "entrypoint",
    "num_cpus": "entrypoint_num_cpus",
    "num_gpus": "entrypoint_num_gpus",
    "memory": "entrypoint_memory",
    "resources": "entrypoint_resources",
    "job_id": "submission_id",
    "timeout": "timeout_s",
    "retries": "max_retries",
}


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A ``did you mean 'x'?`` hint for a misspelled key, or an empty string."""
    candidates = sorted(set(candidates))
    alias = _COMMON_MISNAMINGS.get(word.lower())
    if alias in candidates:
        return f" (did you mean {alias!r}?)"
    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


@dataclass
class Problem:
    """One thing wrong with a spec: where, and what."""

    message: str
    path: FieldPath = ()
    line: int | None = None
    source: str | None = None  # e.g. "--set" when the value came from the command line

    def render(self, file: str | None) -> str:
        """``file:line: field: message``, the way every problem is printed."""
        where = [file or "<spec>"]
        if self.line is not None and self.source is None:
            where[0] += f":{self.line}"
        text = ":".join(where)
        if self.path:
            text += f": {format_field_path(self.path)}"
        if self.source:
            text += f" (from {self.source})"
        return f"{text}: {self.message}"


@dataclass
class SpecError(Exception):
    """A spec that cannot be used. Rendered as ``file:line: field: what is wrong``."""

    file: str | None
    problems: list[Problem] = field(default_factory=list)

    @classmethod
    def single(cls, file: str | None, message: str, path: FieldPath = (), line: int | None = None) -> SpecError:
        """A SpecError holding one problem."""
        return cls(file, [Problem(message, path, line)])

    def __str__(self) -> str:
        return "\n".join(problem.render(self.file) for problem in self.problems)
