"""The progress events and the run record as the client reads them: the names the job writes them by.

The job defines both on the cluster, in ``workloads/rayjobs_observe/vocabulary.py`` (event kinds and
their fields) and ``record_layout.py`` (the record's names, ``run.json``'s fields, version and JSON
Schema), standard library only, since they ship without this package. Importing them here, like
``jobs/secrets.py`` imports the masking, keeps one spelling on both sides: the client never writes
an event kind or a record name of its own.
"""

from __future__ import annotations

from workloads.rayjobs_observe.record_layout import (ATTEMPTS_FIELD, RECORD_DIR, RECORD_ENV_VAR, RERUNS_FIELD,
                                                     RERUN_OF_FIELD, RUN_FILE, SCHEMA_VERSION, SCHEMA_VERSION_FIELD,
                                                     STACKS_FOLDER, event_folder, json_schema, log_folder,
                                                     unreadable_version)
from workloads.rayjobs_observe.vocabulary import EVENT_KINDS, EVENT_MARKER, KIND_FIELD, EventKind, kind_of

__all__ = ["ATTEMPTS_FIELD", "EVENT_KINDS", "EVENT_MARKER", "KIND_FIELD", "RECORD_DIR", "RECORD_ENV_VAR",
           "RERUNS_FIELD", "RERUN_OF_FIELD", "RUN_FILE", "SCHEMA_VERSION", "SCHEMA_VERSION_FIELD", "STACKS_FOLDER",
           "EventKind", "event_folder", "json_schema", "kind_of", "log_folder", "unreadable_version"]
