"""Export nanoact checkpoints to other libraries (transformers)."""
