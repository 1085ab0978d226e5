"""Reading the Parquet dataset back: its manifest, a PyTorch dataset, Ray Datasets, a worker's batches."""
