"""Stand-in sbatch, srun, sacct, scontrol, sinfo and squeue for tests/test_launchers.py: `fake_slurm.py NAME ARGS`
behaves as command NAME (install() writes a script per name into a directory that goes first on PATH); they keep
their state in $FAKE_SLURM (a directory).

$FAKE_SLURM_PARTITIONS lists the cluster's partitions, the first its default, each NAME or NAME:MINUTES (its
MaxTime; none: no limit): `sinfo -h -o "%P|%l"` prints them as Slurm 22.05 does ("short*|10:00").
sbatch FILE records FILE's #SBATCH options and the names of the SLURM_* variables it was given (submissions.jsonl)
and answers "Submitted batch job ID"; it refuses, in Slurm 22.05's words, a partition not listed in
$FAKE_SLURM_PARTITIONS (when set), any GPU request when $FAKE_SLURM_NO_GPUS is set, and a time over its partition's
MaxTime when $FAKE_SLURM_ENFORCE_LIMITS is set (EnforcePartLimits); without it such a job is queued and pends for
ever, squeue's reason PartitionTimeLimit. squeue -h -r -t PD -o "%i|%r" -j IDS prints each pending task's reason:
Dependency while a job it waits on runs, BeginTime once requeued, else Resources. An array's tasks are ID_0,
ID_1 ...; a job without --array is ID. The tasks listed in $FAKE_SLURM_RUN (task numbers, or "all") run in the
background, one after another, as SLURM would run the script (its environment variables, srun starting the command),
once every job their --dependency=afterany:ID:... names has ended; the others stay PENDING. When the file
$FAKE_SLURM_SIGNAL_WHEN appears during a task's first run, the task's processes (srun's command and everything below
it; not the batch shell, not srun) get SIGUSR2, as SLURM signals a job ahead of its time limit (--signal). scontrol
requeue ID marks the task: when its script ends, it runs again (SLURM_RESTART_COUNT 1, 2, ...). sacct -j ID prints
the tasks' states in the --parsable2 form submitit reads. submitit_log() is what submitit itself writes into a
job's log at its time limits (each warning twice: its logger writes to stdout and stderr, one file here).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM", "."))


def task_file(job):
    return STATE / f"task_{job}.json"


def read_task(job):
    return json.loads(task_file(job).read_text())


def write_task(job, **changes):
    record = {**(read_task(job) if task_file(job).exists() else {}), **changes}
    tmp = task_file(job).with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(task_file(job))


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def sbatch(script):
    """Refuses what Slurm 22.05 refuses here (a partition not in $FAKE_SLURM_PARTITIONS, GPUs on a cluster without
    them: $FAKE_SLURM_NO_GPUS) in its words, else queues the job (an array's tasks ID_0, ID_1 ...)."""
    options = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", Path(script).read_text(), re.M))
    partitions = partition_limits()
    if partitions and options.get("partition", default_partition()) not in partitions:
        sys.exit(f"sbatch: error: invalid partition specified: {options.get('partition')}\n"
                 "sbatch: error: Batch job submission failed: Invalid partition name specified")
    if os.environ.get("FAKE_SLURM_NO_GPUS") and ({"gpus-per-node", "gres", "gpus"} & set(options)):
        sys.exit("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification")
    limit = partition_limits().get(options.get("partition") or default_partition())
    over = limit is not None and int(options.get("time", 0)) > limit
    if over and os.environ.get("FAKE_SLURM_ENFORCE_LIMITS"):
        sys.exit("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds "
                 "some limit)")
    ids = STATE / "next_id"
    job_id = int(ids.read_text()) if ids.exists() else 1000
    ids.write_text(str(job_id + 1))
    with open(STATE / "submissions.jsonl", "a") as f:
        f.write(json.dumps({"job_id": job_id, "script": Path(script).read_text(), "options": options,
                            "slurm_env": sorted(k for k in os.environ if k.startswith("SLURM_"))}) + "\n")
    if "array" in options:
        count = int(re.fullmatch(r"0-(\d+)(%\d+)?", options["array"])[1]) + 1
        tasks = [f"{job_id}_{task}" for task in range(count)]
    else:
        tasks = [str(job_id)]
    after = options.get("dependency", "afterany").split(":")[1:]
    for task in tasks:
        write_task(task, state="PENDING", restarts=0, requeue=False,
                   reason="PartitionTimeLimit" if over else "Dependency" if after else "Resources")
    wanted = os.environ.get("FAKE_SLURM_RUN", "")
    run = [t for t in tasks if not over and (wanted == "all" or t.split("_")[-1] in wanted.split(","))]
    if run:
        subprocess.Popen([sys.executable, __file__, "_run", script, ",".join(after), *run],
                         stdout=subprocess.DEVNULL, stderr=open(STATE / "runner.err", "a"), start_new_session=True)
    print(f"Submitted batch job {job_id}")


def partition_limits():
    """{partition: MaxTime in minutes or None} from $FAKE_SLURM_PARTITIONS (NAME or NAME:MINUTES, comma-separated)."""
    listed = [entry.split(":") for entry in os.environ.get("FAKE_SLURM_PARTITIONS", "").split(",") if entry]
    return {entry[0]: int(entry[1]) if len(entry) > 1 else None for entry in listed}


def default_partition():
    return next(iter(partition_limits()), None)


def sinfo(argv):
    """`sinfo -h -o "%P|%l"`: each partition and its time limit, the default one marked *."""
    assert argv == ["-h", "-o", "%P|%l"], argv
    for name, minutes in partition_limits().items():
        limit = "infinite" if minutes is None else (f"{minutes // 60}:{minutes % 60:02d}:00" if minutes >= 60
                                                    else f"{minutes}:00")
        print(f"{name}{'*' if name == default_partition() else ''}|{limit}")


def squeue(argv):
    """`squeue -h -r -t PD -o "%i|%r" -j IDS`: each pending task of the jobs IDS and squeue's reason."""
    assert argv[:6] == ["-h", "-r", "-t", "PD", "-o", "%i|%r"] and argv[6] == "-j", argv
    ids = argv[7].split(",")
    for path in sorted(STATE.glob("task_*.json")):
        job = path.stem[len("task_"):]
        task = read_task(job)
        if job.split("_")[0] in ids and task["state"] in ("PENDING", "REQUEUED"):
            print(f"{job}|{'BeginTime' if task['state'] == 'REQUEUED' else task.get('reason', 'Resources')}")


def submitit_log(job_id, host, timeouts, max_num_timeout):
    """What submitit writes into a job's log (stdout and stderr: one file) when the job meets its time limit
    `timeouts` times under max_num_timeout: a WARNING goes to both streams, an INFO to stdout only."""
    lines = []
    for n in range(timeouts):
        stamp = f"2026-12-01 00:{n:02d}:00,{n:03d}"
        lines += [f"submitit INFO ({stamp}) - Job has timed out. Ran 5 minutes out of requested 5 minutes."]
        lines += [f"submitit WARNING ({stamp}) - Caught signal SIGUSR2 on {host}: this job is timed-out."] * 2
        lines += [f"submitit INFO ({stamp}) - Calling checkpoint method."]
        if n < max_num_timeout:
            lines += [f"submitit INFO ({stamp}) - Requeued job {job_id} ({max_num_timeout - n - 1} remaining "
                      "timeouts)"]
        else:
            lines += [f"submitit INFO ({stamp}) - Job not requeued because: timed-out too many times."]
    return "\n".join(lines) + "\n"


def process_children():
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def children_of(pid):
    return process_children().get(pid, [])


def descendants(pid):
    """pid and every process below it (from /proc)."""
    children, found, todo = process_children(), [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def run_tasks(script, after, tasks):
    """Runs the tasks one after another once every task of the jobs `after` has ended (afterany)."""
    while any(read_task(path.stem[len("task_"):])["state"] not in ENDED for job in after
              for path in STATE.glob(f"task_{job}*.json") if path.stem.split("_")[1] == job):
        time.sleep(0.02)
    trigger = os.environ.get("FAKE_SLURM_SIGNAL_WHEN")
    for job in tasks:
        array_id, _, task = job.partition("_")
        while True:
            restarts = read_task(job)["restarts"]
            write_task(job, state="RUNNING", requeue=False)
            env = {**os.environ, "SLURM_JOB_ID": str(int(array_id) + 1 + int(task)) if task else array_id,
                   "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1",
                   "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_RESTART_COUNT": str(restarts),
                   **({"SLURM_ARRAY_JOB_ID": array_id, "SLURM_ARRAY_TASK_ID": task} if task else {})}
            proc = subprocess.Popen(["bash", script], env=env)
            signalled = False
            while proc.poll() is None:
                if trigger and not signalled and restarts == 0 and Path(trigger).exists():
                    shell_and_srun = [proc.pid, *children_of(proc.pid)]
                    for pid in [p for p in descendants(proc.pid) if p not in shell_and_srun]:
                        try:
                            os.kill(pid, signal.SIGUSR2)
                        except ProcessLookupError:
                            pass
                    signalled = True
                time.sleep(0.005)
            if not read_task(job)["requeue"]:
                write_task(job, state="COMPLETED" if proc.returncode == 0 else "FAILED")
                break
            write_task(job, restarts=restarts + 1)


def srun(argv):
    """srun --unbuffered --output FILE [--error FILE] COMMAND: the command, its output to FILE (%A %a %j %t filled)."""
    files = {}
    while argv[0].startswith("--"):
        option = argv.pop(0)
        if option in ("--output", "--error"):
            files[option] = argv.pop(0)
    fill = {"%A": os.environ.get("SLURM_ARRAY_JOB_ID", ""), "%a": os.environ.get("SLURM_ARRAY_TASK_ID", ""),
            "%j": os.environ["SLURM_JOB_ID"], "%t": "0"}
    for key, name in files.items():
        for pattern, value in fill.items():
            name = name.replace(pattern, value)
        files[key] = open(name, "a")
    out = files.get("--output")
    return subprocess.run(argv, stdout=out, stderr=files.get("--error", out)).returncode


def sacct(argv):
    ids = [argv[i + 1] for i, a in enumerate(argv) if a == "-j"]
    print("JobID|State|NodeList")
    for path in sorted(STATE.glob("task_*.json")):
        job = path.stem[len("task_"):]
        if job.split("_")[0] in ids or job in ids:
            print(f"{job}|{read_task(job)['state']}|localhost")


def scontrol(argv):
    with open(STATE / "scontrol.log", "a") as f:
        f.write(" ".join(argv) + "\n")
    if argv[0] == "requeue":
        write_task(argv[1], requeue=True, state="REQUEUED")


def install(directory):
    """A script per command in `directory` (put it first on PATH), each calling this file."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "srun", "sacct", "scontrol", "sinfo", "squeue"):
        # -S: no site-packages (it needs none), a third less CPU per call
        (directory / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{__file__}" {name} "$@"\n')
        (directory / name).chmod(0o755)
    return directory


if __name__ == "__main__":
    command, argv = sys.argv[1], sys.argv[2:]
    if command == "_run":
        run_tasks(argv[0], [job for job in argv[1].split(",") if job], argv[2:])
    elif command == "sbatch":
        sbatch(argv[0])
    elif command == "srun":
        sys.exit(srun(argv))
    elif command == "sacct":
        sacct(argv)
    elif command == "scontrol":
        scontrol(argv)
    elif command == "sinfo":
        sinfo(argv)
    elif command == "squeue":
        squeue(argv)
