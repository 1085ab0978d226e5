"""What every side of rayjobs uses to talk to Ray, to storage and to disk: none of it says what a job is.

The client (``runner``), the workloads on the cluster and the spec code all lean on these modules, so
they sit in their own room rather than among the spec's concepts:

- ``address``: the one rule for a cluster's address (the dashboard, over http or https).
- ``status``: a Ray job's states, as Ray's Jobs API words them on the wire.
- ``ray_env``: the environment a process needs before it imports Ray.
- ``ray_internals``: every use of Ray's private code, so that a Ray upgrade breaks one module.
- ``atomic``: replacing files and folders so that a reader never sees half of one.
- ``storage``: storage locations (a folder or ``s3://bucket/prefix``) and S3, the job side's one seam re-exported.

Kept in ``jobs`` itself, because they describe a job rather than the means of running one:
``submission`` (what is sent to Ray for a job), ``provenance`` (which code a job ran) and ``keys``
(the names a job carries between the client and the cluster).

Nothing here imports ``ray`` at module level: specs are validated on machines without it.
"""
