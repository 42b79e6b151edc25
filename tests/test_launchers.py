"""Launchers (sweep/launchers.py): a plan side by side through submitit's local executor reports as the sequential
sweep does; as a SLURM job array (stand-in sbatch, srun, sacct, scontrol: tests/fake_slurm.py) it asks for its
resources, and a job signalled mid-run checkpoints, requeues and ends bit-for-bit where an uninterrupted run ends;
the cost line and --status."""
import json
import math
import os
import re
import time
from pathlib import Path

import pytest
import torch

import fake_slurm
from analysis import ladder_report
from analysis.runs import finished
from sweep import cli, launchers, plan, schedule
from stats import lr_grid
from sweep.status import status_rows
from train_gpt2 import memory_shape
from training import memory
from model import GPT, GPTConfig
from test_sweep import fake_run
from test_train_gpt2 import final_weights, train_in_process, train_losses, write_corpus

HERE = Path(__file__).resolve().parent
PLAN = """config = "configs/gpt2_cpu_tiny.toml"
seeds = [1, 2]
[sizes.a]
n_layer = 1
n_embd = 32
n_head = 2
max_steps = 4
[sizes.b]
n_layer = 2
n_embd = 32
n_head = 2
max_steps = 4
[variants.gelu]
act = "gelu"
[variants.relu]
act = "relu"
"""


@pytest.mark.long
def test_local_launcher_runs_two_at_a_time_and_reports_as_the_sequential_sweep(tmp_path, monkeypatch):
    """2 sizes x 2 arms x 2 seeds through submitit's LocalExecutor, two at a time (a CPU machine), each run the
    stand-in trainer (tests/stand_in_trainer.py: a torch import per run would cost seconds): its report is the one
    the sequential sweep writes for the same runs."""
    monkeypatch.setitem(plan.TRAINERS, "gpt2", HERE / "stand_in_trainer.py")
    monkeypatch.setattr(ladder_report, "plot_scaling", lambda *a, **k: None)
    monkeypatch.setattr(ladder_report, "plot_lr_grid", lambda *a, **k: None)
    (tmp_path / "plan.toml").write_text(PLAN)
    reports = {}
    for launcher in ("sequential", "local"):
        out = tmp_path / launcher
        cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(out), "--launcher", launcher])
        reports[launcher] = (out / "sweep.md").read_text().replace(str(out), "OUT")
    assert reports["local"] == reports["sequential"]
    runs = sorted((tmp_path / "local").glob("*_seed*"))
    assert len(runs) == 8 and all(launchers.read_job(run)["state"] == "ended" for run in runs)
    spans = [json.loads((run / "stand_in.json").read_text()) for run in runs]
    at_once = [sum(s["started"] <= t["started"] < s["ended"] for s in spans) for t in spans]
    assert max(at_once) == 2  # side by side, never more than two


def tiny_config(tmp_path, max_steps):
    """A trainer config of a few CPU-milliseconds per step (1 layer, d 16, vocab 64): checkpoints only at the end
    and on a signal."""
    data = write_corpus(tmp_path / "data")
    (tmp_path / "tiny.toml").write_text(f"""
[model]
vocab_size = 64
block_size = 16
n_layer = 1
n_head = 1
n_embd = 16
[data]
data_dir = "{data}"
val_tokens = 128
[optim]
total_batch_size = 128
batch_size = 4
seq_len = 16
warmup_steps = 2
max_lr = 3e-3
min_lr = 3e-4
max_steps = {max_steps}
[eval]
eval_interval = 0
[run]
device = "cpu"
compile = false
checkpoint_interval = 0
""")
    return tmp_path / "tiny.toml"


SLURM_PLAN = """config = "{config}"
seeds = [1]
[variants.gelu]
act = "gelu"
[variants.relu]
act = "relu"
[launcher]
kind = "slurm"
gpus_per_node = 1
cpus_per_task = 4
mem_gb = 8
timeout_min = 30
partition = "gpu"
account = "acct"
qos = "high"
constraint = "h100"
array_parallelism = 1
signal_delay_s = 90
max_num_timeout = 2
sbatch = {{exclusive = true}}
"""


