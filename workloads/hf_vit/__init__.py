"""Fine-tuning a Hugging Face ViT with the transformers Trainer inside Ray Train (optional extra ``hf``)."""
