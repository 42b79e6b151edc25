"""The `slurm` launcher: each launch one SLURM job array through submitit's SlurmExecutor, at most
array_parallelism jobs at a time, each run on `nodes` nodes of gpus_per_node GPUs; this process submits and returns.
A ladder submits its lr grid's array and a job after it (launch_after: afterany), which picks the lrs and submits the
other sizes' array. sbatch's refusals are one line naming the [launcher] key to change; job states come from sacct.
"""
import contextlib
import io
import os
import shutil
import subprocess

from submitit.core.utils import FailedJobError, FailedSubmissionError

from errors import ConfigError
from sweep.launchers.base import Launcher, job_states, read_job, still_queued, write_job
from sweep.launchers.job import TrainerJob


class Slurm(Launcher, name="slurm"):
    """One job array through submitit's SlurmExecutor; returns the runs now queued (it does not wait)."""
    queues = True

    def __init__(self, resources, nproc_per_node, folder):
        import submitit

        super().__init__(resources, nproc_per_node, folder)
        if missing := [c for c in ("sbatch", "srun", "sacct", "scontrol") if shutil.which(c) is None]:
            raise ConfigError(f"--launcher slurm needs SLURM's commands; {', '.join(missing)} not on PATH: run the "
                              "sweep on the cluster's login node (or --launcher local on one machine)")
        self.parameters = sbatch_parameters(resources, nproc_per_node)
        self.limits = None  # the partitions' time limits (partition_limits), asked once
        self.executor = submitit.SlurmExecutor(folder, max_num_timeout=resources.max_num_timeout)
        self.executor.update_parameters(**self.parameters)

    def launch(self, runs):
        jobs = {run.path: read_job(run.path) for run in runs}
        states = job_states(jobs, self.folder)
        waiting = [run for run in runs if still_queued(jobs[run.path], states.get(run.path))]
        todo = [run for run in runs if run not in waiting]
        if todo:
            try:
                jobs = self.submit(lambda: self.executor.submit_array([
                    TrainerJob(run.now(), self.nproc_per_node, self.resources.nodes, self.resources.signal_delay_s)
                    for run in todo]))
            except ConfigError as e:  # --status says so in the runs that were there (an earlier job's)
                for run in todo:
                    if any(run.path.iterdir()):
                        write_job(run.path, state="not submitted", error=str(e))
                raise
            for run, job in zip(todo, jobs):
                before = read_job(run.path).get("requeues") or 0  # the run's requeues in its earlier jobs
                write_job(run.path, launcher="slurm", job_id=job.job_id, folder=str(self.folder), state="submitted",
                          requeues=before, requeues_before=before, error=None)
        return waiting + todo

    def launch_after(self, job_ids, function):
        """Submits function() as a job of one CPU and no GPU that starts once the jobs job_ids have ended, whatever
        their end (afterany: a failed grid run leaves it to the function to say so, not pending for ever); returns
        its job id."""
        import submitit

        executor = submitit.SlurmExecutor(self.folder, max_num_timeout=0)
        executor.update_parameters(**after_parameters(self.resources, self.parameters, job_ids,
                                                      self.partition_limits()))
        return self.submit(lambda: executor.submit(function)).job_id

    def preflight(self, after):
        """Refuses, before anything is submitted, a job that could never finish: a time limit over its partition's
        (sinfo's MaxTime; a cluster that does not enforce it would leave the job pending for ever), for the runs'
        jobs and, with `after`, the job after them; a driver partition sinfo does not list."""
        limits, default = self.partition_limits()
        if not limits:
            return
        r = self.resources
        checks = [("[launcher] timeout_min", r.timeout_min, r.partition or default)]
        if after:
            partition = r.driver.get("partition", r.partition) or default
            if partition not in limits:
                raise ConfigError(f"[launcher.driver] partition = {partition!r} is not a partition sinfo lists "
                                  f"({', '.join(limits)}): name one of them; nothing was submitted")
            checks.append(("[launcher.driver] timeout_min", driver_minutes(r, (limits, default)), partition))
        for key, minutes, partition in checks:
            if (limit := limits.get(partition)) is not None and minutes > limit:
                raise ConfigError(f"{key} = {minutes} is over partition {partition}'s time limit of {limit} minutes "
                                  f"(sinfo): set it to at most {limit}; nothing was submitted")

    def partition_limits(self):
        if self.limits is None:
            self.limits = partition_limits()
        return self.limits

    def waits_on(self, queued):
        """The SLURM job ids of the arrays that hold these runs' jobs (their job.json)."""
        return sorted({read_job(run.path)["job_id"].split("_")[0] for run in queued})

    @classmethod
    def submission_text(cls, resources, nproc_per_node, folder, jobs):
        """Each job's #SBATCH and setup lines, as submitit's script generation writes them."""
        parameters = sbatch_parameters(resources, nproc_per_node)
        blocks = []
        for title, runs, after in jobs:
            lines = ["(all finished)"] if not runs and not after else script_lines(
                after_parameters(resources, parameters, ["GRID_JOB_ID"], partition_limits()) if after
                else parameters, folder, runs)
            blocks.append(f"{title}:\n" + "\n".join(f"  {line}" for line in lines))
        return "\n".join(blocks)

    @classmethod
    def states(cls, jobs, folder):
        """{key: sacct's state} of the records {key: job.json}, in one sacct call (submitit's watcher); UNKNOWN when
        sacct does not know a job (yet)."""
        import submitit

        watched = {key: submitit.SlurmJob(folder, job["job_id"]) for key, job in jobs.items()}
        next(iter(watched.values())).get_info(mode="force")
        return {key: job.state.split()[0] for key, job in watched.items()}

    @classmethod
    def reasons(cls, jobs):
        """{key: squeue's reason} of the pending jobs among the records {key: job.json}, in one squeue call; a reason
        that never clears (PartitionTimeLimit on a cluster that does not refuse the job, an unknown qos) says so."""
        ids = sorted({job["job_id"].split("_")[0] for job in jobs.values()})
        try:  # -r: an array's pending tasks one per line, not folded into 1000_[1-3]
            said = subprocess.run(["squeue", "-h", "-r", "-t", "PD", "-o", "%i|%r", "-j", ",".join(ids)],
                                  capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        reason = dict(line.strip().split("|", 1) for line in said.splitlines() if "|" in line)
        return {key: f"squeue: {reason[job['job_id']]}" + (f": {NEVER_STARTS[reason[job['job_id']]]}" if reason[
            job["job_id"]] in NEVER_STARTS else "") for key, job in jobs.items() if job["job_id"] in reason}

    def submit(self, submission):
        """submission() (submitit's submit), with sbatch's refusal as one line and no pickles left behind for a
        corrected rerun to find."""
        before = set(self.folder.glob("*")) if self.folder.is_dir() else set()
        try:
            with outside_this_job(), contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's error too
                return submission()
        except (FailedJobError, FailedSubmissionError) as e:
            for path in set(self.folder.glob("*")) - before:
                path.unlink()
            raise ConfigError(sbatch_refusal(str(e), self.folder)) from None


@contextlib.contextmanager
def outside_this_job():
    """Inside a SLURM job (the one after a ladder's lr grid), without the job's own SLURM_* settings, which the jobs
    it submits would otherwise inherit (submitit's clean_env); the user's SBATCH_* defaults and SLURM_CONF (where the
    cluster's configuration is) stay. On a login node, as it is."""
    if "SLURM_JOB_ID" not in os.environ:
        yield
        return
    from submitit.helpers import clean_env

    kept = {k: v for k, v in os.environ.items() if k.startswith("SBATCH_") or k == "SLURM_CONF"}
    with clean_env():
        os.environ.update(kept)
        yield


DRIVER_MINUTES = 10  # the job after a ladder's lr grid reads the grid's runs, picks the lrs and submits: a
# minute's work; its partition's time limit when that is lower
# squeue's pending reasons (Slurm 22.05) that never clear by waiting, and what to do
NEVER_STARTS = {
    "PartitionTimeLimit": "the job's time limit is over its partition's, it never starts: scancel it, lower "
                          "timeout_min in [launcher] (sinfo -o '%P %l') and rerun the sweep",
    "InvalidQOS": "the job's qos is not one the cluster knows: scancel it, fix qos in [launcher] and rerun the sweep",
    "InvalidAccount": "the job's account is not one the cluster knows: scancel it, fix account in [launcher] and "
                      "rerun the sweep",
    "DependencyNeverSatisfied": "a job it waits on failed: scancel it and rerun the sweep"}
# SLURM's refusals a plan's [launcher] table fixes, and how (sbatch's own words, Slurm 22.05)
SBATCH_FIXES = {"invalid partition": "set partition in [launcher] to one that `sinfo -s` lists",
                "generic resource": "a partition without GPUs needs gpus_per_node = 0 in [launcher] (a CPU config "
                                    "asks for none)",
                "invalid account": "set account in [launcher] to one of `sacctmgr show assoc user=$USER`",
                "invalid qos": "set qos in [launcher] to one of `sacctmgr show assoc user=$USER format=qos`",
                "time limit": "lower timeout_min in [launcher] to the partition's limit (`sinfo -o '%P %l'`)"}


def sbatch_refusal(stderr, folder):
    """One line from sbatch's error output: its first error and what in the plan to change."""
    errors = [line.split("error:", 1)[1].strip() for line in stderr.splitlines() if "error:" in line]
    said = errors[0] if errors else " ".join(stderr.split())[:200]
    fix = next((fix for key, fix in SBATCH_FIXES.items() if any(key in e.lower() for e in errors)),
               f"fix [launcher] in the plan (the script submitit wrote: {folder})")
    return f"sbatch refused the job: {said}; {fix}"


def sbatch_parameters(resources, nproc_per_node):
    """submitit's SlurmExecutor parameters of a plan's runs: what each job's #SBATCH lines ask for."""
    r = resources
    gpus = nproc_per_node if r.gpus_per_node is None else r.gpus_per_node
    named = dict(partition=r.partition, account=r.account, qos=r.qos, constraint=r.constraint,
                 cpus_per_task=r.cpus_per_task, mem=None if r.mem_gb is None else f"{r.mem_gb:g}GB",
                 gpus_per_node=gpus or None)
    return dict(job_name="nanoact", time=r.timeout_min, nodes=r.nodes, ntasks_per_node=1,
                array_parallelism=r.array_parallelism, signal_delay_s=r.signal_delay_s, stderr_to_stdout=True,
                setup=r.setup, additional_parameters=r.sbatch, **{k: v for k, v in named.items() if v is not None})


def after_parameters(resources, parameters, job_ids, limits):
    """The parameters of the job after a ladder's lr grid, started once the jobs job_ids have ended: one CPU, no GPU,
    the plan's partition, account, qos and setup lines unless [launcher.driver] names its own (and its sbatch
    options), its time [launcher.driver] timeout_min or driver_minutes."""
    driver = resources.driver
    kept = {k: v for k, v in parameters.items() if k in ("partition", "account", "qos", "setup")}
    kept.update({k: driver[k] for k in ("partition", "account", "qos") if k in driver})
    return dict(job_name="nanoact-after-grid", time=driver_minutes(resources, limits), nodes=1, ntasks_per_node=1,
                cpus_per_task=1, stderr_to_stdout=True, dependency="afterany:" + ":".join(job_ids),
                additional_parameters=driver.get("sbatch", {}), **kept)


def driver_minutes(resources, limits):
    """The time limit of the job after a ladder's lr grid: [launcher.driver] timeout_min, else DRIVER_MINUTES or its
    partition's limit (sinfo's, `limits`) when that is lower."""
    if "timeout_min" in resources.driver:
        return resources.driver["timeout_min"]
    minutes, default = limits
    limit = minutes.get(resources.driver.get("partition", resources.partition) or default)
    return min(DRIVER_MINUTES, limit or DRIVER_MINUTES)


def partition_limits():
    """({partition: its time limit in minutes, None when it has none}, the default partition), from sinfo;
    ({}, None) where sinfo cannot say."""
    try:
        said = subprocess.run(["sinfo", "-h", "-o", "%P|%l"], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}, None
    limits, default = {}, None
    for line in said.split():
        name, _, limit = line.partition("|")
        if name.endswith("*"):  # sinfo marks the default partition
            name = default = name[:-1]
        limits[name] = slurm_minutes(limit)
    return limits, default


def slurm_minutes(text):
    """SLURM's time ([days-]hours:minutes:seconds, minutes:seconds, minutes; infinite) in whole minutes, rounded
    up; None for no limit."""
    if text in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, minutes, seconds = [0] * (3 - len(parts)) + parts if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 24 * 60 + hours * 60 + minutes + (seconds > 0)


def script_lines(parameters, folder, count):
    """The #SBATCH and setup lines of the script submitit's SlurmExecutor writes for `count` jobs of these
    parameters (an array when more than one): its own script generation, so they are the lines sbatch reads."""
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="", folder=folder, map_count=count if count > 1 else None, **parameters)
    return [line for line in script.splitlines() if line.startswith("#SBATCH")] + list(parameters.get("setup") or [])
