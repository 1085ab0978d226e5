"""Seeing a job through: the run policy (timeouts, retries, attach) and the follower that streams
the log to a terminal state and turns the outcome into an exit code."""
