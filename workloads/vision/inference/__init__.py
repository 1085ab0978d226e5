"""The infer stage and single images: a checkpoint's model classifying the validation split or given images."""
