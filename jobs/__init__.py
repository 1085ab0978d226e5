"""What a rayjobs job is: the spec models, loading and validating spec files, and what is sent to Ray.

The spec and its blocks (``spec``, ``sweep``, ``tracking``, ``notify``, ``retry``, ``queueing``,
``secrets``), reading and checking a spec file (``loader``, ``yaml_reader``, ``overrides``, ``paths``,
``errors``, ``strict``), what a workload declares (``workload_contract``, ``workload_kinds``), and a job
as Ray receives it: ``submission`` (the arguments of ``submit_job``), ``provenance`` (the git commit of
the job's code, recorded with it) and ``keys`` (the names a job carries from the client to the cluster).

How any side talks to Ray, storage and disk is not a concept of a job: it lives in :mod:`jobs.infra`.
Nothing in this package talks to a cluster or imports ray at module level. Modules are imported
directly (``from jobs.loader import load_spec``) so that commands which need no spec do not pay for
pydantic.
"""
