"""One run as a submitit job (TrainerJob): what a job process unpickles, so it imports no torch and nothing of the
sweep at import time.

The trainer runs under torchrun when it has several processes: --standalone on one node; across nodes, c10d
rendezvous on the job's first host (SLURM_JOB_NODELIST), one torchrun per node (submitit starts one task per node).

Time limits and preemption (local and slurm) follow submitit's checkpointing protocol: the job is signalled
(SIGUSR2) signal_delay_s before its time limit, or when preempted; TrainerJob.checkpoint stops the trainer with one
SIGTERM (it finishes its step, writes a checkpoint and exits; torchrun forwards the SIGTERM to its workers and
waits up to signal_delay_s for them) and hands submitit the same job to requeue, which continues from that
checkpoint (every run has --auto-resume) and ends where an uninterrupted run ends. Time limits requeue at most
max_num_timeout times (submitit's count). The trainer and torchrun ignore SIGUSR2 (SLURM signals every process of
the job; only the job's own process answers). A trainer that exits with an error fails its job, which is never
requeued; its state and its log's last lines are in RUN_DIR/job.json, which `python -m sweep --status` reads.
"""
import os
import signal
import subprocess
import sys

from submitit.helpers import Checkpointable, DelayedSubmission

from sweep.launchers.base import log_tail, read_job, write_job


def ignore_usr2():
    """In the trainer's process before exec (torchrun's workers inherit it): SLURM's SIGUSR2 is for the job."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainerJob(Checkpointable):
    """One run as a submitit job: the trainer (under torchrun when it has several processes), checkpointed and
    requeued on submitit's signal."""

    def __init__(self, run, nproc_per_node, nnodes=1, stop_timeout_s=120):
        self.run, self.nproc_per_node, self.nnodes, self.stop_timeout_s = run, nproc_per_node, nnodes, stop_timeout_s
        self.requeues = 0  # its requeues in this job, as this object counts them (SLURM counts them too)
        self.restarted = False  # requeued by its own checkpoint(): a requeue once it starts again
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
        # a requeue counts when the job starts again: checkpoint() at the time-limit cap hands submitit a job it
        # does not requeue. SLURM counts every requeue of the job (submitit's, `scontrol requeue`, preemption); the
        # own count only submitit's, carried in the pickle a requeue from outside does not rewrite
        self.requeues += getattr(self, "restarted", False)
        self.restarted = False
        self.requeues = max(self.requeues, int(os.environ.get("SLURM_RESTART_COUNT", 0)))
        if leader:  # the run's requeues: its earlier jobs' (a resubmission) and this one's
            before = read_job(self.run.path).get("requeues_before") or 0
            write_job(self.run.path, job_id=env.job_id, state="running", requeues=before + self.requeues,
                      host=env.hostname, error=None)
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
        self.restarted = True
        write_job(self.run.path, state="requeued", stopped_with=code)
        return DelayedSubmission(self)