@pytest.mark.long
def test_slurm_array_asks_for_its_resources_and_a_signalled_job_resumes_to_the_uninterrupted_end(tmp_path,
                                                                                                 monkeypatch):
    """The array of a 2-run plan and its #SBATCH resources; its first job signalled (SIGUSR2) mid-run: the job stops
    the trainer (SIGTERM: it saves a checkpoint and exits 143), submitit requeues it, and the run resumes to the
    weights and losses of an uninterrupted run. (This is also the trainer's SIGTERM test.)"""
    max_steps = 60
    config = tiny_config(tmp_path, max_steps)
    out, state = tmp_path / "sweep", tmp_path / "slurm"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{fake_slurm.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("FAKE_SLURM_RUN", "0")  # the array's first task runs; the second stays pending
    monkeypatch.setenv("FAKE_SLURM_SIGNAL_WHEN", str(out / "gelu_seed1" / "metrics.jsonl"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "plan.toml").write_text(SLURM_PLAN.format(config=config))
    argv = ["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(out)]
    cli.main(argv)

    submitted = [json.loads(line) for line in (state / "submissions.jsonl").read_text().splitlines()]
    assert len(submitted) == 1  # one array for both runs
    options = submitted[0]["options"]
    assert {k: options[k] for k in ("array", "signal", "time", "nodes", "ntasks-per-node", "gpus-per-node",
                                    "cpus-per-task", "mem", "partition", "account", "qos", "constraint")} == {
        "array": "0-1%1", "signal": "USR2@90", "time": "30", "nodes": "1", "ntasks-per-node": "1",
        "gpus-per-node": "1", "cpus-per-task": "4", "mem": "8GB", "partition": "gpu", "account": "acct",
        "qos": "high", "constraint": "h100"}
    assert "exclusive" in options and "srun" in submitted[0]["script"]

    deadline = time.time() + 240
    while fake_slurm_state(state, "1000_0") != "COMPLETED":
        assert fake_slurm_state(state, "1000_0") != "FAILED", (out / "gelu_seed1" / "train.out").read_text()
        assert time.time() < deadline, "the job did not end"
        time.sleep(0.1)
    assert (state / "scontrol.log").read_text() == "requeue 1000_0\n"  # submitit's requeue, once
    log = (out / "gelu_seed1" / "train.out").read_text()
    stopped = re.search(r"stopped by signal at step (\d+)", log)
    assert stopped and 0 < int(stopped[1]) < max_steps, log  # the signal came mid-run: something was resumed
    assert f"resuming {out / 'gelu_seed1'}/model_{int(stopped[1]):05d}.pt at step {stopped[1]}" in log, log
    job = launchers.read_job(out / "gelu_seed1")
    assert (job["state"], job["requeues"], job["job_id"]) == ("ended", 1, "1000_0")
    # the trainer on SIGTERM: saved one checkpoint and exited 128 + 15, so no scheduler takes it for finished
    assert job["stopped_with"] == 143 and "continue with --resume" in log
    assert sorted(p.name for p in (out / "gelu_seed1").glob("model_*.pt")) == [
        f"model_{int(stopped[1]):05d}.pt", f"model_{max_steps:05d}.pt"]

    train_in_process(["--config", str(config), "--act", "gelu", "--seed", "1", "--out-dir", str(tmp_path / "straight")])
    assert train_losses(out / "gelu_seed1") == train_losses(tmp_path / "straight")
    a, b = final_weights(tmp_path / "straight", max_steps), final_weights(out / "gelu_seed1", max_steps)
    assert all(torch.equal(a[key], b[key]) for key in a)

    status = {row[0]: row[1:] for row in status_rows(out)}
    assert status["gelu_seed1"][:4] == ("done", "1000_0", 1, max_steps)
    assert status["relu_seed1"][:3] == ("pending", "1000_1", 0)
    cli.main(argv)  # again: the pending job is left alone, nothing is submitted twice
    assert len((state / "submissions.jsonl").read_text().splitlines()) == 1


def fake_slurm_state(state, job):
    try:
        return json.loads((state / f"task_{job}.json").read_text())["state"]
    except (OSError, ValueError):
        return None


def test_dry_run_prints_the_cost_and_the_runs_and_launches_nothing(tmp_path, monkeypatch, capsys):
    """FLOPs per run: model.py's count for the run's model x tokens; GPU-hours at the bench file's FLOP/s per GPU
    (here 1e9 for gelu, and the slowest measured for relu, which the file lacks)."""
    monkeypatch.setattr(launchers.local, "subprocess", None)  # any launch would fail
    (tmp_path / "plan.toml").write_text(PLAN.replace("seeds = [1, 2]", 'seeds = [1, 2]\nlrs = [1e-3, 2e-3]\n'
                                                                     'lr_size = "a"'))
    (tmp_path / "bench.json").write_text(json.dumps({"device": "Test GPU", "results": {
        "gelu": {"contender": {"act": "gelu"}, "tok_per_s": 1000.0, "flops_per_token": 1e6}}}))
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--dry-run",
                "--throughput", str(tmp_path / "bench.json")])
    text = capsys.readouterr().out
    flops = {}
    for size, n_layer in (("a", 1), ("b", 2)):
        with torch.device("meta"):
            model = GPT(GPTConfig(vocab_size=50304, block_size=128, n_layer=n_layer, n_embd=32, n_head=2), seed=0)
        flops[size] = model.flops_per_token(128) * 1024 * 4  # the config's seq_len and tokens per step, 4 steps
    # size a: 2 arms x 2 lrs x 2 seeds (the grid); size b: 2 arms x 2 seeds at their best lr
    runs = {"a": 8, "b": 4}
    table = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")]
                                               for line in text.splitlines() if line.startswith("| "))}
    for (size, n), n_layer in zip(runs.items(), (1, 2)):
        assert table[size][:4] == [str(n), f"{flops[size]:.3g}", f"{n * flops[size]:.3g}",
                                   f"{n * flops[size] / 1e9 / 3600:,.1f}"]
        # memory per GPU (training/memory.py) on 1 rank, bfloat16 (dtype auto): DDP's and FSDP's the same there
        shape = memory_shape(GPTConfig(vocab_size=50304, block_size=128, n_layer=n_layer, n_embd=32, n_head=2))
        need = memory.estimate(shape, 8, 128, "ddp", 1, "bfloat16").total / memory.GIB
        assert table[size][4:] == [f"{need:,.1f}", f"{need:,.1f}", "ddp"]
    total = sum(n * flops[size] for size, n in runs.items())
    assert f"cost: 12 runs, {total:.3g} training FLOPs" in text
    assert "GPU-hours at the FLOP/s per GPU of bench/train_step.py on Test GPU (gelu 1e+09)" in text
    assert text.count("--auto-resume") == 8 and "relu size b seed 2: after the lr grid, at relu's best lr" in text
    assert not (tmp_path / "s").exists()


