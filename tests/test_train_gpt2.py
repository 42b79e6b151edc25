"""The GPT-2 trainer end to end on CPU: learning, DDP == grad accumulation, kill -9 + resume == uninterrupted,
and the clear errors users hit first."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from eval import hellaswag_items
from model import GPT, GPTConfig
from training.checkpoint import list_checkpoints
from two_rank_runs import GPT_RUNS, NOISE_RESUMED

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64


def write_corpus(directory, n_train_shards=2, tokens=6000, seed=0):
    """A learnable synthetic corpus: noisy repetitions of a few fixed token phrases."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, VOCAB, size=rng.integers(4, 9)) for _ in range(6)]
    directory.mkdir(parents=True, exist_ok=True)
    for idx in range(n_train_shards + 1):
        parts, n = [], 0
        while n < tokens:
            p = phrases[rng.integers(len(phrases))]
            parts += [np.array([0]), p]
            n += len(p) + 1
        split = "val" if idx == 0 else "train"
        np.save(directory / f"synth_{split}_{idx:06d}.npy", np.concatenate(parts)[:tokens].astype(np.uint16))
    return directory


def args(data_dir, out_dir, **overrides):
    base = dict(data_dir=data_dir, out_dir=out_dir, vocab_size=VOCAB, block_size=16, n_layer=2, n_head=2, n_embd=32,
                batch_size=4, seq_len=16, total_batch_size=128, max_steps=8, warmup_steps=2, max_lr=3e-3,
                min_lr=3e-4, eval_interval=4, val_tokens=128, checkpoint_interval=4, device="cpu", compile="false")
    base.update(overrides)
    return [item for k, v in base.items() for item in (f"--{k.replace('_', '-')}", str(v))]


def run_trainer(argv, nproc=1, check=True, background_log=None, script=ROOT / "train_gpt2.py", env=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    if nproc == 1:
        cmd = [sys.executable, str(script), *argv]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(script), *argv]
    if background_log:  # a file, not a pipe: a pipe nobody reads would block the trainer once full
        with open(background_log, "w") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def train_in_process(argv):
    """train_gpt2.train in this process (a subprocess costs a torch import: seconds on a busy machine)."""
    import train_gpt2
    from training.config import load_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 in run_trainer: the same kernels, bit-equal results
    try:
        return train_gpt2.train(load_config(train_gpt2.TrainConfig, argv))
    finally:
        torch.set_num_threads(threads)


def cli_error(argv):
    """The one-line error `python train_gpt2.py ARGV` ends with, from train_gpt2.main in this process."""
    import train_gpt2

    with pytest.raises(SystemExit) as e:
        train_gpt2.main(argv)
    assert isinstance(e.value.code, str), "main() exited without an error message"
    return e.value.code


def train_losses(out_dir):
    rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"], [r["val_loss"] for r in rows if r["kind"] == "eval"]


def final_weights(out_dir, step=8):
    return torch.load(Path(out_dir) / f"model_{step:05d}.pt", weights_only=True)["model"]


