"""The client side of rayjobs: the command line, talking to a cluster, a job's run, exports and local clusters.

The Python API is one import::

    from runner import RunOptions, connect, load_spec, submit

``submit`` does what ``rayjobs submit`` does (submit or attach, follow, retry) and returns a
``RunResult``; docs/python-api.md shows it, and docs/architecture.md draws the packages.
"""

from __future__ import annotations

import importlib

# Public name → (module, attribute). Loaded on first use: ``import runner`` happens for every
# command, and the run's modules pull in the follower, the client and pydantic specs.
_PUBLIC_API = {
    "submit": ("runner.run.lifecycle", "run_with_retries"),
    "run_with_retries": ("runner.run.lifecycle", "run_with_retries"),
    "follow_job": ("runner.run.lifecycle", "follow_job"),
    "submit_or_attach": ("runner.run.lifecycle", "submit_or_attach"),
    "RunOptions": ("runner.run.lifecycle", "RunOptions"),
    "RunOutcome": ("runner.run.lifecycle", "RunOutcome"),
    "RunResult": ("runner.run.lifecycle", "RunResult"),
    "load_spec": ("jobs.loader", "load_spec"),
    "connect": ("runner.client.jobs_api", "connect"),
    "JobsApi": ("runner.client.jobs_api", "JobsApi"),
    "RayJobsError": ("runner.errors", "RayJobsError"),
    "ExitCode": ("runner.errors", "ExitCode"),
}

__all__ = sorted(_PUBLIC_API)


def __getattr__(name: str) -> object:
    """A public name of the Python API, imported when it is first asked for."""
    try:
        module_name, attribute = _PUBLIC_API[name]
    except KeyError:
        # An AttributeError (not a KeyError) lets ``from runner import local`` fall back to the sub-package.
        raise AttributeError(f"module 'runner' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's own names and the Python API's."""
    return sorted(set(globals()) | set(_PUBLIC_API))
