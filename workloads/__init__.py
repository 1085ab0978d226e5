"""Programs that rayjobs runs on the cluster, one sub-package or module per workload."""