def test_a_slurm_dry_run_prints_the_sbatch_lines_of_each_job_and_submits_nothing(tmp_path, monkeypatch, capsys):
    """The #SBATCH and setup lines submitit's script generation writes: the lr grid's array, the job after it (one
    CPU, no GPU, afterany), the other sizes' array; sbatch not even on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (tmp_path / "plan.toml").write_text(LADDER_PLAN + """gpus_per_node = 2
cpus_per_task = 8
mem_gb = 32
timeout_min = 90
signal_delay_s = 60
array_parallelism = 1
setup = ["module load cuda"]
""")
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--dry-run"])
    blocks = capsys.readouterr().out.split("job ")[1:]
    runs = ["#SBATCH --cpus-per-task=8", "#SBATCH --gpus-per-node=2", "#SBATCH --mem=32GB",
            "#SBATCH --partition=cpu", "#SBATCH --signal=USR2@60", "#SBATCH --time=90", "module load cuda"]
    assert blocks[0].startswith("array of 4 runs (the lr grid):\n  #SBATCH --array=0-3%1\n")
    assert blocks[2].startswith("array of 2 runs (the other sizes, at each arm's lr):\n  #SBATCH --array=0-1%1\n")
    assert all(f"  {line}\n" in blocks[0] and f"  {line}\n" in blocks[2] for line in runs)
    after = blocks[1].splitlines()
    assert "  #SBATCH --dependency=afterany:GRID_JOB_ID" in after and "  #SBATCH --cpus-per-task=1" in after
    assert not [line for line in after if "gpus" in line or "--array" in line]
    assert not (tmp_path / "s").exists()


def test_status_names_every_run_with_its_state_job_and_last_step(tmp_path, monkeypatch, capsys):
    """done, running, requeued (with its count), failed (with its log's last line), pending (planned, never
    started): from job.json and the scheduler (the stand-in sacct); --report-only says what is missing."""
    state = tmp_path / "slurm"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{fake_slurm.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    out = tmp_path / "s"
    names = ["gelu_seed1", "relu_seed1", "gelu_seed2", "relu_seed2", "gelu_seed3", "relu_seed3"]
    out.mkdir()
    (out / "sweep_plan.json").write_text(json.dumps({"runs": names, "acts": ["gelu", "relu"]}))
    fake_run(out / "gelu_seed1", "gelu", 1, 3.0)
    fake_run(out / "relu_seed1", "relu", 1, 3.0, stop_at=6)
    fake_run(out / "gelu_seed2", "gelu", 2, 3.0, stop_at=3)
    fake_run(out / "relu_seed2", "relu", 2, 3.0, stop_at=2)
    for name, job, task_state, record in (
            ("gelu_seed1", "1000_0", "COMPLETED", {"state": "ended"}),
            ("relu_seed1", "1000_1", "RUNNING", {"state": "running"}),
            ("gelu_seed2", "1000_2", "PENDING", {"state": "requeued", "requeues": 1}),
            ("relu_seed2", "1000_3", "FAILED", {"state": "failed", "error": ["Traceback", "error: out of memory"]}),
            ("relu_seed3", "1001", "PENDING", {"state": "submitted"})):
        (out / name).mkdir(exist_ok=True)
        launchers.write_job(out / name, launcher="slurm", job_id=job, **record)
        (state / f"task_{job}.json").write_text(json.dumps({"state": task_state, "reason": "PartitionTimeLimit"}))
    cli.main(["--status", str(out)])
    text = capsys.readouterr().out
    rows = {row[0]: row[1:5] for row in status_rows(out)}
    assert rows == {"gelu_seed1": ("done", "1000_0", 0, 10), "relu_seed1": ("running", "1000_1", 0, 6),
                    "gelu_seed2": ("requeued", "1000_2", 2, 3), "relu_seed2": ("failed", "1000_3", 0, 2),
                    "gelu_seed3": ("pending", "", 0, None), "relu_seed3": ("pending", "1001", 0, None)}
    assert "6 runs, 1 done, 1 failed, 2 pending, 1 requeued, 1 running" in text
    assert "Traceback | error: out of memory" in text
    assert "| squeue: PartitionTimeLimit: the job's time limit is over its partition's, it never starts" in text
    cli.main(["--report-only", str(out)])
    assert "missing: 5 run(s) of the plan have not finished (relu_seed1, gelu_seed2, relu_seed2, gelu_seed3, " \
        "relu_seed3)" in capsys.readouterr().out

    reader, writer = os.pipe()  # `--status DIR | head -1`: the reader gone before the table is written
    os.close(reader)
    monkeypatch.setattr("sys.stdout", open(writer, "w", buffering=1))
    with pytest.raises(SystemExit) as stop:
        cli.main(["--status", str(out)])
    assert stop.value.code == 1


def test_a_job_runs_torchrun_across_its_nodes_and_a_failing_trainer_fails_it_with_its_last_lines(tmp_path,
                                                                                                 monkeypatch):
    """Node 1 of a 2-node SLURM job: torchrun with c10d rendezvous on the job's first host. A trainer that exits
    with an error: the job raises (submitit records it as failed; only a signal requeues) and job.json keeps the
    log's last lines for --status."""
    for key, value in dict(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[07-08]",
                           SLURM_NODEID="1", SLURM_PROCID="1", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="2").items():
        monkeypatch.setenv(key, value)
    import submitit

    run = launchers.RunCommand(tmp_path, ["train_gpt2.py", "--act", "gelu"], "gelu seed 1")
    command = launchers.TrainerJob(run, nproc_per_node=8, nnodes=2, stop_timeout_s=90).command(
        submitit.JobEnvironment())
    assert command[1:] == ["-m", "torch.distributed.run", "--nproc_per_node=8", "--shutdown-timeout=90",
                           "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint=gpu07:{20000 + 4242}", "--rdzv-id=4242", "train_gpt2.py", "--act", "gelu"]

    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_PROCID", "0")
    failing = launchers.RunCommand(tmp_path, ["-c", "import sys; print('step 3'); sys.exit('error: out of memory')"], "x")
    with pytest.raises(RuntimeError, match=r"x: the trainer exited with code 1; the last lines .*\nstep 3\n"
                                           r"error: out of memory"):
        launchers.TrainerJob(failing, nproc_per_node=1)()
    assert launchers.read_job(tmp_path) == {"job_id": "4242", "state": "failed", "requeues": 0,
                                            "host": launchers.read_job(tmp_path)["host"],
                                            "error": ["step 3", "error: out of memory"]}


