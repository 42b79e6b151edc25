"""What both trainers share: config, distributed setup, precision, checkpoints, run logs, schedules."""
