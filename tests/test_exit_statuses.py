"""One bad-input error and one set of exit statuses for the ``rayjobs`` command and the workloads' entry points."""

from __future__ import annotations

import pickle

import pytest

from jobs.errors import BadInput, ExitCode, RayJobsError
from workloads.entry import workload_main


class StageBroke(Exception):
    pass


def test_the_command_and_the_workloads_raise_the_one_bad_input():
    import runner.errors
    import workloads.entry

    assert runner.errors.BadInput is workloads.entry.BadInput is BadInput
    assert runner.errors.ExitCode is ExitCode
    # A RayJobsError for the command's handler, a ValueError for code that guards a parse with `except ValueError`.
    assert issubclass(BadInput, RayJobsError) and issubclass(BadInput, ValueError)
    assert BadInput("x").exit_code == ExitCode.BAD_INPUT == 2


def test_it_crosses_a_process_boundary_whole():
    """Ray hands a task's error to the driver pickled."""
    again = pickle.loads(pickle.dumps(BadInput("workload.data.root: no such folder")))
    assert type(again) is BadInput and str(again) == "workload.data.root: no such folder"


@pytest.mark.parametrize(("raised", "status"), [
    (None, ExitCode.SUCCEEDED),
    (BadInput("invalid vision parameters: train.epochs: must be positive"), ExitCode.BAD_INPUT),
    (StageBroke("training diverged"), ExitCode.FAILED),
])
def test_a_workloads_entry_point_exits_with_the_commands_statuses(raised, status, capsys):
    def work():
        if raised is not None:
            raise raised

    assert workload_main(work, failures=(StageBroke,)) == status
    assert capsys.readouterr().err == ("" if raised is None else f"error: {raised}\n")
