"""The train stage: the model and its checkpoints, the recipe, the workers' loop, and the TorchTrainer run."""
