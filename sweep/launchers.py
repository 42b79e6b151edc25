"""Where a sweep's runs execute. sweep/schedule.py decides what runs (each run a trainer command line and its
directory); a launcher runs them, and is the only code here that knows about schedulers:

    sequential  one after another, this process waiting for each (the default)
    local       side by side on this machine through submitit's LocalExecutor, `parallel` at a time, each run on
                its own gpus_per_node GPUs (none on a CPU machine, where two run at a time)
    slurm       one SLURM job array through submitit's SlurmExecutor, at most array_parallelism jobs at a time,
                each run on `nodes` nodes of gpus_per_node GPUs; this process submits and returns (a ladder: its
                lr grid's array and a job after it, which picks the lrs and submits the other sizes' array)

A run of several processes is the trainer under torchrun: --standalone on one node; across nodes, c10d rendezvous
on the job's first host (SLURM_JOB_NODELIST), one torchrun per node (submitit starts one task per node).

Time limits and preemption (local and slurm) follow submitit's checkpointing protocol: the job is signalled
(SIGUSR2) signal_delay_s before its time limit, or when preempted; TrainerJob.checkpoint stops the trainer with one
SIGTERM (it finishes its step, writes a checkpoint and exits; torchrun forwards the SIGTERM to its workers and
waits up to signal_delay_s for them) and hands submitit the same job to requeue, which continues from that
checkpoint (every run has --auto-resume) and ends where an uninterrupted run ends. Time limits requeue at most
max_num_timeout times (submitit's count). The trainer and torchrun ignore SIGUSR2 (SLURM signals every process of
the job; only the job's own process answers). A trainer that exits with an error fails its job, which is never
requeued; its state and its log's last lines are in RUN_DIR/job.json, which `python -m sweep --status`
reads.

This module is what a job process unpickles: it imports no torch and nothing of the sweep at import time.
"""
import contextlib
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

from submitit.core.utils import FailedJobError, FailedSubmissionError
from submitit.helpers import Checkpointable, DelayedSubmission
from tqdm import tqdm

from analysis.runs import finished
from data.files import atomic_file
from errors import ConfigError

JOB_FILE = "job.json"
AFTER_GRID = "after_grid.json"  # OUT's record of the job that runs a ladder's sizes after its lr grid
TAIL_LINES = 5
# the scheduler states of a job that has not ended (sacct's names; the local executor's RUNNING), and of one the
# scheduler ended without the job's say (CANCELLED is not one: the trainer saved on its SIGTERM, a rerun continues it)
QUEUED = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
          "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "PREEMPTED"}
ENDED_BADLY = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@dataclass
class RunCommand:
    """One run as a launcher starts it: its directory and the trainer's command line."""
    path: Path  # its directory
    argv: list  # the trainer script and its options
    name: str  # how messages name it: "gelu size s1 lr 0.001 seed 2"
    kernels_from: Path | None = None  # the run whose kernel decisions this one reuses, once it has made them

    def now(self):
        """This run with --kernels-from its first seed's run if that one has started (run.json) by now."""
        if self.kernels_from is None or not (self.kernels_from / "run.json").is_file():
            return self
        at = self.argv.index("--auto-resume")
        return RunCommand(self.path, [*self.argv[:at], "--kernels-from", str(self.kernels_from), *self.argv[at:]],
                          self.name)


@dataclass
class Resources:
    """A plan's [launcher] table: which launcher, and what each run asks of it."""
    kind: str = "sequential"
    nodes: int = 1  # nodes per run (slurm)
    gpus_per_node: int | None = None  # GPUs a run takes on each node (default: --nproc-per-node; 0 on a CPU)
    cpus_per_task: int | None = None  # CPUs on each node
    mem_gb: float | None = None  # memory on each node
    timeout_min: int = 24 * 60  # a job's time limit; a longer run continues in its requeued job
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    array_parallelism: int = 256  # jobs of the array running at once (slurm)
    parallel: int | None = None  # runs at once (local; default: GPUs // gpus_per_node, or 2 on a CPU machine)
    signal_delay_s: int = 120  # the signal comes this long before the time limit: time to write a checkpoint
    max_num_timeout: int = 3  # time limits a run may hit and be requeued
    setup: list = field(default_factory=list)  # shell lines before each job (module load ..., source venv)
    sbatch: dict = field(default_factory=dict)  # further #SBATCH options, e.g. {exclusive = true}


