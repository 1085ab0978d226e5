"""Talking to a cluster: which one (connection precedence), the one HTTP seam every request goes
through (with its retries and proxy rules), submission, and the checks made before a job is sent."""
