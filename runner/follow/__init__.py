"""Following a job's log: the follower that streams it to a terminal state and turns the outcome into an exit
code, and what reads the log and shows it (progress, waits, a failure's cause, stacks). The decisions about a
run (submitting or attaching, retries, Ctrl-C, stalls) are ``runner.run``'s."""