@pytest.mark.parametrize("table, message", [
    ("[launcher]\nnodez = 2", "[launcher] has unknown key(s) ['nodez']; it takes kind, nodes,"),
    ("[launcher]\nnodes = \"2\"", "[launcher] nodes = '2'; expected int"),
    ("[launcher]\nkind = \"pbs\"", "launcher 'pbs' is not one of sequential, local, slurm"),
    ("[launcher]\nkind = \"local\"\nnodes = 2", "the local launcher runs on one machine; nodes = 2 needs slurm"),
    ("[launcher.driver]\ntime = 5", "[launcher.driver] has unknown key 'time'; it takes timeout_min, partition,")])
def test_bad_launcher_tables_are_one_line_errors(tmp_path, table, message, capsys):
    (tmp_path / "plan.toml").write_text(PLAN + table)
    with pytest.raises(SystemExit):
        cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "usage" not in err


def test_slurm_without_its_commands_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "plan.toml").write_text(PLAN)
    argv = ["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--launcher", "slurm"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="needs SLURM's commands; sbatch, srun, sacct, scontrol not on PATH"):
        cli.main(argv)


@pytest.mark.parametrize("table, env, said, fix", [
    ('partition = "gpu"', {"FAKE_SLURM_PARTITIONS": "cpu"}, "invalid partition specified: gpu",
     "set partition in [launcher] to one that `sinfo -s` lists"),
    ('partition = "cpu"\ngpus_per_node = 1', {"FAKE_SLURM_NO_GPUS": "1"},
     "Batch job submission failed: Invalid generic resource (gres) specification", "gpus_per_node = 0")])