def read_resources(table, where, kind=None):
    """Resources from a plan's [launcher] table, with --launcher KIND (if given) replacing its kind."""
    table = dict(table or {})
    known = {f.name: f.type for f in fields(Resources)}
    if unknown := sorted(set(table) - set(known)):
        raise ConfigError(f"{where}: [launcher] has unknown key(s) {unknown}; it takes {', '.join(known)}")
    for name, value in table.items():
        allowed = tuple(t for t in typing.get_args(known[name]) if t is not type(None)) or (known[name],)
        allowed += (int,) if float in allowed else ()
        if not isinstance(value, allowed) or isinstance(value, bool):
            expected = " or ".join(t.__name__ for t in allowed)
            raise ConfigError(f"{where}: [launcher] {name} = {value!r}; expected {expected}")
    resources = Resources(**table)
    resources.kind = kind or resources.kind
    if resources.kind not in LAUNCHERS:
        raise ConfigError(f"{where}: launcher {resources.kind!r} is not one of {', '.join(LAUNCHERS)}")
    if resources.kind == "local" and resources.nodes != 1:
        raise ConfigError(f"{where}: the local launcher runs on one machine; nodes = {resources.nodes} needs slurm")
    return resources


def read_job(path, name=JOB_FILE):
    """RUN_DIR/job.json ({} when the run has no job): launcher, job_id, state, requeues, error."""
    try:
        return json.loads((Path(path) / name).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_job(path, name=JOB_FILE, **changes):
    record = {**read_job(path, name), **changes}
    with atomic_file(Path(path) / name, "w") as f:
        json.dump(record, f, indent=2)
    return record


def log_tail(path, lines=TAIL_LINES):
    try:
        return (Path(path) / "train.out").read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


def ignore_usr2():
    """In the trainer's process before exec (torchrun's workers inherit it): SLURM's SIGUSR2 is for the job."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainerJob(Checkpointable):
    """One run as a submitit job: the trainer (under torchrun when it has several processes), checkpointed and
    requeued on submitit's signal."""

    def __init__(self, run, nproc_per_node, nnodes=1, stop_timeout_s=120):
        self.run, self.nproc_per_node, self.nnodes, self.stop_timeout_s = run, nproc_per_node, nnodes, stop_timeout_s
        self.requeues = 0
        self._pid = None

    def command(self, env=None):
        """The trainer's command line; across nodes, in the job described by submitit's JobEnvironment `env`."""
        if self.nnodes == 1 and self.nproc_per_node == 1:
            return [sys.executable, *self.run.argv]
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        stop = [f"--shutdown-timeout={self.stop_timeout_s}"]
        if self.nnodes == 1:
            return [*torchrun, "--standalone", f"--nproc_per_node={self.nproc_per_node}", *stop, *self.run.argv]
        job = env.raw_job_id
        port = 20000 + int(job) % 20000  # one rendezvous per job, even with several jobs on one first node
        return [*torchrun, f"--nproc_per_node={self.nproc_per_node}", *stop, f"--nnodes={self.nnodes}",
                f"--node-rank={env.node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={env.hostnames[0]}:{port}",
                f"--rdzv-id={job}", *self.run.argv]

    def __call__(self):
        import submitit

        env = submitit.JobEnvironment()
        leader = env.global_rank == 0
        # SLURM counts every requeue of the job (submitit's, `scontrol requeue`, preemption); its own count is only
        # submitit's, carried in the pickle a requeue from outside does not rewrite
        self.requeues = max(self.requeues, int(os.environ.get("SLURM_RESTART_COUNT", 0)))
        if leader:
            write_job(self.run.path, job_id=env.job_id, state="running", requeues=self.requeues, host=env.hostname,
                      error=None)
        with open(self.run.path / "train.out", "a") as log:
            child = subprocess.Popen(self.command(env), stdout=log, stderr=subprocess.STDOUT, preexec_fn=ignore_usr2)
        self._pid = child.pid
        # os.waitpid, not child.wait(): checkpoint() reaps the child from a signal handler that interrupts this
        # wait, and Popen's wait holds a lock the handler would need
        code = os.waitstatus_to_exitcode(os.waitpid(child.pid, 0)[1])
        self._pid = None
        if code != 0:
            tail = log_tail(self.run.path)
            if leader:  # 143: the trainer saved and stopped on someone else's SIGTERM (scancel, preemption)
                write_job(self.run.path, state="stopped" if code == 128 + signal.SIGTERM else "failed", error=tail)
            raise RuntimeError(f"{self.run.name}: the trainer exited with code {code}; the last lines of "
                               f"{self.run.path / 'train.out'}:\n" + "\n".join(tail))
        if leader:
            write_job(self.run.path, state="ended")
        return str(self.run.path)

    def checkpoint(self):
        """submitit's preemption/time-limit hook (global rank 0): the trainer saves and stops, the job requeues."""
        code = None
        if self._pid is not None:
            os.kill(self._pid, signal.SIGTERM)  # the trainer finishes its step and saves (training/stop.py)
            try:
                code = os.waitstatus_to_exitcode(os.waitpid(self._pid, 0)[1])  # 143: saved, unfinished
            except ChildProcessError:  # it had ended already
                pass
            self._pid = None
        self.requeues += 1
        write_job(self.run.path, state="requeued", requeues=self.requeues, stopped_with=code)
        return DelayedSubmission(self)


class Sequential:
    """One run after another in this process; a run that stops is an error saying how to continue."""
    queues = False

    def __init__(self, resources, nproc_per_node, folder):
        self.nproc_per_node = nproc_per_node

    def launch(self, runs):
        for run in tqdm(runs, desc="sweep", unit="run"):
            cmd = TrainerJob(run.now(), self.nproc_per_node).command()
            tqdm.write(f"{run.path}: {' '.join(cmd[1:])}")
            with open(run.path / "train.out", "a") as log:
                code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            if code != 0 or not finished(run.path):
                tail = log_tail(run.path, 1) or [""]
                raise SystemExit(f"error: {run.name} stopped (exit code {code}): {tail[0][:200]} -- see "
                                 f"{run.path / 'train.out'}; rerun the same command to continue (finished runs are "
                                 "skipped)")
        return []


class Local:
    """submitit's LocalExecutor, `parallel` runs at a time, each on its own GPUs; waits for all of them."""
    queues = False

    def __init__(self, resources, nproc_per_node, folder):
        import submitit

        gpus = visible_gpus()
        per_run = resources.gpus_per_node
        if per_run is None:  # a GPU per process; a CPU machine's runs take none
            per_run = nproc_per_node if gpus else 0
        parallel = resources.parallel or (gpus // per_run if per_run else 2)
        if per_run and gpus < per_run * parallel:
            raise ConfigError(f"the local launcher needs {per_run} GPU(s) per run x {parallel} runs at once; "
                              f"this machine has {gpus}: lower parallel or gpus_per_node in [launcher]")
        self.nproc_per_node, self.stop_timeout_s = nproc_per_node, resources.signal_delay_s
        self.slots = queue.Queue()
        for slot in range(parallel):  # an executor per slot: its GPUs are its own
            executor = submitit.LocalExecutor(folder, max_num_timeout=resources.max_num_timeout)
            executor.update_parameters(timeout_min=resources.timeout_min, signal_delay_s=resources.signal_delay_s,
                                       gpus_per_node=per_run, visible_gpus=tuple(range(slot * per_run,
                                                                                       (slot + 1) * per_run)),
                                       stderr_to_stdout=True, setup=resources.setup)
            self.slots.put(executor)
        self.parallel = parallel

    def _run(self, run):
        executor = self.slots.get()
        try:
            job = executor.submit(TrainerJob(run.now(), self.nproc_per_node, stop_timeout_s=self.stop_timeout_s))
            write_job(run.path, launcher="local", job_id=job.job_id, folder=str(executor.folder), state="submitted")
            while not job.done():  # job.wait() looks once a second: a slot would idle up to that long
                time.sleep(0.1)
        finally:
            self.slots.put(executor)
        return run

    def launch(self, runs):
        with ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(self._run, runs))
        failed = [run for run in runs if not finished(run.path)]
        if failed:
            lines = [f"  {run.name}: {' | '.join(read_job(run.path).get('error') or log_tail(run.path, 1))[:300]} "
                     f"-- see {run.path / 'train.out'}" for run in failed]
            raise SystemExit(f"error: {len(failed)} of {len(runs)} runs failed:\n" + "\n".join(lines) +
                             "\nrerun the same command to continue (finished runs are skipped)")
        return []


def visible_gpus():
    import torch  # the sweep's process only

    return torch.cuda.device_count()


class Slurm:
    """One job array through submitit's SlurmExecutor; returns the runs now queued (it does not wait)."""
    queues = True

    def __init__(self, resources, nproc_per_node, folder):
        import submitit

        self.resources, self.nproc_per_node, self.folder = resources, nproc_per_node, folder
        if missing := [c for c in ("sbatch", "srun", "sacct", "scontrol") if shutil.which(c) is None]:
            raise ConfigError(f"--launcher slurm needs SLURM's commands; {', '.join(missing)} not on PATH: run the "
                              "sweep on the cluster's login node (or --launcher local on one machine)")
        self.parameters = sbatch_parameters(resources, nproc_per_node)
        self.executor = submitit.SlurmExecutor(folder, max_num_timeout=resources.max_num_timeout)
        self.executor.update_parameters(**self.parameters)

    def launch(self, runs):
        jobs = {run.path: read_job(run.path) for run in runs}
        states = job_states(jobs, self.folder)
        waiting = [run for run in runs if still_queued(jobs[run.path], states.get(run.path))]
        todo = [run for run in runs if run not in waiting]
        if todo:
            jobs = self.submit(lambda: self.executor.submit_array([
                TrainerJob(run.now(), self.nproc_per_node, self.resources.nodes, self.resources.signal_delay_s)
                for run in todo]))
            for run, job in zip(todo, jobs):
                write_job(run.path, launcher="slurm", job_id=job.job_id, folder=str(self.folder), state="submitted",
                          requeues=0, error=None)
        return waiting + todo

    def launch_after(self, job_ids, function):
        """Submits function() as a job of one CPU and no GPU that starts once the jobs job_ids have ended, whatever
        their end (afterany: a failed grid run leaves it to the function to say so, not pending for ever); returns
        its job id."""
        import submitit

        executor = submitit.SlurmExecutor(self.folder, max_num_timeout=0)
        executor.update_parameters(**after_parameters(self.parameters, job_ids))
        return self.submit(lambda: executor.submit(function)).job_id

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


AFTER_JOB_MINUTES = 30  # the job after a ladder's lr grid: it reads the grid's runs, picks the lrs and submits
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


def after_parameters(parameters, job_ids):
    """The parameters of the job after a ladder's lr grid: one CPU, no GPU, the plan's partition, account, qos and
    setup lines, started once the jobs job_ids have ended."""
    kept = {k: v for k, v in parameters.items() if k in ("partition", "account", "qos", "setup")}
    return dict(job_name="nanoact-after-grid", time=AFTER_JOB_MINUTES, nodes=1, ntasks_per_node=1, cpus_per_task=1,
                stderr_to_stdout=True, dependency="afterany:" + ":".join(job_ids), **kept)


def script_lines(parameters, folder, count):
    """The #SBATCH and setup lines of the script submitit's SlurmExecutor writes for `count` jobs of these
    parameters (an array when more than one): its own script generation, so they are the lines sbatch reads."""
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="", folder=folder, map_count=count if count > 1 else None, **parameters)
    return [line for line in script.splitlines() if line.startswith("#SBATCH")] + list(parameters.get("setup") or [])


