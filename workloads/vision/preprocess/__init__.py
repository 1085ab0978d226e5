"""The preprocess stage: source images encoded in Ray tasks and written as the Parquet dataset."""
