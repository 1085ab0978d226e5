"""Why a job failed, in one paragraph with what to do: the one table of causes, read from the lines of its log.

The agent beside every job reads the job's whole output as it is written and decides, with this
table, why the entrypoint failed; it says so once, as a ``cause`` event in the log and in the run
record, and everything else (the terminal, ``rayjobs status``, notifications, the Python API, whether
an attempt is retried) reads that decision. A new cause is one more :class:`Cause` in :data:`CAUSES`.

Each cause is recognised by what Ray, PyTorch or Python print when it happens; the log is read whole,
so a cause named early is not lost behind a long traceback. When several causes appear, the one
nearest the failure (the latest in the log) wins: a run may handle a missing optional module or wait
out an autoscaler's complaint long before it fails of something else. A cause that a progress report
or a new training attempt follows was survived, so it is forgotten. A collective's timeout is what the
other ranks see when one rank dies or runs out of memory: it is named only when nothing else is.

An exit code says a signal in two spellings: ``-N`` to the Python that started the process, ``128 + N``
to a shell that did. Both mean the same to a person, and to ``retry_on: [exit_code:137]``.

Standard library only: it runs in the job's wrapper on the cluster, and the client imports it.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from .vocabulary import EventKind, decode, kind_of

_DETAIL_CHARS = 300


@dataclass(frozen=True)
class Cause:
    """One kind of failure: how its lines look, what to say, and whether another attempt may get past it."""

    name: str
    pattern: re.Pattern[str]
    says: str  # what happened; ``{detail}`` is the matched line's own words
    advice: str
    # False: the same code, environment and credentials fail the same way again; never retried.
    retryable: bool = True
    # A failure that another one brings about (a peer that died leaves the others' collective waiting).
    consequence: bool = False
    never_retried_because: str = ""


@dataclass
class Diagnosis:
    """A failure's cause, the log line that shows it, and what to do."""

    cause: str
    text: str
    advice: str
    evidence: str
    retryable: bool = True

    def paragraph(self) -> str:
        """What happened and what to do, as one paragraph."""
        return f"{self.text}. {self.advice}"

    def as_dict(self) -> dict[str, Any]:
        """The fields a ``cause`` event and ``run.json`` carry."""
        return {"cause": self.cause, "text": self.text, "advice": self.advice, "evidence": self.evidence,
                "retryable": self.retryable}

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Diagnosis | None:
        """The diagnosis a ``cause`` event carries (None for an unrecognised failure)."""
        if event.get("cause") in (None, "", UNKNOWN):
            return None
        return cls(str(event["cause"]), str(event.get("text") or ""), str(event.get("advice") or ""),
                   str(event.get("evidence") or ""), bool(event.get("retryable", True)))


# The cause of a failure the table does not recognise.
UNKNOWN = "unknown"

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
          "code, it must be inside runtime_env.working_dir or listed in runtime_env.py_modules",
          retryable=False, never_retried_because="a missing module is missing again in the next attempt"),
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
          "the bucket", retryable=False,
          never_retried_because="refused credentials are refused again in the next attempt"),
    Cause("checkpoint_deleted_before_report",
          # A checkpoint folder made with tempfile.TemporaryDirectory() and reported after its `with` block ended:
          # Ray Train's upload of it finds nothing (pyarrow's local filesystem, or the copy's own listing).
          re.compile(r"((FileNotFoundError|OSError).*(Failed to open local file|No such file or directory|"
                     r"Cannot get information for path).*/tmp/tmp\w+)"),
          "The checkpoint folder was deleted before `ray.train.report` uploaded it ({detail})",
          "Call `ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))` inside the `with "
          "tempfile.TemporaryDirectory() as folder:` block that wrote it, not after: Ray Train copies the folder "
          "during report", retryable=False,
          never_retried_because="the same script deletes its checkpoint again in the next attempt"),
    Cause("placement_infeasible",
          re.compile(r"(Insufficient cluster resources to launch training workers|"
                     r"No available node types can fulfill resource request|"
                     r"Error: No available node types can fulfill)"),
          "The cluster cannot place the job's workers: {detail}",
          "Ask for what one node has (num_workers × resources per worker, plus the entrypoint's own), or "
          "add nodes that have it; `rayjobs cluster status` lists each node's CPUs"),
    Cause("workers_not_placed",
          # A built-in workload's words once Ray Train's tries at placing its workers are used up
          # (workloads/ray_train/restarts.py), and Ray Train's own for a try that timed out (a script's own run).
          re.compile(r"((WorkerGroupStartupTimeoutError|WorkersNotPlaced): .*(could not be placed|held fewer than)|"
                     r"worker group startup timed out after [\d.]+ seconds waiting for \d+ workers)"),
          "The training workers could not be placed on the nodes up ({detail})",
          "A fixed layout (num_workers as a number) needs as many nodes as it was planned on: after a node is lost, "
          "bring one back, or leave num_workers: auto (or set train.min_workers), and training goes on with the "
          "nodes left. Ray Train tries for a bounded time, RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S a try: raise it in "
          "runtime_env.env_vars for an autoscaler slower than that. retry_on: [workers_not_placed] runs the "
          "entrypoint again in the same job, from the run's latest checkpoint"),
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
          "Run it again on the nodes left: retry_on: [node_lost] with max_retries does so in the same job, and each "
          "attempt of a built-in workload resumes from the run's latest checkpoint (train.max_failures restarts "
          "within the same attempt instead). Find out why the node went (preempted, shut down, its raylet killed "
          "or out of memory): `rayjobs cluster status` lists the nodes that are dead"),
)
# The cause Ray Train's own verdict gives when its restarts ran out (read from the progress events, not a line).
MAX_FAILURES_USED_UP = "max_failures_used_up"
# The causes another attempt may get past, and those it never gets past (with why), for retry_on.
RETRYABLE_CAUSES = tuple(cause.name for cause in CAUSES if cause.retryable) + (MAX_FAILURES_USED_UP,)
PERMANENT_CAUSES = {cause.name: cause.never_retried_because for cause in CAUSES if not cause.retryable}