def test_tiny_model_learns_in_process(tmp_path):
    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "out", max_steps=40, eval_interval=20, act="aglu"))
    train, val = train_losses(tmp_path / "out")
    assert len(train) == 40 and len(val) == 3
    assert val[-1] < val[0] - 1.0, val  # from ~ln(64)=4.16 down: the phrases are learnable
    log_lines = (tmp_path / "out" / "log.txt").read_text().splitlines()
    assert log_lines[0].startswith("0 val ") and sum(" train " in line for line in log_lines) == 40
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["config"]["model"]["act"] == "aglu" and info["environment"]["world_size"] == 1
    assert info["environment"]["grad_accum"] == 2  # 128 tokens a step of 4 x 16-token micro-batches
    assert info["lr"] == info["config"]["optim"]["max_lr"]  # the lr a sweep sets (train_gpt2.OptimConfig.swept_lr)
    # the training compute a ladder reads: model.py's count per token (the one MFU uses) times the tokens seen
    model = GPT(GPTConfig(**info["config"]["model"]), seed=0)
    assert info["environment"]["flops_per_token"] == model.flops_per_token(16)
    evals = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [r["flops"] for r in evals] == [model.flops_per_token(16) * 128 * s for s in (0, 20, 40)]


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
@pytest.mark.parametrize("case", ["plain", "speed-options"])
def test_two_gloo_processes_match_grad_accumulation(tmp_path, two_rank_runs, case):
    train_in_process(args(two_rank_runs / "gpt_data", tmp_path / "single", **GPT_RUNS[case]))  # B=4 x 2 micro-steps
    single, ddp = train_losses(tmp_path / "single"), train_losses(two_rank_runs / case)
    np.testing.assert_allclose(ddp[0], single[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ddp[1], single[1], rtol=1e-5, atol=1e-6)
    a, b = final_weights(tmp_path / "single"), final_weights(two_rank_runs / case)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5)


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
def test_dropout_and_nswish_statistics_do_not_depend_on_how_the_step_is_split(tmp_path, two_rank_runs, capsys):
    """1 process accumulating 2 micro-batches and 2 gloo ranks with 1 each train on the same batches; with dropout
    and NSwish's running statistics (the step's batch, all ranks) they also draw the same masks and normalise
    alike: the same losses and weights, running statistics included, bit for bit. Each micro-batch normalises
    with its own statistics, so the start line says the results depend on the micro-batch size. The 2 ranks' run
    resumed from its step-4 checkpoint (weights, statistics, AdamW's moments, each rank's place in the data) ends
    bit for bit as it did."""
    train_in_process(args(two_rank_runs / "gpt_data", tmp_path / "single", **GPT_RUNS["noise"]))
    start = next(line for line in capsys.readouterr().out.splitlines() if "grad accum 2" in line)
    assert "NSwish/NReLU normalise each of the step's 2 micro-batches with its own statistics" in start
    assert train_losses(tmp_path / "single") == train_losses(two_rank_runs / "noise")
    a, b = final_weights(tmp_path / "single"), final_weights(two_rank_runs / "noise")
    assert a.keys() == b.keys() and "transformer.h.0.mlp.act.running_rho" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    resumed, straight = train_losses(two_rank_runs / NOISE_RESUMED), train_losses(two_rank_runs / "noise")
    assert resumed[0] == straight[0][4:] and resumed[1][-1] == straight[1][-1]
    resumed_weights = final_weights(two_rank_runs / NOISE_RESUMED)
    for key in a:
        assert torch.equal(resumed_weights[key], a[key]), key


@pytest.mark.long
def test_kill_and_resume_equals_uninterrupted(tmp_path, capsys):
    """kill -9 of a trainer process mid-run; the resumed run (in this process: all it may read is the files the
    killed one left) ends where an uninterrupted run does, bit for bit, log included. The killed trainer is a fork of
    this process (train_gpt2.train, as the runs here): a process of its own without a second torch import."""
    data = write_corpus(tmp_path / "data")
    # dropout: the RNG state must resume too; 60 steps so the kill lands mid-run (asserted below)
    extra = dict(act="nswish", dropout=0.1, checkpoint_interval=3, max_steps=60, eval_interval=10)
    train_in_process(args(data, tmp_path / "straight", **extra))
    pid = os.fork()
    if pid == 0:  # the trainer: it never returns to pytest, and ends only by the kill (or _exit if it fails first)
        try:
            train_in_process(args(data, tmp_path / "killed", **extra))
        finally:
            os._exit(1)
    deadline = time.time() + 120
    try:
        while not (tmp_path / "killed" / "model_00003.pt").exists():
            assert os.waitpid(pid, os.WNOHANG) == (0, 0) and time.time() < deadline, \
                "trainer ended before its first checkpoint"
            time.sleep(0.02)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not (tmp_path / "killed" / "model_00060.pt").exists(), "the kill came after the end: nothing was tested"
    capsys.readouterr()
    train_in_process(args(data, tmp_path / "killed", resume="true", **extra))
    assert "resuming" in capsys.readouterr().out
    assert train_losses(tmp_path / "killed") == train_losses(tmp_path / "straight")
    a, b = final_weights(tmp_path / "straight", 60), final_weights(tmp_path / "killed", 60)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    lines = (tmp_path / "killed" / "log.txt").read_text()
    assert lines == (tmp_path / "straight" / "log.txt").read_text()


