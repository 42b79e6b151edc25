"""Where a sweep stands: every run of its plan with its state, job and last logged step.

    python -m sweep --status runs/ladder_gpu

States: done (its final evaluation is logged), running, pending (not started, or queued; a ladder's run after its
lr grid names the job it waits on), requeued (stopped at a time limit, by preemption or `scontrol requeue`, with its
checkpoint, and queued again), failed (the trainer exited with an error, or the scheduler ended the job: its log's
last lines follow), stopped (its job was cancelled, reached its time limit once more than max_num_timeout allows, or
ended before the run finished: submit again), unfinished (a sequential run that has not finished: no scheduler to
ask whether it still runs). The requeues column counts SLURM's requeues of the run's job (SLURM_RESTART_COUNT when it
last started, plus one when it is queued again since). Job states come from the run's RUN_DIR/job.json (written at
submission and by the job itself), the scheduler (sacct for SLURM) and, for the time-limit cap, the job's submitit
log. Notes are cut from the right.
"""
import fnmatch
import json
import math
from pathlib import Path

from analysis.runs import RunError, finished, load_run, markdown_table
from sweep import launchers
from sweep.plan import run_dir

NOTE_WIDTH = 200


def planned_runs(plan, out):
    """The names of the plan's run directories; a ladder's runs after its lr grid (the tuning audit's too) as patterns
    (lr not known yet)."""
    names = []
    ladder = plan.ladder
    if ladder and ladder.lr_seeds:  # the grid on its own seeds, then every size on the compared ones
        names += [run_dir(out, label, seed, size, lr).name for seed in ladder.lr_seeds for size in ladder.grids()
                  for label in plan.labels for lr in ladder.lrs]
    for seed in plan.seeds:
        for size in (ladder.sizes if ladder else [None]):
            for label in plan.labels:
                grid = ladder is None or (not ladder.lr_seeds and (not ladder.lr_size or size == ladder.lr_size))
                for lr in (ladder.lrs if ladder and grid else [None]):
                    name = run_dir(out, label, seed, size, lr).name
                    names.append(name if grid else name.replace(f"_seed{seed}", f"_lr*_seed{seed}"))
    if ladder and ladder.audit_size:  # the tuning audit: 4 lrs per arm around its pick, known after the grid
        names += [run_dir(out, label, seed, ladder.audit_size).name.replace(f"_seed{seed}", f"_lr*_seed{seed}")
                  for seed in ladder.audit_seed_list() for label in plan.labels]
    return names


def run_names(directory):
    """The plan's runs (patterns resolved to the directories that match them), then any other run directories."""
    directory = Path(directory)
    plan = directory / "sweep_plan.json"
    planned = json.loads(plan.read_text()).get("runs", []) if plan.is_file() else []
    present = sorted(p.name for p in directory.iterdir() if p.is_dir() and p.name != "submitit")
    names = []
    for name in planned:
        matches = fnmatch.filter(present, name) if "*" in name else [name]
        names += matches or [name]
    return names + [name for name in present if name not in names and not is_empty(directory / name)]


def is_empty(path):
    return not any((path / f).exists() for f in ("train.out", "log.txt", "metrics.jsonl", launchers.JOB_FILE))


def last_step(path):
    try:
        return load_run(path).last_step
    except RunError:
        return None


def status_rows(directory):
    """[(name, state, job id, requeues, last step, note)] of every run of the sweep in `directory`."""
    directory = Path(directory)
    names = run_names(directory)
    jobs = {name: launchers.read_job(directory / name) for name in names}
    after_grid = launchers.read_job(directory, launchers.AFTER_GRID)
    jobs[launchers.AFTER_GRID] = after_grid
    states = launchers.job_states(jobs, directory / "submitit")
    reasons = launchers.pending_reasons({key: job for key, job in jobs.items() if states.get(key) in WAITING})
    rows = []
    for name in names:
        path, job = directory / name, jobs[name]
        if "*" in name:  # after a ladder's lr grid: its lr, hence its directory, is not known yet
            job = {"job_id": after_grid.get("job_id")}
            state, note = after_grid_state(after_grid, states.get(launchers.AFTER_GRID),
                                           reasons.get(launchers.AFTER_GRID))
        else:
            state, note = run_state(path, job, states.get(name))
            if state in ("pending", "requeued") and name in reasons:
                note = shorten(reasons[name])
        rows.append((name, state, job.get("job_id") or "", requeues(job, state), last_step(path), note))
    return rows


WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD"}  # the scheduler states in which a job has a reason to wait


