"""Helpers shared by the tests, one module per concern, always imported as ``from tests.support.MODULE import NAME``.

- ``cli``: the real ``rayjobs`` command in a subprocess (``run_rayjobs``, ``CliRun``), specs, loopback HTTP servers
- ``waiting``: ``wait_for_condition`` instead of bare sleeps
- ``ray_instances``: a private in-process Ray for workload tests
- ``fake_cluster``: the scripted client put in at the one network seam (unit tier)
- ``fault_proxy``: a TCP proxy on 127.0.0.1 that cuts, refuses, stalls or answers 502
- ``s3_server``: moto's S3 server on 127.0.0.1 and the AWS variables that reach it
- ``images``, ``arrays``: datasets written in the real formats (Food-101, ImageFolder, Parquet, IDX, CIFAR)
- ``train_faults``: a training worker that dies mid-run, armed through Ray's worker setup hook
- ``shared_data``: the reference data kept beside the project, and the reason to skip when it is absent
- ``tiny_run``: the one small training run the workload tests share (the ``tiny_run`` fixture)
- ``follow_scenarios``: the follower's fault scenarios, run in the background through the cluster tier
"""
