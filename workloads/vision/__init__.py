"""Image classification workload: preprocess → Parquet → Ray Train → batch inference."""