def test_sbatch_refusing_the_plan_is_one_line_and_a_corrected_rerun_submits_in_the_same_directory(
        tmp_path, monkeypatch, capsys, table, env, said, fix):
    """Slurm 22.05's refusal (the stand-in sbatch prints its words) is one line naming what to change, sbatch's
    stderr not printed again; it leaves nothing behind (no run directory, no sweep_plan.json, no pickle), and says
    "not submitted" with the refusal in a run that was there before; the plan corrected submits there, and says
    nothing about ladders (it is not one)."""
    text = PLAN.replace("seeds = [1, 2]", "seeds = [1]") + f'[launcher]\nkind = "slurm"\n{table}\n'
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, text, **env)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert str(stop.value).startswith(f"error: sbatch refused the job: {said}; ") and fix in str(stop.value)
    assert "\n" not in str(stop.value) and "sbatch: error" not in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    fake_run(tmp_path / "s" / "gelu_a_seed1", "gelu", 1, 3.0, stop_at=2)  # an earlier submission's, stopped
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["gelu_a_seed1"]
    assert status_rows(tmp_path / "s")[0][1::4] == ("not submitted", str(stop.value)[len("error: "):])
    (tmp_path / "plan.toml").write_text(text.replace('partition = "gpu"', 'partition = "cpu"')
                                        .replace("gpus_per_node = 1", "gpus_per_node = 0"))
    cli.main(argv)
    assert submissions(state)[0]["options"]["array"] == "0-3%4" and "ladder" not in capsys.readouterr().out
    assert sorted(launchers.read_job(p)["state"] for p in (tmp_path / "s").glob("*_seed1")) == ["submitted"] * 4


LADDER_PLAN = PLAN.replace("seeds = [1, 2]", 'seeds = [1]\nlrs = [1e-3, 2e-3]\nlr_size = "a"') + """[launcher]
kind = "slurm"
partition = "cpu"
"""


def submit_to_fake_slurm(tmp_path, monkeypatch, plan_text, run="", **env):
    """The stand-in SLURM on PATH (tasks listed in `run` run), the stand-in trainer; returns (argv, its state dir)."""
    state = tmp_path / "slurm"
    state.mkdir()
    monkeypatch.setitem(plan.TRAINERS, "gpt2", HERE / "stand_in_trainer.py")
    monkeypatch.setenv("PATH", f"{fake_slurm.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    for key, value in dict(FAKE_SLURM=str(state), FAKE_SLURM_RUN=run, **env).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "plan.toml").write_text(plan_text)
    return ["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s")], state


def submissions(state):
    return [json.loads(line) for line in (state / "submissions.jsonl").read_text().splitlines()]


def test_a_ladder_is_one_submission_the_sizes_after_its_grid_wait_in_a_job_after_it(tmp_path, monkeypatch, capsys):
    """On a cluster whose partition allows 10 minutes and refuses more (sbatch, Slurm 22.05's words): the lr grid's
    array, then a job of one CPU after it (afterany, 10 minutes) that will pick the lrs: --status names the job each
    later run waits on and why it waits (squeue), and the same command again leaves both alone. That job's decision
    (here: the grid unfinished) ends it well, a state with its sentence."""
    text = LADDER_PLAN.replace('partition = "cpu"', 'partition = "short"\ntimeout_min = 5')
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, text, FAKE_SLURM_PARTITIONS="short:10,long",
                                       FAKE_SLURM_ENFORCE_LIMITS="1")
    cli.main(argv)
    grid, after = submissions(state)
    assert grid["options"]["array"] == "0-3%4" and "dependency" not in grid["options"]
    assert "gpus-per-node" not in grid["options"]  # the config's device is the CPU: no GPU asked for
    assert after["options"]["dependency"] == "afterany:1000" and after["options"]["cpus-per-task"] == "1"
    assert "gpus-per-node" not in after["options"] and after["options"]["partition"] == "short"
    assert after["options"]["time"] == "10"  # the partition's limit, not more
    assert "job 1001: once the lr grid's jobs (1000) end, picks each arm's lr and submits sizes b" in \
        capsys.readouterr().out
    rows = {row[0]: row[1:] for row in status_rows(tmp_path / "s")}
    assert rows["gelu_b_lr*_seed1"][:2] == ("pending", "1001")
    assert rows["gelu_b_lr*_seed1"][4] == ("waits on the lr grid: job 1001 picks each arm's lr once jobs 1000 end; "
                                           "it waits itself (squeue: Dependency)")
    assert rows["gelu_a_lr0.001_seed1"][:2] == ("pending", "1000_0")
    assert rows["gelu_a_lr0.001_seed1"][4] == "squeue: Resources"
    cli.main(argv)
    assert len(submissions(state)) == 2
    assert "job 1001 already waits for the lr grid to run sizes b" in capsys.readouterr().out

    _, ladder = cli.parse_args(argv)
    token = launchers.read_job(tmp_path / "s", launchers.AFTER_GRID)["token"]
    assert schedule.AfterGrid(ladder, tmp_path / "s", [], ["b"], token)() == []  # the job's decision: no error
    rows = {row[0]: row[1:] for row in status_rows(tmp_path / "s")}
    assert rows["relu_b_lr*_seed1"][0] == "stopped" and rows["relu_b_lr*_seed1"][4].startswith(
        "the job after the lr grid stopped the ladder: the lr grid has 4 unfinished run(s)")
    assert len(submissions(state)) == 2


