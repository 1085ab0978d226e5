"""Submitting a job: with Ray's ``JobSubmissionClient`` when it has work to do, else straight to the job API.

Ray's client packages and uploads a local working_dir or py_modules, reads requirement files
and checks runtime_env fields before it sends the job request. A job whose runtime_env holds
env_vars alone (or nothing) needs none of that, so its request is sent over the standard
library instead: ``import ray`` and the interpreter's teardown of it cost about half a second,
a fifth of a short job's whole ``rayjobs submit``. Both paths send the same request body.

Reached through the cluster client, ``runner.client.jobs_api.JobsApi.submit``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import secrets
import signal
import string
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from jobs.infra import ray_internals
from jobs.infra.ray_env import prepare_ray_env
from jobs.submission import local_runtime_paths
from rayjobs_agent.package import agent_package, is_agent_module
from jobs.infra.http import bypass_proxy_for_loopback
from runner.client.connection import Connection
from runner.errors import AuthFailed, BadInput, ClusterRequestFailed, ClusterUnreachable

# The dashboard refuses request bodies over 100 MiB (aiohttp's client_max_size), and a
# working_dir is uploaded as one zip in one request.
UPLOAD_LIMIT_BYTES = 100 * 1024**2
UPLOAD_WARN_BYTES = UPLOAD_LIMIT_BYTES // 2
# From about this size, packaging and uploading take long enough to be worth a line.
UPLOAD_NOTE_BYTES = 16 * 1024**2
# The fields Ray's client refuses to send to a cluster older than the version given (its own check and words).
_FIELDS_SINCE = (
    (("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_resources", "entrypoint_label_selector"), (2, 2),
     "`entrypoint_num_cpus`, `entrypoint_num_gpus`, `entrypoint_resources`, and `entrypoint_label_selector` kwargs "
     "are not supported on the Ray cluster"),
    (("entrypoint_memory",), (2, 8), "`entrypoint_memory` kwarg is not supported on the Ray cluster"),
)


class JobRequests(Protocol):
    """What the direct path needs of the cluster client (``runner.client.jobs_api.JobsApi``)."""

    def version(self) -> dict[str, Any]: ...

    def create_job(self, request: dict[str, Any]) -> str: ...

    def ensure_package(self, name: str, data: bytes) -> bool: ...


def working_dir_size(working_dir: str, excludes: list[str]) -> int:
    """Bytes of the files Ray would upload from ``working_dir``.

    Args:
        working_dir: a local directory.
        excludes: ``runtime_env.excludes``; .gitignore and .rayignore files count too, as for Ray.

    Returns:
        The total size in bytes, before compression.
    """
    total = 0

    def add(path: Path) -> None:
        nonlocal total
        if path.is_file():
            total += path.stat().st_size

    ray_internals.walk_upload(Path(working_dir), excludes, add)
    return total


class SubmitInterrupted(Exception):
    """Ctrl-C arrived while submitting.

    ``submission_id`` is None when the job request had not gone out: nothing was submitted.
    Otherwise the request had been sent, and ``answered`` says whether the cluster's answer
    (the job exists) came back before the interrupt.
    """

    def __init__(self, submission_id: str | None, answered: bool = False) -> None:
        super().__init__(submission_id)
        self.submission_id = submission_id
        self.answered = answered


@dataclass
class _JobRequestWatch:
    sent: bool = False
    interrupted: bool = False  # a Ctrl-C came, whether or not its KeyboardInterrupt reached this code

    def refuse_if_interrupted(self) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that Python dropped: nothing more is sent after it."""
        if self.interrupted:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _interrupts_noted(watch: _JobRequestWatch) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as ever, and is noted in ``watch`` too, so that it is never lost: Python drops
    a KeyboardInterrupt raised while a module is being imported (in importlib's lock callback), and Ray's SDK imports
    as it packages the working_dir. A noted Ctrl-C sends no request after it and ends the submission as interrupted.

    Only Python's own handler is wrapped: a program with a handler of its own (asyncio's, one that ignores the
    signal) keeps it as it is, in the main thread as in any other.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    later: list[threading.Timer] = []

    def noted(signum: int, frame: Any) -> None:
        watch.interrupted = True
        if _drops_exceptions(frame):
            # Raised here, the interrupt would be printed as ignored and lost: it comes again in a moment.
            again = threading.Timer(INTERRUPT_AGAIN_S, os.kill, (os.getpid(), signal.SIGINT))
            again.daemon = True
            later.append(again)
            again.start()
            return
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        for again in later:
            again.cancel()
        _restore_python_interrupts()


# A Ctrl-C that lands where Python would drop its KeyboardInterrupt is raised again after this long.
INTERRUPT_AGAIN_S = 0.05


def _drops_exceptions(frame: Any) -> bool:
    """Whether ``frame`` is one whose exceptions Python prints as ignored: importlib's module-lock callback, which
    the garbage collector runs at any moment of an import."""
    code = getattr(frame, "f_code", None)
    return code is not None and code.co_name == "cb" and code.co_filename.startswith("<frozen importlib")


