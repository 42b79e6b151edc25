"""Where a sweep's runs execute. sweep/schedule.py decides what runs (each run a trainer command line and its
directory); a launcher runs them, and is the only code here that knows about schedulers:

    sequential  one after another, this process waiting for each (the default)            local.py
    local       side by side on this machine through submitit's LocalExecutor              local.py
    slurm       SLURM job arrays through submitit's SlurmExecutor; this process submits    slurm.py
                and returns (a ladder: its lr grid's array and a job after it)

base.py is the interface a backend implements (Launcher) and what it is handed; job.py is a run as a submitit job.
A new backend is one Launcher subclass in a file of its own, imported here (docs/cluster.md, "A new launcher
backend").
"""
from sweep.launchers.base import (AFTER_GRID, ENDED_BADLY, JOB_FILE, Launcher, Resources, RunCommand, job_states,
                                  log_tail, pending_reasons, read_job, read_resources, still_queued, time_limits,
                                  write_job)
from sweep.launchers.job import TrainerJob
from sweep.launchers.local import Local, Sequential
from sweep.launchers.slurm import Slurm

LAUNCHERS = Launcher.registry  # name -> backend, in the order above: what --launcher and [launcher] kind accept
