"""The client side of rayjobs: the command line, talking to a cluster, following a job, exports and local clusters.

The Python API is :func:`runner.follow.policy.run_with_retries` and :func:`runner.follow.policy.follow_job`
on a client from :func:`runner.client.jobs_api.connect`; docs/architecture.md draws the packages.
"""
