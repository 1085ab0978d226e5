"""The cluster's queue service: one keeper actor per cluster, and the order jobs that reach it.

Who runs it: the keeper (``keeper.py``) runs as a detached actor on the head node (``actor.py``), started by the first
order job that finds none alive, and restarted by Ray when it dies. ``python -m rayjobs_agent.queue`` is what an order job runs
when no keeper was alive to read it (``orders.py``). Its state is in the cluster's key-value store
(``store.py``); it reaches Ray's job API through ``ray_jobs.py``, and cares for jobs lost whole in
``lost_jobs.py``. What clients and jobs share with it (names, orders, admissions) is ``rayjobs_agent.queueing``.
"""