def test_the_job_after_the_grid_asks_for_its_own_resources_and_what_could_not_finish_is_refused(tmp_path,
                                                                                                monkeypatch):
    """[launcher.driver]: the job after the lr grid on its own partition, time and sbatch options. A time over its
    partition's limit (sinfo), the runs' or that job's, is one line naming the key before anything is submitted,
    also on a cluster that would take the job and leave it pending for ever."""
    text = LADDER_PLAN.replace('partition = "cpu"', 'partition = "short"\ntimeout_min = 5')
    driver = '[launcher.driver]\npartition = "long"\ntimeout_min = 20\nsbatch = {comment = "driver"}\n'
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, text + driver,
                                       FAKE_SLURM_PARTITIONS="short:10,long:120")
    cli.main(argv)
    after = submissions(state)[1]["options"]
    assert (after["partition"], after["time"], after["comment"]) == ("long", "20", "driver")
    for plan_text, said in (
            (text + "[launcher.driver]\ntimeout_min = 30\n", "[launcher.driver] timeout_min = 30 is over partition "
                                                              "short's time limit of 10 minutes (sinfo): set it to at "
                                                              "most 10; nothing was submitted"),
            (text.replace("timeout_min = 5", "timeout_min = 30"), "[launcher] timeout_min = 30 is over partition "
                                                                  "short's time limit of 10 minutes")):
        (tmp_path / "plan.toml").write_text(plan_text)
        with pytest.raises(SystemExit, match=re.escape(f"error: {said}")):
            cli.main([*argv[:-1], str(tmp_path / "s2")])
        assert len(submissions(state)) == 2 and not (tmp_path / "s2").exists()


@pytest.mark.long
def test_a_ladder_submitted_once_reaches_its_report(tmp_path, monkeypatch):
    """Every job runs (the stand-in SLURM, one task after another): the grid, then the job after it, which picks
    each arm's lr from the finished grid and submits size b at it; the command again writes the ladder's report."""
    monkeypatch.setattr(ladder_report, "plot_scaling", lambda *a, **k: None)
    monkeypatch.setattr(ladder_report, "plot_lr_grid", lambda *a, **k: None)
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, LADDER_PLAN, run="all")
    argv.append("--allow-edge-lr")  # the job after the grid runs size b at the grid's edge (its 2 lrs tie: 1e-3)
    cli.main(argv)
    out = tmp_path / "s"
    deadline = time.time() + 120
    while not all(finished(out / f"{act}_b_lr0.001_seed1") for act in ("gelu", "relu")):
        assert launchers.read_job(out, launchers.AFTER_GRID).get("state") != "failed"
        assert time.time() < deadline, (state / "runner.err").read_text()
        time.sleep(0.1)
    assert launchers.read_job(out, launchers.AFTER_GRID)["best"] == {"gelu": 1e-3, "relu": 1e-3}
    assert submissions(state)[2]["options"]["array"] == "0-1%2"  # size b: both arms at their lr, from the job
    assert submissions(state)[2]["slurm_env"] == []  # submitted without the job's own SLURM_* settings
    cli.main(argv)
    assert (out / "sweep.md").is_file() and len(submissions(state)) == 3