def _restore_python_interrupts() -> None:
    """Give SIGINT back to Python's own handler, even when a Ctrl-C lands meanwhile (``signal.signal`` runs a
    pending handler before it changes it): that Ctrl-C is raised once the handler is back."""
    interrupted = False
    while signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt


def new_submission_id() -> str:
    """An id of the form Ray gives jobs: ``raysubmit_`` and 16 letters or digits."""
    alphabet = sorted(set(string.ascii_letters + string.digits) - set("IloO0"))
    return "raysubmit_" + "".join(secrets.choice(alphabet) for _ in range(16))


def submit_job(connection: Connection, submission: dict[str, Any],
               warn: Callable[[str], None] = lambda text: None,
               progress: Callable[[str], None] = lambda text: None, rest: JobRequests | None = None,
               deliver: Callable[[dict[str, Any]], None] | None = None) -> str:
    """Submit a job to the cluster of ``connection`` (or, with ``deliver``, prepare it: packages uploaded, request kept).

    Args:
        connection: where to submit, with its headers and TLS verification.
        submission: keyword arguments of ``JobSubmissionClient.submit_job``.
        warn: hears of a working_dir that nears the dashboard's upload limit.
        progress: hears of a large working_dir before it is packaged and uploaded.
        rest: the cluster client for the same connection; with it, a job that Ray's client has
            nothing to do for is sent without importing ray (see :func:`needs_ray_client`).
        deliver: hears the job request's body instead of the cluster (a queue sends it when the job's turn comes).

    Returns:
        The submission id (chosen here when ``submission`` names none).

    Raises:
        SubmitInterrupted: Ctrl-C; it tells whether the job request had gone out.
        BadInput: the upload is too large, or the cluster or Ray refused the job as malformed.
        AuthFailed, ClusterUnreachable, ClusterRequestFailed: refused credentials, no answer, a server error.
    """
    # Chosen here rather than by the cluster, so that after an interrupt in mid-request the
    # job can still be looked up.
    submission = {**submission, "submission_id": submission.get("submission_id") or new_submission_id()}
    watch = _JobRequestWatch()
    try:
        with _interrupts_noted(watch):
            if rest is not None and not needs_ray_client(submission):
                job_id = _submit_directly(rest, connection.address, submission, watch, deliver)
            else:
                job_id = _submit(connection, submission, warn, progress, watch, deliver)
    except KeyboardInterrupt:
        raise SubmitInterrupted(submission["submission_id"] if watch.sent else None) from None
    if watch.interrupted:  # a Ctrl-C Python dropped after the last request went out: said as if it had not been
        raise SubmitInterrupted(job_id if watch.sent else None, answered=watch.sent)
    return job_id


def needs_ray_client(submission: dict[str, Any]) -> bool:
    """Whether the job request needs Ray's client: a runtime_env with more than env_vars (to upload or check).

    The agent's own package in py_modules is no reason: it is small, and sent without Ray
    (``rayjobs_agent.package.agent_package``), so a job that keeps a record but uploads no code stays a plain request.
    """
    runtime_env = submission.get("runtime_env") or {}
    if any(key not in ("env_vars", "py_modules") for key in runtime_env):
        return True
    modules = runtime_env.get("py_modules")
    return "py_modules" in runtime_env and not (isinstance(modules, list) and len(modules) == 1
                                                and is_agent_module(modules[0]))


