"""The launchers without a scheduler: `sequential` (one run after another in this process, the default) and
`local` (side by side on this machine through submitit's LocalExecutor, `parallel` at a time, each run on its own
gpus_per_node GPUs; none on a CPU machine, where two run at a time). Both return once every run has ended."""
import os
import queue
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from analysis.runs import finished
from errors import ConfigError
from sweep.launchers.base import Launcher, log_tail, read_job, write_job
from sweep.launchers.job import TrainerJob


class Sequential(Launcher, name="sequential"):
    """One run after another in this process; a run that stops is an error saying how to continue."""

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


class Local(Launcher, name="local"):
    """submitit's LocalExecutor, `parallel` runs at a time, each on its own GPUs; waits for all of them."""

    def __init__(self, resources, nproc_per_node, folder):
        import submitit

        super().__init__(resources, nproc_per_node, folder)
        gpus = visible_gpus()
        per_run = resources.gpus_per_node
        if per_run is None:  # a GPU per process; a CPU machine's runs take none
            per_run = nproc_per_node if gpus else 0
        parallel = resources.parallel or (gpus // per_run if per_run else 2)
        if per_run and gpus < per_run * parallel:
            raise ConfigError(f"the local launcher needs {per_run} GPU(s) per run x {parallel} runs at once; "
                              f"this machine has {gpus}: lower parallel or gpus_per_node in [launcher]")
        self.stop_timeout_s = resources.signal_delay_s
        self.slots = queue.Queue()
        for slot in range(parallel):  # an executor per slot: its GPUs are its own
            executor = submitit.LocalExecutor(folder, max_num_timeout=resources.max_num_timeout)
            executor.update_parameters(timeout_min=resources.timeout_min, signal_delay_s=resources.signal_delay_s,
                                       gpus_per_node=per_run, visible_gpus=tuple(range(slot * per_run,
                                                                                       (slot + 1) * per_run)),
                                       stderr_to_stdout=True, setup=resources.setup)
            self.slots.put(executor)
        self.parallel = parallel

    @classmethod
    def check_resources(cls, resources, where):
        if resources.nodes != 1:
            raise ConfigError(f"{where}: the local launcher runs on one machine; nodes = {resources.nodes} needs "
                              "slurm")

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

    @classmethod
    def states(cls, jobs, folder):
        """RUNNING while a job's submitit controller (whose pid is the job id) lives, else ENDED."""
        states = {}
        for key, job in jobs.items():
            try:
                os.kill(int(job["job_id"]), 0)
                states[key] = "RUNNING"
            except (OSError, ValueError):
                states[key] = "ENDED"
        return states


def visible_gpus():
    import torch  # the sweep's process only

    return torch.cuda.device_count()
