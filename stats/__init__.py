"""Statistics, the lowest room above errors.py: significance tests, one multiple-comparison family (Holm),
scaling fits and their calibration, and the lr picker. numpy and scipy only: no torch, nothing of the project's
rooms but its errors."""
