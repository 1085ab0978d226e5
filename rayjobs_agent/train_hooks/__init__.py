"""The hooks Ray Train loads in the job's own processes, named in ``RAY_TRAIN_CALLBACKS``.

Ray Train v2 builds them in the Train controller of every ``TorchTrainer`` a job makes; nothing of rayjobs is
imported by the user's script. ``progress_callback.py`` turns reports, attempts and restarts into events in the
job's log; ``tracking_callback.py`` records a user's own script's runs in MLflow; ``install.py`` decides which go
into the variable, and only on a Ray the hooks are tested on. A hook that fails turns itself off, never the run.
"""