def test_rerun_refuted_on_slurm_is_a_job_after_the_sizes_and_the_audit_that_submits_the_reruns(tmp_path, monkeypatch,
                                                                                                capsys):
    """rerun_refuted = true under SLURM, in the one submission: once the grid has finished, the job after it (here its
    function, in this process) submits the sizes' and the audit's array and a job after that (afterany) which reads
    the audit; its function, once the audit has ended with relu's optimum at b 3x its lr there, submits relu's re-runs
    at b at the audited optimum (an array of its 2 seeds), and nothing for gelu, whose lr the audit puts within the
    tolerance."""
    from test_ladder import BEST, ladder_run

    text = ('lrs = [1e-3, 2e-3, 4e-3, 8e-3]\nlr_size = "a"\nlr_seeds = [7]\nrerun_refuted = true\n'
            + PLAN.replace("n_layer = 2\nn_embd = 32\nn_head = 2\nmax_steps = 4", "n_layer = 2\nn_embd = 32\n"
                           "n_head = 2\nmax_steps = 8") + '[launcher]\nkind = "slurm"\npartition = "cpu"\n')
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, text)
    _, ladder = cli.parse_args(argv)
    out, bests = tmp_path / "s", {("gelu", 1): 2e-3, ("gelu", 2): 2.6e-3, ("relu", 1): 4e-3, ("relu", 2): 1.2e-2}

    def finished_run(size, act, lr, seed):
        n_layer = 1 if size == "a" else 2
        loss = 4.0 + math.log(lr / bests[(act, n_layer)]) ** 2 + seed / 100
        ladder_run(plan.run_dir(out, act, seed, size, lr), act, (n_layer, 32, 2), lr, seed, loss, 1000 * n_layer)

    for act in ("gelu", "relu"):
        for lr in (1e-3, 2e-3, 4e-3, 8e-3):
            finished_run("a", act, lr, 7)
    schedule.AfterGrid(ladder, out, [], ["a", "b"])()  # what the command runs here once the grid has finished
    sizes, after = submissions(state)
    assert sizes["options"]["array"] == "0-15%16"  # 2 arms x 2 sizes x 2 seeds, and the audit's 2 x 4 lrs
    assert after["options"]["dependency"] == "afterany:1000" and "array" not in after["options"]
    assert launchers.read_job(out, "after_audit.json") == {"job_id": "1001", "state": "submitted"}
    assert "job 1001: once the sizes' and the audit's jobs end, re-runs each arm" in capsys.readouterr().out
    lrs = {act: {"a": BEST[act], "b": BEST[act]} for act in ("gelu", "relu")}
    for act in ("gelu", "relu"):
        for lr in lr_grid.audit_lrs(BEST[act], ladder.ladder.lrs):
            finished_run("b", act, lr, 7)
    assert schedule.AfterAudit(ladder, out, [], lrs)() and submissions(state)[2]["options"]["array"] == "0-1%2"
    assert [launchers.read_job(plan.run_dir(out, "relu", seed, "b", 1.2e-2))["job_id"] for seed in (1, 2)] == \
        ["1002_0", "1002_1"]
    assert launchers.read_job(out, "after_audit.json")["reruns"] == {"relu": {"b": 1.2e-2}}


@pytest.mark.parametrize("change, extra, message", [
    (("n_head = 2\nmax_steps = 4\n[sizes.b]", "n_head = 3\nmax_steps = 4\n[sizes.b]"), [],
     "variant gelu size a: n_head 3 does not divide n_embd 32: change n_head (or the width) in the plan"),
    (('act = "relu"', 'act = "relu"\ndata_dir = "d"'), ["--data-dir", "e"],
     "--data-dir on the command line would override variant relu's own; set it in one place"),
    (('act = "relu"', 'act = "relu"\nwarmup = 3'), [],
     "variant relu size a: unknown config key 'warmup' in the plan (did you mean warmup_steps?)")])
def test_a_plan_that_cannot_run_is_one_line_before_anything_is_submitted(tmp_path, monkeypatch, capsys, change,
                                                                         extra, message):
    """One line naming the plan file, the variant and the size, under the command's own name: no argparse usage
    (the command line was right), a key of the plan not said to be on the command line."""
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, LADDER_PLAN.replace(*change))
    with pytest.raises(SystemExit):
        cli.main(argv + extra)
    assert capsys.readouterr().err == f"error: --plan {tmp_path / 'plan.toml'}: {message}\n"
    assert not (state / "submissions.jsonl").exists() and not (tmp_path / "s").exists()


def test_a_cpu_config_asks_for_no_gpu_and_a_gpu_config_for_one_per_process():
    _, cpu = cli.parse_args(["--plan", "configs/ladder_cpu.toml", "--out-dir", "x", "--launcher", "slurm"])
    _, gpu = cli.parse_args(["--plan", "configs/ladder_gpu.toml", "--out-dir", "x", "--nproc-per-node", "8"])
    assert "--gpus-per-node" not in " ".join(launchers.slurm.script_lines(
        launchers.slurm.sbatch_parameters(cpu.resources, cpu.nproc_per_node), "x", 2))
    assert "#SBATCH --gpus-per-node=8" in launchers.slurm.script_lines(
        launchers.slurm.sbatch_parameters(gpu.resources, gpu.nproc_per_node), "x", 2)


