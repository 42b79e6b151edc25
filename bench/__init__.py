"""Benchmarks: each file here runs as a script from anywhere (the project is installed editable, this folder
too, since bench/gpu_check.py imports bench/train_step.py), and BENCHMARKS.md holds what they measured."""
