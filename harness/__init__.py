"""Infrastructure shared by both trainers: config, distributed setup, checkpoints, run logs, schedules."""