class FailureReader:
    """Reads every line of a job's log (secrets already masked) and keeps the latest line of each known cause."""

    def __init__(self) -> None:
        # cause name -> (cause, its evidence, the number of the line it was last seen on)
        self.found: dict[str, tuple[Cause, str, int]] = {}
        self.max_failures_line: str | None = None
        # Ray Train's restarts seen (run, reason), and whether its run ended ERRORED.
        self.restarts: list[tuple[str | None, str]] = []
        self.training_errored = False
        # The last exception the log names (``ValueError: …``): all that is known of a failure no cause explains.
        self.last_raised: str | None = None
        self._lines = 0

    def forget_attempt(self) -> None:
        """The entrypoint runs again: what the last attempt printed says nothing of the next one."""
        self.found.clear()
        self.last_raised = None
        self.max_failures_line = None
        self.restarts.clear()
        self.training_errored = False

    def line(self, text: str) -> None:
        """Take in one line (colour removed)."""
        self._lines += 1
        event = decode(text)
        if event is not None:
            self.event(event)
            return
        if "Error count:" in text and "max allowed" in text:
            self.max_failures_line = text.strip()
        for cause in CAUSES:
            if cause.pattern.search(text) is not None:
                self.found[cause.name] = (cause, _evidence(text), self._lines)
        if _RAISED.match(_evidence(text)):
            self.last_raised = _evidence(text)

    def event(self, event: dict[str, Any]) -> None:
        """Take in one progress event (one the line reader found, or one a caller decoded)."""
        kind = kind_of(event)
        if kind in (EventKind.REPORT, EventKind.ATTEMPT):
            self.found.clear()  # the run went on past what was seen so far
        elif kind == EventKind.RESTART:
            self.restarts.append((event.get("run"), str(event.get("reason") or "")))
        elif kind == EventKind.TRAIN_END:
            self.training_errored = event.get("state") == "ERRORED"
        elif kind == EventKind.TRAIN_START:
            self.training_errored = False

    def diagnose(self) -> Diagnosis | None:
        """The failure's cause, the one seen nearest the end; else Ray Train's own verdict; else None."""
        if self.found:
            cause, evidence, _ = max(self.found.values(), key=lambda seen: (not seen[0].consequence, seen[2]))
            detail = evidence if cause.name != "module_missing" else _missing_module(evidence)
            return Diagnosis(cause.name, cause.says.format(detail=detail), cause.advice, evidence, cause.retryable)
        if self.training_errored and self.restarts:
            return Diagnosis(
                MAX_FAILURES_USED_UP, _failures_used_up(self.restarts),
                "Fix what the failures have in common (the reason above), or raise max_failures if they are "
                "transient (preempted or lost nodes)",
                self.max_failures_line or short_reason(self.restarts[-1][1]))
        return None


def read_failure(text: str) -> Diagnosis | None:
    """The cause a whole log names (a log the agent wrote no ``cause`` event in: a job not run under it)."""
    reader = FailureReader()
    for line in text.splitlines():
        reader.line(line)
    return reader.diagnose()


def _failures_used_up(restarts: list[tuple[str | None, str]]) -> str:
    """What the restarts say, counted per training run: a sweep's trials each have their own max_failures."""
    per_run: dict[str | None, int] = {}
    for run, _ in restarts:
        per_run[run] = per_run.get(run, 0) + 1
    reason = short_reason(restarts[-1][1])
    if len(per_run) == 1:
        used = len(restarts)
        return f"Training failed {used + 1} times and used up its max_failures ({used}); the last failure: {reason}"
    runs = ", ".join(f"{run or 'a run'} {used + 1} times" for run, used in per_run.items())
    return (f"Training failed in {len(per_run)} runs, each with its own max_failures ({max(per_run.values())}): "
            f"{runs}; the last failure: {reason}")