def timeouts(job):
    """(how many times submitit found a run's SLURM job at its time limit, whether it then stopped requeuing it:
    max_num_timeout), from the job's own log (submitit's words)."""
    from submitit.core.utils import JobPaths

    try:
        log = JobPaths(job["folder"], job_id=job["job_id"], task_id=0).stdout.read_text(errors="replace")
    except (KeyError, OSError):
        return 0, False
    return log.count("this job is timed-out"), "timed-out too many times" in log


def array_ids(runs):
    """The SLURM job ids of the arrays that hold these runs' jobs (their job.json)."""
    return sorted({read_job(run.path)["job_id"].split("_")[0] for run in runs})


def still_queued(job, state):
    """Whether a run's job (its job.json, its scheduler state) may still run it: then it is not submitted again. A
    job the scheduler does not know (sacct lags a new job, forgets an old one) counts while it has not said it
    ended."""
    if state in QUEUED:
        return True
    return state == "UNKNOWN" and job.get("state") in ("submitted", "running", "requeued")


def slurm_states(job_ids, folder):
    """{key: sacct's state} of job ids {key: id}, in one sacct call (submitit's watcher); UNKNOWN when sacct does
    not know a job (yet)."""
    if not job_ids:
        return {}
    import submitit

    jobs = {key: submitit.SlurmJob(folder, job_id) for key, job_id in job_ids.items()}
    next(iter(jobs.values())).get_info(mode="force")
    return {key: job.state.split()[0] for key, job in jobs.items()}


def job_states(jobs, folder):
    """{key: scheduler state} of the job records {key: job.json} that name a job: SLURM's from sacct, a local
    job's RUNNING while its submitit controller (whose pid is the job id) lives, else ENDED."""
    slurm = {key: job["job_id"] for key, job in jobs.items() if job.get("launcher") == "slurm" and job.get("job_id")}
    states = slurm_states(slurm, folder)
    for key, job in jobs.items():
        if job.get("launcher") == "local":
            try:
                os.kill(int(job["job_id"]), 0)
                states[key] = "RUNNING"
            except (OSError, ValueError):
                states[key] = "ENDED"
    return states


LAUNCHERS = {"sequential": Sequential, "local": Local, "slurm": Slurm}
