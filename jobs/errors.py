"""The one exception a spec can fail with, and how it reads to a person."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