def test_a_job_counts_the_requeues_slurm_made_and_a_new_job_of_the_run_adds_to_them(tmp_path, monkeypatch):
    """SLURM_RESTART_COUNT (every requeue: submitit's, `scontrol requeue`, preemption) beside the job's own count,
    which a requeue from outside never saw; the time limit past max_num_timeout (submitit calls checkpoint() and then
    does not requeue) is no requeue; the run submitted again keeps its count and its new job adds SLURM's."""
    slurm_env = dict(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="77", SLURM_JOB_NODELIST="n1", SLURM_NODEID="0",
                     SLURM_PROCID="0", SLURM_JOB_NUM_NODES="1", SLURM_NTASKS="1", SLURM_RESTART_COUNT="3")
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    run = launchers.RunCommand(tmp_path, ["-c", "pass"], "x")
    job = launchers.TrainerJob(run, nproc_per_node=1)
    job.requeues = 1  # submitit's own requeue once, then two by SLURM alone
    job()
    assert (launchers.read_job(tmp_path)["state"], launchers.read_job(tmp_path)["requeues"]) == ("ended", 3)
    job.checkpoint()
    assert launchers.read_job(tmp_path)["requeues"] == 3

    for key in slurm_env:  # on the login node: the run submitted again
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", f"{fake_slurm.install(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(tmp_path))
    launchers.Slurm(launchers.Resources(kind="slurm"), 1, tmp_path / "submitit").launch([run])
    assert (launchers.read_job(tmp_path)["job_id"], launchers.read_job(tmp_path)["requeues"]) == ("1000", 3)
    for key, value in {**slurm_env, "SLURM_JOB_ID": "1000", "SLURM_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(key, value)
    launchers.TrainerJob(run, nproc_per_node=1)()  # the new job, requeued once by SLURM
    assert launchers.read_job(tmp_path)["requeues"] == 4


def test_status_counts_slurms_requeues_names_the_timeout_cap_and_shows_cancelled_as_stopped(tmp_path, monkeypatch):
    """sacct (the stand-in prints Slurm's states) with each run's job.json and its submitit log: a preempted run
    queued again and one requeued by `scontrol requeue` count that requeue; one whose time limit came once more than
    max_num_timeout allows is stopped with the cap named; a cancelled one is stopped; a long note keeps its start."""
    argv, state = submit_to_fake_slurm(tmp_path, monkeypatch, PLAN)
    out, folder = tmp_path / "s", tmp_path / "s" / "submitit"
    folder.mkdir(parents=True)
    error = ["error: " + "x" * 300]
    for name, task, sacct, record in (
            ("gelu_seed1", "1000_0", "PENDING", {"state": "stopped", "requeues": 0}),
            ("relu_seed1", "1000_1", "REQUEUED", {"state": "running", "requeues": 1}),
            ("gelu_seed2", "1000_2", "FAILED", {"state": "requeued", "requeues": 2}),
            ("relu_seed2", "1000_3", "CANCELLED by 1000", {"state": "stopped", "requeues": 0}),
            ("gelu_seed3", "1000_4", "FAILED", {"state": "failed", "requeues": 0, "error": error})):
        fake_run(out / name, name.split("_")[0], int(name[-1]), 3.0, stop_at=2)
        launchers.write_job(out / name, launcher="slurm", job_id=task, folder=str(folder), **record)
        (state / f"task_{task}.json").write_text(json.dumps({"state": sacct, "reason": "BeginTime"}))
    # what submitit writes at 3 time limits under max_num_timeout 2: each warning on stdout and stderr, one file
    (folder / "1000_2_0_log.out").write_text(fake_slurm.submitit_log("1000_2", "n1", 3, 2))
    rows = {row[0]: (row[1], row[3], row[5]) for row in status_rows(out)}
    assert rows["gelu_seed1"] == ("requeued", 1, "squeue: BeginTime") and rows["relu_seed1"][:2] == ("requeued", 2)
    assert rows["gelu_seed2"] == ("stopped", 2, "time limit reached 3 times (max_num_timeout 2) at step 2 of 10: "
                                                "about 11 more at this pace; set max_num_timeout = 11 or raise "
                                                "timeout_min in [launcher], then rerun the sweep (it resumes)")
    assert rows["relu_seed2"][:2] == ("stopped", 0) and rows["relu_seed2"][2].startswith("cancelled")
    assert rows["gelu_seed3"][0] == "failed" and rows["gelu_seed3"][2] == error[0][:197] + "..."
