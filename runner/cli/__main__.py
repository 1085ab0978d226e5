"""``python -m runner.cli``: the same as the ``rayjobs`` command."""

from runner.cli import main

main()
