"""What a rayjobs job is: the spec models, and loading and validating spec files.

Nothing in this package talks to a cluster or imports ray. Modules are imported
directly (``from jobs.loader import load_spec``) so that commands which need no
spec do not pay for pydantic.
"""
