"""Run records, read where the jobs left them, with no cluster: listing, showing, comparing, running again.

A job that uploads code keeps its own record (``rayjobs_agent/supervisor.py``): ``run.json``,
its driver log and its progress events, in the run's folder. Everything here reads those files, in a
local folder or in S3, ``run.json`` through one typed model (``model.py``); nothing here talks to a cluster,
except ``rerun``, which submits.
"""
