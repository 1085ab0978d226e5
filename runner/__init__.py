"""Client side of rayjobs: cluster management, job submission and following."""
