"""The ``rayjobs`` command line: its commands (:mod:`~runner.cli.app`, :mod:`~runner.cli.cluster`,
:mod:`~runner.cli.export`), the options they share, and how results and errors are printed."""


def main() -> None:
    """The ``rayjobs`` console script (imported lazily, so that importing a submodule stays cheap)."""
    from runner.cli.app import main as run

    run()
