"""Names rayjobs shares between the client and the cluster: job metadata keys and the workload's variable."""

# The environment variable that carries a spec's validated ``workload`` section (JSON) to the entrypoint.
WORKLOAD_ENV_VAR = "RAYJOBS_WORKLOAD"
# And the one that carries its validated ``sweep`` block, when it has one.
SWEEP_ENV_VAR = "RAYJOBS_SWEEP"
# And the one that carries its ``tracking`` block.
TRACKING_ENV_VAR = "RAYJOBS_TRACKING"

# Job metadata rayjobs adds to every submission.
METADATA_NAME = "rayjobs.name"
METADATA_SPEC_HASH = "rayjobs.spec_hash"
METADATA_SECRETS = "rayjobs.secret_env_vars"
METADATA_ATTEMPT = "rayjobs.attempt"
METADATA_PARENT = "rayjobs.parent"

# What starts a progress event in a job's log. workloads/rayjobs_observe/events.py, which runs on the
# cluster without this package, writes the same text (tests/test_progress_view.py holds them equal).
EVENT_MARKER = "rayjobs-event"

# The run record (workloads/rayjobs_observe/record.py writes it on the cluster; runner/runs reads it):
# the variable that tells the job where and what to record, and the names in a run's folder.
RECORD_ENV_VAR = "RAYJOBS_RECORD"
RUN_FILE = "run.json"
RECORD_DIR = "run-record"
