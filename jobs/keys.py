"""Names rayjobs shares between the client and the cluster: job metadata keys and the workload's variable."""

# What starts a progress event in a job's log, and the run record's names: the job defines them
# (workloads/rayjobs_observe/vocabulary.py and record_layout.py, through jobs/run_vocabulary.py).
from jobs.run_vocabulary import EVENT_MARKER, RECORD_DIR, RECORD_ENV_VAR, RUN_FILE

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

__all__ = ["EVENT_MARKER", "METADATA_ATTEMPT", "METADATA_NAME", "METADATA_PARENT", "METADATA_SECRETS",
           "METADATA_SPEC_HASH", "RECORD_DIR", "RECORD_ENV_VAR", "RUN_FILE", "SWEEP_ENV_VAR", "TRACKING_ENV_VAR",
           "WORKLOAD_ENV_VAR"]
