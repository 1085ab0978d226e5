"""Every use of Ray's private internals, in one place, each saying what public API it stands in for.

Ray's private modules change without notice. Keeping them here means an upgrade of Ray breaks
one module, and ``tests/test_ray_internals.py`` names the Ray version and the symbol that went
missing before anything else fails. Nothing here imports ``ray`` at module level: specs are
validated on machines without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# (module, attribute): every private symbol used below, for the test that checks them all.
PRIVATE_SYMBOLS: tuple[tuple[str, str], ...] = (
    # Packaging a working_dir exactly as JobSubmissionClient would (no public API packages without uploading).
    ("ray._private.runtime_env.packaging", "create_package"),
    ("ray._private.runtime_env.packaging", "get_uri_for_directory"),
    # Walking the files an upload would hold, to size it before Ray refuses it.
    ("ray._private.runtime_env.packaging", "_dir_travel"),
    ("ray._private.runtime_env.packaging", "_get_excludes"),
    # The switches and defaults JobSubmissionClient applies to a working_dir.
    ("ray._private.ray_constants", "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"),
    ("ray._private.ray_constants", "get_runtime_env_default_excludes"),
    # `ray start` refuses to join a node on loopback unless this flag is on (see WORKER_NODE_LAUNCHER).
    ("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),
    ("ray.scripts.scripts", "ray_constants"),
    # Telling the job-creating request from upload requests (no hook in the public client).
    ("ray.dashboard.modules.job.sdk", "JobSubmissionClient._do_request"),
    # Finding a run's checkpoints after the trainer is gone, as Ray Train itself records them.
    ("ray.train.v2._internal.constants", "CHECKPOINT_MANAGER_SNAPSHOT_FILENAME"),
    ("ray.train.v2._internal.constants", "is_v2_enabled"),
)

PACKAGING_LOGGER = "ray._private.runtime_env.packaging"
# Logs advice meant for starting a trainer when a finished run's snapshot is only read.
CHECKPOINT_MANAGER_LOGGER = "ray.train.v2._internal.execution.checkpoint.checkpoint_manager"

# Runs Ray's own `ray start` CLI with its multi-node guard seeing "enabled" while the rest of Ray
# keeps the loopback-only setting from the environment: `python -c WORKER_NODE_LAUNCHER ARGS…`.
WORKER_NODE_LAUNCHER = (
    "import sys, types\n"
    "import ray._private.ray_constants as constants\n"
    "from ray.scripts import scripts\n"
    "view = types.ModuleType(constants.__name__)\n"
    "view.__dict__.update(vars(constants))\n"
    "view.ENABLE_RAY_CLUSTER = True\n"
    "scripts.ray_constants = view\n"
    "sys.argv[0] = 'ray'\n"
    "sys.exit(scripts.main())\n"
)


def include_gitignore() -> bool:
    """Whether a working_dir upload leaves out what .gitignore files list, as JobSubmissionClient decides it."""
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE

    return os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"


def default_working_dir_excludes() -> list[str]:
    """The patterns Ray adds to every working_dir's excludes."""
    from ray._private.ray_constants import get_runtime_env_default_excludes

    return get_runtime_env_default_excludes()


def walk_upload(root: Path, excludes: list[str], visit: Callable[[Path], None]) -> None:
    """Call ``visit`` on every path Ray would upload from ``root``: excludes and .rayignore applied, and .gitignore
    unless ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1`` says Ray's upload takes what it lists too."""
    from ray._private.runtime_env import packaging

    packaging._dir_travel(root, [packaging._get_excludes(root, excludes)], visit,
                          include_gitignore=include_gitignore(), logger=logging.getLogger("rayjobs.upload"))


def package_name(directory: Path, excludes: list[str]) -> str:
    """The name Ray gives the package of ``directory`` (``_ray_pkg_<content hash>.zip``)."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    uri = get_uri_for_directory(str(directory), include_gitignore=include_gitignore(), excludes=excludes)
    return uri.rpartition("/")[2]


def create_package(directory: Path, target: Path, excludes: list[str], include_parent_dir: bool,
                   logger: logging.Logger) -> None:
    """Zip ``directory`` into ``target`` as Ray's upload would."""
    from ray._private.runtime_env.packaging import create_package as ray_create_package

    ray_create_package(str(directory), target, include_gitignore=include_gitignore(),
                       include_parent_dir=include_parent_dir, excludes=excludes, logger=logger)


def job_client_noting_job_request(on_job_request: Callable[[], None],
                                  deliver: Callable[[dict[str, Any]], None] | None = None,
                                  before_request: Callable[[], None] = lambda: None) -> type:
    """A ``JobSubmissionClient`` subclass that calls ``on_job_request`` as the job-creating request goes out.

    Uploads of the working_dir go to ``/api/packages/`` first; only the POST to ``/api/jobs`` creates
    the job, so Ctrl-C before it leaves nothing behind, and after it leaves a job to report. With
    ``deliver``, that request is not sent at all: its body goes to ``deliver`` (a queue keeps it to send
    later), and the client reads it as accepted. ``before_request`` is called before every request, the
    uploads' included (it may raise to send nothing more).
    """
    from ray.job_submission import JobSubmissionClient

    class Accepted:
        status_code = 200

        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        def json(self) -> dict[str, Any]:
            return {"submission_id": self.body.get("submission_id"), "job_id": None}

    class NotingClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, *args: Any, **kwargs: Any) -> Any:
            before_request()
            if method == "POST" and endpoint.rstrip("/") == "/api/jobs":
                if deliver is not None:
                    body = kwargs.get("json_data")
                    deliver(body)
                    return Accepted(body)
                on_job_request()
            return super()._do_request(method, endpoint, *args, **kwargs)

    return NotingClient


def checkpoint_snapshot_filename() -> str:
    """The file in a run folder where Ray Train records its checkpoints and their metrics."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    return CHECKPOINT_MANAGER_SNAPSHOT_FILENAME


def train_v2_enabled() -> bool:
    """Whether Ray Train's v2 API is on (``RAY_TRAIN_V2_ENABLED``), as Ray Train itself reads it."""
    from ray.train.v2._internal.constants import is_v2_enabled

    return is_v2_enabled()


@contextlib.contextmanager
def quieter(logger_name: str) -> Iterator[None]:
    """Raise a Ray logger to WARNING for the block: INFO lines of Ray's own, outside rayjobs' format."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
