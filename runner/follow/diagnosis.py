"""Why a job failed, in one paragraph with what to do: read from the lines of its log as they pass.

Each cause is recognised by what Ray, PyTorch or Python print when it happens; the log is read
whole (the follower sees every line), so a cause named early is not lost behind a long traceback.
When several causes appear, the one nearest the failure (the latest in the log) wins: a run may
handle a missing optional module or wait out an autoscaler's complaint long before it fails of
something else. A cause that a progress report or a new training attempt follows was survived, so
it is forgotten. A collective's timeout is what the other ranks see when one rank dies or runs out
of memory: it is named only when nothing else is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jobs.run_vocabulary import EVENT_MARKER, EventKind, kind_of
from runner.follow.progress import RunProgress, parse_event, short_reason

_DETAIL_CHARS = 300


@dataclass(frozen=True)
class Cause:
    """One kind of failure: how its lines look, and what to say."""

    name: str
    pattern: re.Pattern[str]
    says: str  # what happened; ``{detail}`` is the matched line's own words
    advice: str
    # A failure that another one brings about (a peer that died leaves the others' collective waiting).
    consequence: bool = False


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
          # torch.save on a full disk never says so: its zip writer fails with one of the last two.
          re.compile(r"(No space left on device|\[Errno 28\]|\[errno 28\]|"
                     r"PytorchStreamWriter failed writing file|basic_ios::clear: iostream error|"
                     r"\[enforce fail at inline_container\.cc:\d+\] \. unexpected pos \d+ vs \d+)"),
          "A disk on the cluster is full ({detail})",
          "Free space where the job writes (storage_path, data.output_dir, Ray's /tmp/ray session folder), "
          "keep fewer checkpoints (num_to_keep), or write results to object storage"),
    Cause("storage_credentials",
          # boto names the refusal in CamelCase, pyarrow (the AWS C++ SDK) in capitals.
          re.compile(r"(InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|AccessDenied|"
                     r"Unable to locate credentials|NoCredentialsError|"
                     r"AWS Error (ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|EXPIRED_TOKEN)|"
                     r"The AWS Access Key Id you provided does not exist)"),
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
          "`rayjobs logs` has each rank's traceback", consequence=True),
    Cause("node_lost",
          # The GCS's notice when a node stops answering, and the ActorDiedError of each actor that was on it.
          # The ranks on other nodes fail first (gloo's "Connection reset by peer"): that names no cause, since
          # a crashed peer process reads the same; these lines follow within the GCS's health-check timeout.
          re.compile(r"(has been marked dead because the detector has missed too many heartbeats|"
                     r"The actor died because its node has died|the actor's node was terminated unexpectedly|"
                     r"NodeDiedError|Raylet is terminated\. Termination is unexpected)"),
          "A node of the cluster was lost while the job ran ({detail})",
          "Submit again on the nodes left: retry_on: [node_lost] with max_retries does so, and each attempt of a "
          "built-in workload resumes from the run's latest checkpoint (train.max_failures restarts within the "
          "same job instead). Find out why the node went (preempted, shut down, its raylet killed or out of "
          "memory): `rayjobs cluster status` lists the nodes that are dead"),
)


class FailureReader:
    """Reads every line of a job's log and keeps the latest line of each known cause."""

    def __init__(self) -> None:
        # cause name -> (cause, its evidence, the number of the line it was last seen on)
        self.found: dict[str, tuple[Cause, str, int]] = {}
        self.max_failures_line: str | None = None
        self._lines = 0

    def line(self, text: str) -> None:
        """Take in one line (colour removed)."""
        self._lines += 1
        event = parse_event(text) if EVENT_MARKER in text else None
        if event is not None:
            if kind_of(event) in (EventKind.REPORT, EventKind.ATTEMPT):
                self.found.clear()  # the run went on past what was seen so far
            return
        if "Error count:" in text and "max allowed" in text:
            self.max_failures_line = text.strip()
        for cause in CAUSES:
            if cause.pattern.search(text) is not None:
                self.found[cause.name] = (cause, _evidence(text), self._lines)

    def diagnose(self, progress: RunProgress | None = None) -> Diagnosis | None:
        """The failure's cause, the one seen nearest the end; else Ray Train's own verdict; else None."""
        if self.found:
            cause, evidence, _ = max(self.found.values(), key=lambda seen: (not seen[0].consequence, seen[2]))
            detail = evidence if cause.name != "module_missing" else _missing_module(evidence)
            return Diagnosis(cause.name, cause.says.format(detail=detail), cause.advice, evidence)
        if progress is not None and progress.training_state == "ERRORED" and progress.restarts:
            return Diagnosis(
                "max_failures_used_up", _failures_used_up(progress.restarts),
                "Fix what the failures have in common (the reason above), or raise max_failures if they are "
                "transient (preempted or lost nodes)",
                self.max_failures_line or short_reason(progress.restarts[-1].reason))
        return None


def _failures_used_up(restarts: list) -> str:
    """What the restarts say, counted per training run: a sweep's trials each have their own max_failures."""
    per_run: dict[str | None, int] = {}
    for restart in restarts:
        per_run[restart.run] = per_run.get(restart.run, 0) + 1
    reason = short_reason(restarts[-1].reason)
    if len(per_run) == 1:
        used = len(restarts)
        return f"Training failed {used + 1} times and used up its max_failures ({used}); the last failure: {reason}"
    runs = ", ".join(f"{run or 'a run'} {used + 1} times" for run, used in per_run.items())
    return (f"Training failed in {len(per_run)} runs, each with its own max_failures ({max(per_run.values())}): "
            f"{runs}; the last failure: {reason}")


def _evidence(line: str) -> str:
    # Forwarded lines carry Ray's "(Worker pid=…)" prefix; the words after it are the evidence.
    text = re.sub(r"^\([^)]*\)\s*", "", line.strip())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS - 1] + "…"


def _missing_module(evidence: str) -> str:
    match = re.search(r"No module named '?([\w.]+)'?", evidence)
    return f"no module named '{match[1]}'" if match else evidence