_RANK_SNIPPET = re.compile(r"^\[Rank (\d+) Error Snippet\]:\s*$", re.MULTILINE)
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
# A rank that fails because another rank is gone says so through the collective it was in; the rank
# that is gone is the cause worth naming.
_CONSEQUENCE = re.compile(r"Connection reset by peer|Connection closed by peer|gloo|NCCL|ProcessGroup|"
                          r"Broken pipe|collective operation timeout", re.IGNORECASE)
_PROCESS_DIED = re.compile(r"worker process has died|health check failed|actor died unexpectedly", re.IGNORECASE)
_REASON_LINE_CHARS = 300


def short_reason(reason: str | None) -> str:
    """One line that names a training failure.

    Ray wraps every failed rank's traceback (``[Rank N Error Snippet]:``); the line chosen is the cause:
    a rank whose process died, else a rank's own error, rather than another rank's broken collective.
    """
    if not reason:
        return "no reason given"
    snippets = _RANK_SNIPPET.split(reason.strip())
    if len(snippets) > 1:
        ranks = [(int(snippets[index]), snippets[index + 1]) for index in range(1, len(snippets) - 1, 2)]
        for rank, text in ranks:
            if _PROCESS_DIED.search(text):
                detail = re.search(r"Worker exit detail: ([^.]*)", text)
                return _clip(f"rank {rank}'s worker process died" + (f" ({detail[1].strip()})" if detail else ""))
        own = [(rank, text) for rank, text in ranks if text.strip() and not _CONSEQUENCE.search(text)]
        rank, text = (own or [(rank, text) for rank, text in ranks if text.strip()] or [(None, reason)])[0]
        return _clip((f"rank {rank}: " if rank is not None else "") + _last_raised(text))
    return _clip(_last_raised(reason))


def _last_raised(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return raised[-1] if raised else (lines[-1] if lines else "no reason given")


def _clip(line: str) -> str:
    return line if len(line) <= _REASON_LINE_CHARS else line[:_REASON_LINE_CHARS - 1] + "…"


def _evidence(line: str) -> str:
    # Forwarded lines carry Ray's "(Worker pid=…)" prefix; the words after it are the evidence.
    text = re.sub(r"^\([^)]*\)\s*", "", line.strip())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS - 1] + "…"


def _missing_module(evidence: str) -> str:
    match = re.search(r"No module named '?([\w.]+)'?", evidence)
    return f"no module named '{match[1]}'" if match else evidence


# --- what an exit code says -------------------------------------------------------------------------------------

# What a person should know of the signals that usually end a job from outside.
_SIGNAL_HINTS = {signal.SIGKILL: ", often the kernel's out-of-memory killer", signal.SIGTERM: ", a stop"}
_SHELL_SIGNAL_BASE = 128


def signal_of(code: int | None) -> int | None:
    """The signal an exit code says ended the process (``-9`` or ``137`` → 9), or None."""
    if code is None or code == 0:
        return None
    number = -code if code < 0 else code - _SHELL_SIGNAL_BASE if _SHELL_SIGNAL_BASE < code <= _SHELL_SIGNAL_BASE + 64 \
        else 0
    try:
        return int(signal.Signals(number))
    except ValueError:
        return None


def killed_by(code: int | None) -> str:
    """What an exit code that says a signal ended the process tells, to follow "the entrypoint "; "" for any other.

    ``-9``: ``was killed by signal 9 (SIGKILL), often the kernel's out-of-memory killer``; ``137``: ``ended with exit
    code 137, which a shell gives a command killed by signal 9 (SIGKILL), …``.
    """
    number = signal_of(code)
    if number is None:
        return ""
    assert code is not None
    how = "was killed by" if code < 0 else f"ended with exit code {code}, which a shell gives a command killed by"
    return f"{how} signal {number} ({signal.Signals(number).name}){_SIGNAL_HINTS.get(number, '')}"


def same_exit_codes(code: int) -> set[int]:
    """``code`` and the other spelling of the same signal (``-9`` and ``137``), for matching ``exit_code:N``."""
    number = signal_of(code)
    return {code} if number is None else {code, -number, _SHELL_SIGNAL_BASE + number}


__all__ = ["CAUSES", "MAX_FAILURES_USED_UP", "PERMANENT_CAUSES", "RETRYABLE_CAUSES", "UNKNOWN", "Cause", "Diagnosis",
           "FailureReader", "killed_by", "read_failure", "same_exit_codes", "short_reason", "signal_of"]
