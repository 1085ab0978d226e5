"""Talking to a cluster: which one (connection precedence), the one HTTP seam every request goes
through (with its retries and proxy rules), and submission. The checks made before a job is sent are
``runner.run.preflight``'s."""