def after_grid_state(record, scheduler, reason):
    """(state, note) of a run after a ladder's lr grid: it waits on the job that picks the lr (OUT/after_grid.json,
    and why that job waits when the scheduler says), on the grid, or that job's decision stopped the ladder."""
    if not record:
        return "pending", "waits on the lr grid: runs at each arm's best lr once the grid has finished"
    if record.get("state") == "not submitted":
        return "not submitted", shorten(f"the job after the lr grid was not submitted: {record.get('error')}")
    if record.get("state") == "stopped":  # its decision (an edge pick, an unfinished grid), not a failure
        return "stopped", shorten(f"the job after the lr grid stopped the ladder: {record.get('error')}")
    if record.get("state") == "failed":
        return "failed", shorten(f"job {record['job_id']} after the lr grid failed: {record.get('error')}")
    if launchers.still_queued(record, scheduler):
        return "pending", shorten(f"waits on the lr grid: job {record['job_id']} picks each arm's lr once jobs "
                                  f"{', '.join(record['after'])} end" + (f"; it waits itself ({reason})" if reason
                                                                        else ""))
    return "pending", (f"job {record['job_id']} after the lr grid ended ({scheduler}) without submitting it: rerun "
                       "the sweep")


def run_state(path, job, scheduler):
    """(state, note) of one run from its directory, its job.json and its scheduler state (None: not asked)."""
    if finished(path):
        return "done", ""
    if job.get("state") == "not submitted" and not launchers.still_queued(job, scheduler):
        return "not submitted", shorten(job.get("error") or "")
    if scheduler == "CANCELLED":  # scancel: the trainer saved on its SIGTERM, as on a preemption
        return "stopped", "cancelled: rerun the sweep to continue it from its last checkpoint"
    timeouts, capped = launchers.time_limits(job) if scheduler in launchers.ENDED_BADLY else (0, False)
    if capped:
        return "stopped", time_limit_note(path, timeouts)
    if job.get("state") == "failed" or scheduler in launchers.ENDED_BADLY:
        return "failed", shorten(" | ".join(job.get("error") or launchers.log_tail(path, 1)))
    if scheduler == "RUNNING" and job.get("state") != "requeued":
        return "running", ""
    if launchers.still_queued(job, scheduler):
        # started once (running, stopped or requeued by its own signal handler) and queued again: requeued
        return ("requeued" if job.get("state") in ("requeued", "running", "stopped") else "pending"), ""
    if not path.is_dir() or is_empty(path):
        return "pending", ""
    if not job:
        return "unfinished", "no job: a sequential run, still running or stopped; rerun the sweep to continue"
    return "stopped", f"the job ended without finishing the run ({scheduler or job.get('state')}): rerun the sweep"


def time_limit_note(path, timeouts):
    """A run its job stopped requeuing: how often it met the time limit, and the max_num_timeout that lets a new job
    finish it at the pace of this one (its steps per time limit)."""
    note = f"time limit reached {timeouts} times (max_num_timeout {timeouts - 1})"
    try:
        run = load_run(path)
        step, total = run.last_step, run.setting("max_steps")
    except RunError:
        step = total = None
    if not (step and total and step < total):
        return shorten(note + ": raise max_num_timeout or timeout_min in [launcher], then rerun the sweep (it resumes)")
    needed = math.ceil((total - step) / (step / timeouts)) - 1  # the time limits its rest meets at this job's pace
    if needed <= timeouts - 1:  # a new job counts from 0 again
        return shorten(f"{note} at step {step} of {total}: about {needed} more at this pace, which a new job allows; "
                       "rerun the sweep (it resumes)")
    return shorten(f"{note} at step {step} of {total}: about {needed} more at this pace; set max_num_timeout = "
                   f"{needed} or raise timeout_min in [launcher], then rerun the sweep (it resumes)")


def requeues(job, state):
    """The requeues of a run: the count its job wrote when it last started (with its earlier jobs'), plus the one the
    scheduler made since when it is queued again (its own time limit, preemption, `scontrol requeue`)."""
    return (job.get("requeues") or 0) + (state == "requeued")


def shorten(note, width=NOTE_WIDTH):
    """A note cut from the right: its start says what happened."""
    return note if len(note) <= width else note[:width - 3] + "..."


def status_text(directory):
    rows = status_rows(directory)
    counts = {}
    for row in rows:
        counts[row[1]] = counts.get(row[1], 0) + 1
    table = markdown_table(["run", "state", "job", "requeues", "last step", "note"],
                           [[name, state, job, requeues, "" if step is None else step, note]
                            for name, state, job, requeues, step, note in rows])
    return f"{directory}: {len(rows)} runs, " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) \
        + "\n" + table


def missing_text(directory):
    """One line naming the plan's runs that have not finished, for a report written from part of a sweep."""
    names = [name for name in run_names(directory) if not finished(Path(directory) / name)]
    if not names:
        return ""
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"missing: {len(names)} run(s) of the plan have not finished ({shown}); this report is from the "
            f"finished ones (python -m sweep --status {directory})")
