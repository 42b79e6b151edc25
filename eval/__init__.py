"""Evaluation and analysis of nanoact checkpoints and runs."""
