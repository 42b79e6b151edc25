"""What a launcher is: the interface every backend implements (Launcher), the runs it is handed (RunCommand), what
a plan's [launcher] table asks of it (Resources), and each run's job record (RUN_DIR/job.json) that `--status`
reads. A backend is a subclass in a file of its own, registered by its name (`class Pbs(Launcher, name="pbs")`)
and imported once in sweep/launchers/__init__.py; the plan, the schedule and the status ask it through this class
only."""
import json
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

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
    driver: dict = field(default_factory=dict)  # the job after a ladder's lr grid: its own DRIVER_KEYS


# [launcher.driver]: what the job after a ladder's lr grid asks for instead of the runs' (slurm)
DRIVER_KEYS = {"timeout_min": int, "partition": str, "account": str, "qos": str, "sbatch": dict}


class Launcher:
    """A backend: built as Launcher(resources, nproc_per_node, folder) for each launch (folder: OUT/submitit, where
    submitit keeps its jobs). `queues`: whether launch() returns before its runs end (a scheduler's queue); such a
    backend also implements launch_after, waits_on and states. Every other method has a default that fits a
    backend without a scheduler."""
    name = None
    queues = False
    registry = {}  # name -> class, in the order the backends were defined: what --launcher accepts

    def __init_subclass__(cls, name=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name:
            cls.name = name
            Launcher.registry[name] = cls

    def __init__(self, resources, nproc_per_node, folder):
        self.resources, self.nproc_per_node, self.folder = resources, nproc_per_node, folder

    @classmethod
    def check_resources(cls, resources, where):
        """A ConfigError for a [launcher] table this backend cannot run (read_resources calls it)."""

    def launch(self, runs):
        """Runs or submits each RunCommand (run.now() when it starts); returns the runs it left queued."""
        raise NotImplementedError

    def preflight(self, after):
        """A ConfigError, before anything is submitted, for jobs the scheduler could never finish: the runs' and,
        with `after`, the job after them (launch_after)."""

    def waits_on(self, queued):
        """The job ids a job after the runs `queued` (which launch returned) waits for."""
        raise NotImplementedError(f"the {self.name} launcher leaves no runs queued")

    def launch_after(self, job_ids, function):
        """Submits function() to run once the jobs job_ids have ended, whatever their end; returns its job id."""
        raise NotImplementedError(f"the {self.name} launcher leaves no runs queued")

    @classmethod
    def submission_text(cls, resources, nproc_per_node, folder, jobs):
        """What the dry run prints about the jobs it would submit: jobs is [(title, runs, after)], runs the number
        of runs in the job (0: all finished), after whether it waits on the one before. None: nothing to say."""
        return None

    @classmethod
    def states(cls, jobs, folder):
        """{key: scheduler state} of job records {key: job.json} this backend wrote (sacct's names)."""
        return {}

    @classmethod
    def reasons(cls, jobs):
        """{key: why it waits} of the pending jobs among the records {key: job.json} (the scheduler's words)."""
        return {}


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
    for name, value in table.get("driver", {}).items():
        if name not in DRIVER_KEYS:
            raise ConfigError(f"{where}: [launcher.driver] has unknown key {name!r}; it takes {', '.join(DRIVER_KEYS)}")
        if not isinstance(value, DRIVER_KEYS[name]) or isinstance(value, bool):
            raise ConfigError(f"{where}: [launcher.driver] {name} = {value!r}; expected {DRIVER_KEYS[name].__name__}")
    resources = Resources(**table)
    resources.kind = kind or resources.kind
    if resources.kind not in Launcher.registry:
        raise ConfigError(f"{where}: launcher {resources.kind!r} is not one of {', '.join(Launcher.registry)}")
    Launcher.registry[resources.kind].check_resources(resources, where)
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


def still_queued(job, state):
    """Whether a run's job (its job.json, its scheduler state) may still run it: then it is not submitted again. A
    job the scheduler does not know (sacct lags a new job, forgets an old one) counts while it has not said it
    ended."""
    if state in QUEUED:
        return True
    return state == "UNKNOWN" and job.get("state") in ("submitted", "running", "requeued")


def job_states(jobs, folder):
    """{key: scheduler state} of the job records {key: job.json} that name a job, each asked of the backend that
    wrote it (one call per backend)."""
    states = {}
    for name, backend in Launcher.registry.items():
        if mine := {key: job for key, job in jobs.items() if job.get("launcher") == name and job.get("job_id")}:
            states.update(backend.states(mine, folder))
    return states


def pending_reasons(jobs):
    """{key: why it waits} of the pending jobs {key: job.json}, each asked of the backend that wrote it."""
    reasons = {}
    for name, backend in Launcher.registry.items():
        if mine := {key: job for key, job in jobs.items() if job.get("launcher") == name and job.get("job_id")}:
            reasons.update(backend.reasons(mine))
    return reasons


def time_limits(job):
    """(how many times submitit found a run's job at its time limit, whether it then stopped requeuing it:
    max_num_timeout), from the job's own log (submitit's words)."""
    from submitit.core.utils import JobPaths

    try:
        log = JobPaths(job["folder"], job_id=job["job_id"], task_id=0).stdout.read_text(errors="replace")
    except (KeyError, OSError):
        return 0, False
    # submitit logs its warnings to stdout and stderr, one file here: the same line (to the millisecond) twice
    events = {line for line in log.splitlines() if "this job is timed-out" in line}
    return len(events), "timed-out too many times" in log