def job_request(submission: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of the job request, as ``JobSubmissionClient.submit_job`` builds it for ``submission``.

    Only for a submission without a runtime_env to check (see :func:`needs_ray_client`). Like Ray's
    client, it sends env_vars unchanged (empty ones not at all), runtime_env and metadata always
    (empty when unset), and no field that is None.
    """
    runtime_env = submission.get("runtime_env") or {}
    env_vars = runtime_env.get("env_vars")
    sent: dict[str, Any] = {"env_vars": dict(env_vars)} if env_vars else {}
    if runtime_env.get("py_modules"):
        sent["py_modules"] = list(runtime_env["py_modules"])
    body = {**submission, "runtime_env": sent, "metadata": dict(submission.get("metadata") or {})}
    return {key: value for key, value in body.items() if value is not None}


def _submit_directly(rest: JobRequests, address: str, submission: dict[str, Any], watch: _JobRequestWatch,
                     deliver: Callable[[dict[str, Any]], None] | None = None) -> str:
    modules = (submission.get("runtime_env") or {}).get("py_modules") or []
    if any(is_agent_module(module) for module in modules):
        name, data = agent_package()
        rest.ensure_package(name, data)
        runtime_env = {**submission["runtime_env"],
                       "py_modules": [f"gcs://{name}" if is_agent_module(module) else module for module in modules]}
        submission = {**submission, "runtime_env": runtime_env}
    request = job_request(submission)
    for fields, since, refusal in _FIELDS_SINCE:
        if any(request.get(name) for name in fields):
            running = str(rest.version().get("ray_version", "0"))
            if _major_minor(running) < since:
                raise ClusterRequestFailed(f"submitting to {address} failed: Ray version {running} is running on the "
                                           f"cluster. {refusal}. Please ensure the cluster is running Ray "
                                           f"{since[0]}.{since[1]} or higher")
    watch.refuse_if_interrupted()
    if deliver is not None:
        deliver(request)
        return request["submission_id"]
    watch.sent = True
    return rest.create_job(request)


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _submit(connection: Connection, submission: dict[str, Any], warn: Callable[[str], None],
            progress: Callable[[str], None], watch: _JobRequestWatch,
            deliver: Callable[[dict[str, Any]], None] | None = None) -> str:
    prepare_ray_env()
    runtime_env = submission.get("runtime_env") or {}
    working_dir = dict(local_runtime_paths(runtime_env)).get("working_dir")
    if working_dir:
        size = working_dir_size(working_dir, runtime_env.get("excludes", []))
        if size >= UPLOAD_WARN_BYTES:
            warn(f"working_dir {working_dir} holds {size / 2**20:.0f} MiB to upload (before compression); the "
                 f"dashboard refuses uploads over {UPLOAD_LIMIT_BYTES // 2**20} MiB. Leave data out with "
                 "runtime_env.excludes or a .rayignore file, or send the code through object storage with "
                 "code_path: s3://BUCKET/PREFIX")

    from ray.exceptions import AuthenticationError

    # Ray's SDK logs each packaging step at INFO; rayjobs reports what matters itself. Its
    # modules set their loggers to INFO when imported, so they are imported first.
    importlib.import_module("ray.dashboard.modules.job.sdk")

    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("ray.dashboard", ray_internals.PACKAGING_LOGGER.rpartition(".")[0])):
            logging.getLogger(name).setLevel(logging.ERROR)
    # Said once Ray is loaded, when packaging really begins: Python drops a Ctrl-C that lands while a
    # module is being imported, so an interrupt prompted by this line must not meet an import.
    if working_dir and size >= UPLOAD_NOTE_BYTES:
        progress(f"packaging and uploading working_dir {working_dir} ({size / 2**20:.0f} MiB)")

    try:
        client = _job_client(connection, watch, deliver)
        return client.submit_job(**submission)
    except AuthenticationError as exc:
        raise AuthFailed(f"the cluster at {connection.address} refused the submission: {_first_line(exc)}") from None
    except ConnectionError as exc:
        raise ClusterUnreachable(f"cannot reach the Ray dashboard at {connection.address}: {_first_line(exc)}. "
                                 "Is the cluster running and the address right?") from None
    except RuntimeError as exc:
        text = str(exc)
        if "status code 413" in text:
            raise BadInput(f"the working_dir upload is larger than the dashboard accepts "
                           f"({UPLOAD_LIMIT_BYTES // 2**20} MiB); leave data out with runtime_env.excludes or "
                           ".rayignore, or send the code through object storage with code_path: "
                           "s3://BUCKET/PREFIX (Ray's nodes download it from there)") from None
        if "status code 400" in text:
            raise BadInput(f"the cluster rejected the job: {_ray_reason(text)}") from None
        if "status code 401" in text or "status code 403" in text:
            raise AuthFailed(f"the cluster at {connection.address} refused the submission: {_ray_reason(text)}") \
                from None
        raise ClusterRequestFailed(f"submitting to {connection.address} failed: {_ray_reason(text)}") from None
    except (ValueError, TypeError) as exc:
        raise BadInput(f"Ray refused the submission: {_first_line(exc)}") from None


def _job_client(connection: Connection, watch: _JobRequestWatch,
                deliver: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """A ``JobSubmissionClient`` that notes in ``watch`` when the job request itself goes out (or hands it to
    ``deliver`` instead of sending it)."""
    def sent() -> None:
        watch.sent = True

    client_class = ray_internals.job_client_noting_job_request(sent, deliver, watch.refuse_if_interrupted)
    # Ray's client goes through `requests`, which reads the proxy variables itself.
    bypass_proxy_for_loopback()

    # Ray's client lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override the address it is given;
    # rayjobs has already chosen the address, by its own precedence.
    chosen_elsewhere = {name: os.environ.pop(name) for name in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
                        if name in os.environ}
    try:
        return client_class(connection.address, headers=dict(connection.headers), verify=connection.verify)
    finally:
        os.environ.update(chosen_elsewhere)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _ray_reason(text: str) -> str:
    # Ray's errors carry the server's traceback; its last line is the actual reason.
    lines = [line.strip() for line in text.splitlines() if line.strip().strip(".:")]
    reason = lines[-1].rstrip(".") if lines else ""
    return reason[:500] or "no reason given"