def test_sp_trains_as_before_parametrizations(tmp_path):
    """The losses the code before `param` existed wrote for this run, bit for bit: sp's forward, optimizer groups and
    lr unchanged."""
    train_in_process(args(write_corpus(tmp_path / "data"), tmp_path / "run", max_steps=3, eval_interval=3,
                          checkpoint_interval=3))
    assert train_losses(tmp_path / "run") == ([4.139982223510742, 4.041175842285156, 3.917701244354248],
                                              [4.159609794616699, 3.8375139236450195])


def test_completep_resume_is_bit_exact(tmp_path, capsys):
    """A completep run (gated MLP, AGLU's scalars, weight decay) resumed from its step-4 checkpoint ends where the
    uninterrupted one does, bit for bit: its own optimizer groups (lr_scale, decay, eps) and their moments."""
    data = write_corpus(tmp_path / "data")
    extra = dict(param="completep", base_width=16, base_depth=1, act="aglu_glu", weight_decay=0.1)
    train_in_process(args(data, tmp_path / "straight", **extra))
    (tmp_path / "resumed").mkdir()
    shutil.copyfile(tmp_path / "straight" / "model_00004.pt", tmp_path / "resumed" / "model_00004.pt")
    capsys.readouterr()
    train_in_process(args(data, tmp_path / "resumed", resume="true", **extra))
    assert "resuming" in capsys.readouterr().out
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    straight, resumed = (train_losses(tmp_path / name)[0] for name in ("straight", "resumed"))
    assert resumed == straight[4:]


@pytest.mark.parametrize("overrides, message", [
    (dict(act="gleu"), "unknown activation 'gleu'; choose one of"),
    (dict(total_batch_size=100), "not divisible by batch_size*seq_len*world_size"),
    (dict(max_lrr=1), "unknown config key 'max_lrr'"),
])
def test_clear_errors(tmp_path, overrides, message):
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=200)
    error = cli_error(args(data, tmp_path / "out", **overrides))
    assert error.startswith("error: ") and message in error and "\n" not in error, error


def test_config_is_checked_before_the_data(tmp_path):
    error = cli_error(args(tmp_path / "no_data", tmp_path / "out", act="gleu"))
    assert "unknown activation 'gleu'" in error, error


