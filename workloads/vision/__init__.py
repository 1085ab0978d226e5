"""Image classification workload: preprocess → Parquet → Ray Train → batch inference.

``sources`` lists the images, ``preprocess`` writes them as the Parquet dataset, ``reading``
reads it back, ``training`` and ``inference`` are the two later stages; ``config`` holds the
parameters, ``errors`` the errors that end a stage, ``images`` the pixel work every stage shares.
"""
