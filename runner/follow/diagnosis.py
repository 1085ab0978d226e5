"""Why a job failed, in one paragraph with what to do: read from the lines of its log as they pass.

Each cause is recognised by what Ray, PyTorch or Python print when it happens; the log is read
whole (the follower sees every line), so a cause named early is not lost behind a long traceback.
When several causes appear, the first in :data:`CAUSES` wins: a worker killed for memory makes its
peers' collectives fail too, and the cause is the memory, not the collective.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runner.follow.progress import RunProgress, short_reason

_DETAIL_CHARS = 300


@dataclass(frozen=True)
class Cause:
    """One kind of failure: how its lines look, and what to say."""

    name: str
    pattern: re.Pattern[str]
    says: str  # what happened; ``{detail}`` is the matched line's own words
    advice: str


@dataclass
class Diagnosis:
    """A failure's cause, the log line that shows it, and what to do."""

    cause: str
    text: str
    advice: str
    evidence: str

    def paragraph(self) -> str:
        return f"{self.text}. {self.advice}"

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "text": self.text, "advice": self.advice, "evidence": self.evidence}


CAUSES: tuple[Cause, ...] = (
    Cause("host_out_of_memory",
          re.compile(r"(OutOfMemoryError: Task was killed due to the node running low on memory|"
                     r"node running low on memory|Memory on the node \(IP: [\d.]+, ID: \w+\) where the "
                     r"(task|actor))", re.IGNORECASE),
          "Ray's memory monitor killed a worker: the node ran out of host memory",
          "Give each worker more memory (fewer workers per node, resources_per_worker with memory, or "
          "larger nodes), or make a worker need less (a smaller batch_size, fewer loader_workers, smaller "
          "images); RAY_memory_usage_threshold moves the point at which Ray kills (default 0.95)"),
    Cause("cuda_out_of_memory",
          re.compile(r"(CUDA out of memory|torch\.OutOfMemoryError|CUDA error: out of memory)"),
          "A GPU ran out of memory ({detail})",
          "Lower batch_size per worker, turn on mixed precision (amp), use a smaller model or image size, "
          "or spread the batch over more GPUs"),
    Cause("module_missing",
          re.compile(r"(ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?"),
          "A module is missing on the cluster: {detail}",
          "Install it in the job's environment (runtime_env.pip, or the cluster's image); if it is your own "
          "code, it must be inside runtime_env.working_dir or listed in runtime_env.py_modules"),
    Cause("disk_full",
          re.compile(r"(No space left on device|\[Errno 28\])"),
          "A disk on the cluster is full ({detail})",
          "Free space where the job writes (storage_path, data.output_dir, Ray's /tmp/ray session folder), "
          "keep fewer checkpoints (num_to_keep), or write results to object storage"),
    Cause("storage_credentials",
          re.compile(r"(InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|AccessDenied|"
                     r"Unable to locate credentials|NoCredentialsError|AWS Error ACCESS_DENIED)"),
          "Object storage refused the job's credentials ({detail})",
          "Put valid credentials into runtime_env.env_vars (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
          "AWS_SESSION_TOKEN; AWS_ENDPOINT_URL for a non-AWS endpoint) and check that they may read and write "
          "the bucket"),
    Cause("placement_infeasible",
          re.compile(r"(Insufficient cluster resources to launch training workers|"
                     r"No available node types can fulfill resource request|"
                     r"Error: No available node types can fulfill)"),
          "The cluster cannot place the job's workers: {detail}",
          "Ask for what one node has (num_workers × resources per worker, plus the entrypoint's own), or "
          "add nodes that have it; `rayjobs cluster status` lists each node's CPUs"),
    Cause("collective_timeout",
          re.compile(r"(Watchdog caught collective operation timeout|collective operation timeout|"
                     r"gloo.*Timed out waiting|Timed out waiting \d+ms for recv operation|"
                     r"NCCL.*timed? ?out|ProcessGroupNCCL.*Timeout)", re.IGNORECASE),
          "A collective operation (gloo/NCCL) timed out: one rank stopped taking part while the others waited",
          "Look for the rank that is behind: one that skips ray.train.report or a collective (every rank must "
          "call them the same number of times), one stuck reading data, or one much slower than the others; "
          "`rayjobs logs` has each rank's traceback"),
)


class FailureReader:
    """Reads every line of a job's log and keeps the first line of each known cause."""

    def __init__(self) -> None:
        self.found: dict[str, tuple[Cause, str]] = {}
        self.max_failures_line: str | None = None

    def line(self, text: str) -> None:
        """Take in one line (colour removed)."""
        if "Error count:" in text and "max allowed" in text:
            self.max_failures_line = text.strip()
        for cause in CAUSES:
            if cause.name in self.found:
                continue
            match = cause.pattern.search(text)
            if match is not None:
                self.found[cause.name] = (cause, _evidence(text))

    def diagnose(self, progress: RunProgress | None = None) -> Diagnosis | None:
        """The failure's cause, the first of :data:`CAUSES` seen; else Ray Train's own verdict; else None."""
        for cause in CAUSES:
            if cause.name in self.found:
                _, evidence = self.found[cause.name]
                detail = evidence if cause.name != "module_missing" else _missing_module(evidence)
                return Diagnosis(cause.name, cause.says.format(detail=detail), cause.advice, evidence)
        if progress is not None and progress.training_state == "ERRORED" and progress.restarts:
            used = len(progress.restarts)
            reason = short_reason(progress.restarts[-1].reason)
            return Diagnosis(
                "max_failures_used_up",
                f"Training failed {used + 1} times and used up its max_failures ({used}); the last failure: "
                f"{reason}",
                "Fix what the failures have in common (the reason above), or raise max_failures if they are "
                "transient (preempted or lost nodes)", self.max_failures_line or reason)
        return None


def _evidence(line: str) -> str:
    # Forwarded lines carry Ray's "(Worker pid=…)" prefix; the words after it are the evidence.
    text = re.sub(r"^\([^)]*\)\s*", "", line.strip())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS - 1] + "…"


def _missing_module(evidence: str) -> str:
    match = re.search(r"No module named '?([\w.]+)'?", evidence)
    return f"no module named '{match[1]}'" if match else evidence