def test_resume_needs_a_checkpoint_and_auto_resume_does_not(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    error = cli_error(args(data, tmp_path / "out", resume="true"))
    assert "--resume: no checkpoint" in error and "--auto-resume" in error
    train_in_process(args(data, tmp_path / "out", auto_resume="true", max_steps=4))
    first = capsys.readouterr().out
    assert "starting from scratch" in first and "step     3/4" in first and "eta" in first
    assert "done: steps 0-4" in first and "final val loss" in first
    train_in_process(args(data, tmp_path / "out", auto_resume="true", max_steps=6, resume_changes="max_steps"))
    again = capsys.readouterr().out
    assert "resuming" in again and "model_00004.pt" in again and "done: steps 4-6" in again
    # a run of N steps ends on model_N, N a multiple of --checkpoint-interval (4) or not
    assert [p.name for p in list_checkpoints(tmp_path / "out")] == ["model_00004.pt", "model_00006.pt"]


def test_samples_come_every_sample_interval_steps_between_evaluations(tmp_path, monkeypatch):
    """--sample-interval 3 with --eval-interval 4: samples after steps 3 and 6, and the closing ones at 8."""
    import train_gpt2

    steps = []
    monkeypatch.setattr(train_gpt2.GPTTrainer, "print_samples", lambda self, step: steps.append(step))
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    train_in_process(args(data, tmp_path / "out", max_steps=8, eval_interval=4, sample_interval=3))
    assert steps == [3, 6, 8]


def test_corrupt_shard_and_missing_shards_are_clear_errors(tmp_path):
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=200)
    np.save(data / "synth_train_000001.npy", np.full(200, 60000, dtype=np.uint16))  # ids beyond the vocab
    error = cli_error(args(data, tmp_path / "out"))
    assert error.startswith("error: ") and "synth_train_000001.npy" in error and "\n" not in error
    # once through the real command line: a non-zero exit whose last stderr line is that one-line error
    result = run_trainer(args(tmp_path / "empty", tmp_path / "out"), check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and last.startswith("error: ") and "data/fineweb.py" in last


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from model import GPT

    calls = {"n": 0}
    forward = GPT.forward

    def poisoned(self, idx, targets=None, **kwargs):  # the 11th training forward (step 5, micro-step 0): a NaN loss
        logits, loss = forward(self, idx, targets, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 11:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    data = write_corpus(tmp_path / "data")
    with pytest.raises(SystemExit, match=r"step 5: loss nan .* last good checkpoint: .*model_00004\.pt"):
        train_in_process(args(data, tmp_path / "out", checkpoint_interval=2))
    saved = sorted(p.name for p in (tmp_path / "out").glob("model_*.pt"))
    assert saved == ["model_00002.pt", "model_00004.pt"]
    weights = torch.load(tmp_path / "out" / "model_00004.pt", weights_only=True)["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.long
@pytest.mark.xdist_group("inductor")  # with the other inductor tests: see tests/test_activations.py
def test_compiled_training_keeps_evaluating(tmp_path):
    """build-nanogpt had to switch compile off because evaluation broke it; here eval runs on the compiled model. The
    compiled run takes the chunked LM head + loss (--loss-chunks), so inductor's code for it is checked against the
    plain path's losses too."""
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    # One layer: inductor compiles every kernel with a C++ compiler. Its C++ wrapper puts a graph's kernels in one
    # source file: one compiler run per graph (each run loads torch's precompiled header first, the bulk of its cost)
    # instead of one per kernel. The kernels are the same generated code; only the host code around them is C++.
    small = dict(max_steps=3, eval_interval=1, act="aglu", n_layer=1)
    try:
        with torch._inductor.config.patch(cpp_wrapper=True):
            train_in_process(args(data, tmp_path / "c", compile="true", loss_chunks=2, **small))
    finally:
        torch._dynamo.reset()  # leave no compiled graphs behind for later tests
    train_in_process(args(data, tmp_path / "e", compile="false", **small))
    compiled, eager = train_losses(tmp_path / "c"), train_losses(tmp_path / "e")
    assert len(compiled[1]) == 4  # validation at steps 0, 1, 2 and 3, between compiled training steps
    np.testing.assert_allclose(compiled[0], eager[0], rtol=1e-4)
    np.testing.assert_allclose(compiled[1], eager[1], rtol=1e-4)


def test_hellaswag_runs_in_the_training_loop(tmp_path, hellaswag_file, gpt2_enc, monkeypatch, capsys):
    """HellaSwag and CORE (a tiny bundle, 3 items a task) in the loop: printed, logged and declared."""
    from bench.core_nanochat import write_tiny_bundle

    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    hella = hellaswag_file(8)
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))  # the token cache
    train_in_process(args(data, tmp_path / "out", vocab_size=50304, block_size=128, max_steps=2, eval_interval=2,
                          hellaswag_interval=2, hellaswag_data=hella, act="aglu",
                          core_bundle=write_tiny_bundle(tmp_path / "bundle"), core_max_per_task=3))
    printed = [line for line in capsys.readouterr().out.splitlines() if "| val loss " in line]
    shown = (r"\| hellaswag acc \d\.\d{4} acc_norm \d\.\d{4} bits/byte \d+\.\d{4} \(\d+\.\ds\) "
             r"\| CORE -?\d\.\d{4} bits/byte \d+\.\d{4} \(\d+\.\ds\)$")
    assert len(printed) == 2 and all(re.search(shown, line) for line in printed), printed  # next to the val loss
    # tokens cached once per set of scorings: completion (step 0), both (the final evaluation)
    assert sorted(p.name.split("_all_")[-1] for p in (tmp_path / "cache" / "hellaswag_tokens").iterdir()) == [
        "completion+lm_eval.npz", "completion.npz"]
    lines = (tmp_path / "out" / "log.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines if " hella " in line] == [["0", "hella"], ["2", "hella"]]
    evals = [json.loads(r) for r in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert len(evals) == 2 and all(r["hellaswag_acc"] in {i / 8 for i in range(9)} for r in evals)
    # the final evaluation keeps every item's predictions, both scorings, for paired comparisons
    assert [p.name for p in (tmp_path / "out").glob("hellaswag_items_*")] == ["hellaswag_items_00002.jsonl.gz"]
    items = hellaswag_items.read(tmp_path / "out" / "hellaswag_items_00002.jsonl.gz")
    assert items.about["step"] == 2 and items.about["scorings"] == ["completion", "lm_eval"] and len(items.labels) == 8
    assert hellaswag_items.from_training(items) and items.about["setup"]["compile"] is False
    assert items.about["setup"]["dtype"] == "float32" and items.about["setup"]["kernels"] == {"aglu": "torch"}
    for metric, key in (("acc", "hellaswag_acc"), ("acc_norm", "hellaswag_acc_norm")):
        assert sum(items.correct("completion", metric, range(8))) / 8 == evals[-1][key]
    # the continuous score: declared (name, unit, direction), logged, and the mean of the items file's values
    declared = {m["name"]: m for m in json.loads((tmp_path / "out" / "run.json").read_text())["metrics"]}
    assert declared["hellaswag_bpb"]["unit"] == "bits/byte" and declared["hellaswag_bpb"]["higher_is_better"] is False
    assert evals[-1]["hellaswag_bpb"] == pytest.approx(np.mean(items.values("completion", "bpb", range(8))))
    assert [line.split()[:2] for line in lines if " hellaswag_bpb " in line] == [["0", "hellaswag_bpb"],
                                                                               ["2", "hellaswag_bpb"]]
    # CORE: its two metrics declared and logged at every evaluation, each task's numbers in the record
    assert declared["core_bpb"]["higher_is_better"] is False and declared["core"]["unit"] == "centered acc"
    tasks = evals[-1]["core_tasks"]
    assert sorted(tasks) == ["lm", "mc", "sch"] and all(t["acc"] in {0, 1 / 3, 2 / 3, 1} for t in tasks.values())
    assert evals[-1]["core"] == pytest.approx(np.mean([t["centered"] for t in tasks.values()]))
    assert evals[-1]["core_bpb"] == pytest.approx(np.mean([t["bpb"] for t in tasks.values()]))
    assert [line.split()[:2] for line in lines if " core_bpb " in line] == [["0", "core_bpb"], ["2", "core_bpb"]]


@pytest.mark.parametrize("case", ["offline", "malformed file", "vocabulary"])
def test_hellaswag_is_resolved_before_step_0(tmp_path, hellaswag_file, gpt2_enc, monkeypatch, case):
    """The recipe offline: HellaSwag's download fails, or its file is bad, or the model cannot score GPT-2 tokens;
    the run stops before its first step (no log written, nothing trained) with one line naming the trainer's
    option, not eval/hellaswag.py's --data."""
    from eval import hellaswag

    def offline(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", offline)
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))  # no cached copy either
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=200)
    bad = hellaswag_file(2)
    bad.write_text(bad.read_text() + "{not json\n")
    options, message = {
        "offline": ({}, "offline? pass --hellaswag-data path/to/hellaswag_val.jsonl, fetched where"),
        "malformed file": ({"hellaswag_data": bad}, f"{bad.name}:3: not valid JSON"),
        "vocabulary": ({"hellaswag_data": hellaswag_file(2, name="ok.jsonl")},
                       "the model's vocab_size is 64; train on GPT-2 shards with --vocab-size 50304")}[case]
    error = cli_error(args(data, tmp_path / "out", hellaswag_interval=250, checkpoint_interval=0, max_steps=3,
                           **options))
    assert error.startswith("error: --hellaswag-interval 250: ") and message in error and "\n" not in error, error
    assert " --data " not in error and "--hellaswag-interval 0" in error
    assert not (tmp_path / "out" / "metrics.jsonl").exists() and not (tmp_path / "out" / "log.txt").exists()


def test_the_hellaswag_file_given_passes_the_preflight_and_is_the_one_scored(tmp_path, hellaswag_file, gpt2_enc):
    import train_gpt2
    from training.config import load_config

    hella = hellaswag_file(3)
    trainer = train_gpt2.GPTTrainer(load_config(train_gpt2.TrainConfig, ["--hellaswag-interval", "250",
                                                                         "--hellaswag-data", str(hella)]))
    from eval.hellaswag_in_loop import HellaSwag

    assert HellaSwag in trainer.in_loop
    evaluation = HellaSwag(trainer, ctx=None)
    assert evaluation.inputs() == [evaluation.resolve]
    evaluation.resolve()  # reads the file and loads the tokenizer; downloads nothing
    assert evaluation.path == hella


def test_a_hellaswag_that_fails_mid_run_keeps_the_val_loss_and_the_run(tmp_path, monkeypatch, capsys):
    """HellaSwag's file is damaged after step 0: at step 2 its evaluation raises; the val loss of that step is kept,
    the failure logged with its traceback, model_00002.pt written (none was due), and the run finishes."""
    from errors import DataError
    from eval.hellaswag_in_loop import HellaSwag

    def hellaswag(self, step, last, model):  # its preflight and scoring are tested above: here only its outcome
        if step == 2:
            raise DataError("hellaswag_val.jsonl:1: not valid JSON")
        return {"hellaswag_acc": 0.25}, " | hellaswag acc 0.2500"

    monkeypatch.setattr(HellaSwag, "inputs", lambda self: [])
    monkeypatch.setattr(HellaSwag, "run", hellaswag)
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    train_in_process(args(data, tmp_path / "out", max_steps=3, eval_interval=2, hellaswag_interval=2,
                          checkpoint_interval=0))
    out = capsys.readouterr()
    assert re.search(r"step     2/3 \| val loss \d\.\d{4} \| hellaswag failed\n", out.out), out.out
    assert "step     2/3 | hellaswag failed (errors.DataError: hellaswag_val.jsonl:1: not valid JSON); the run goes " \
           "on" in out.out and "in hellaswag\n" in out.err and "done: steps 0-3" in out.out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "hellaswag_acc" in r) for r in records if "val_loss" in r] == [(0, True), (2, False), (3, True)]
    failure, = [r for r in records if r.get("evaluation") == "failed"]
    assert failure["part"] == "hellaswag" and failure["traceback"].startswith("Traceback")
    assert "2 eval_failed 1.000000" in (tmp_path / "out" / "log.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "out").glob("model_*.pt")) == ["model_00002.pt", "model_00003.pt"]


def test_init_seed_offset_changes_the_init_and_keeps_the_data_order(tmp_path):
    """A sweep's A/A control: torch's RNG from seed + init_seed_offset, the data order from the seed alone."""
    from training.checkpoint import load_checkpoint

    data = write_corpus(tmp_path / "data")
    runs = {"seed1": dict(seed=1), "seed1+7": dict(seed=1, init_seed_offset=7), "seed8": dict(seed=8)}
    for name, options in runs.items():
        train_in_process(args(data, tmp_path / name, max_steps=2, eval_interval=2, checkpoint_interval=2, **options))
    first = {name: (train_losses(tmp_path / name)[0][0], train_losses(tmp_path / name)[1][0]) for name in runs}
    assert first["seed1+7"][1] == first["seed8"][1] != first["seed1"][1]  # step-0 val loss: the init of seed 8
    assert first["seed1+7"][0] != first["seed8"][0]  # same init, other batches: the data order is not seed 8's
    loader = load_checkpoint(tmp_path / "seed1+7" / "model_00002.pt")["loader"][0]
    assert loader == load_checkpoint(tmp_path / "seed1" / "model_00002.pt")["loader"][0] and loader["seed"] == 1
