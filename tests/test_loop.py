"""The trainer contract (training/loop.py): a new trainer writes build, learning_rate, forward_backward and
evaluate, and gets the rest: logs, checkpoints, exact resume, the closing line. The one below is the whole of
such a trainer, a linear regression, in about 40 lines."""
import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import compare
from errors import CheckpointError, DataError
from training.checkpoint import load_checkpoint
from training.config import EvalConfig, RunConfig, run_cli
from training.loop import Evaluation, Parts, Trainer

TRUE_WEIGHTS = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


class Batches:
    """y = x w + noise, the i-th batch a pure function of (seed, i): its position is its whole state."""

    def __init__(self, seed):
        self.seed, self.pos = seed, 0

    def next_batch(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.pos)
        self.pos += 1
        x = torch.randn(16, 4, generator=gen)
        return x, x @ TRUE_WEIGHTS + 0.1 * torch.randn(16, 1, generator=gen)

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


class LinearTrainer(Trainer):
    kind = "linear"

    def build(self, ctx, ckpt):
        self.ctx, self.batches = ctx, Batches(self.cfg.run.seed)
        self.model = torch.nn.Linear(4, 1)
        self.val_x, self.val_y = Batches(seed=0).next_batch()
        return Parts(model=self.model, optimizer=torch.optim.AdamW(self.model.parameters()), loader=self.batches,
                     max_steps=self.cfg.optim.max_steps, model_config={"in": 4, "out": 1}, mlp_shape=(16, 4),
                     description="linear regression, 5 parameters")

    def learning_rate(self, step):
        return self.cfg.optim.lr

    def forward_backward(self, model, seed_micro_batch):
        x, y = self.batches.next_batch()
        with self.ctx.autocast:
            loss = F.mse_loss(model(x), y)
        self.ctx.scaler.scale(loss).backward()
        return loss, len(x)

    @torch.no_grad()
    def evaluate(self, step, last, model):
        val = F.mse_loss(model(self.val_x), self.val_y).item()
        return Evaluation({"val_loss": val}, f"val loss {val:.4f}", {"val": val})


@dataclass
class Optim:
    lr: float = 0.05
    grad_clip: float = 1.0
    max_steps: int = 60


@dataclass
class LinearConfig:
    optim: Optim = field(default_factory=Optim)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(eval_interval=20))
    run: RunConfig = field(default_factory=RunConfig)


def config(out_dir, **run):
    return LinearConfig(run=RunConfig(**{"out_dir": str(out_dir), "device": "cpu", "checkpoint_interval": 20,
                                         "log_interval": 10, **run}))


def test_a_new_trainer_needs_only_its_own_hooks(tmp_path, capsys):
    trainer = LinearTrainer(config(tmp_path))
    model = trainer.fit()
    assert torch.allclose(model.weight.detach().T, TRUE_WEIGHTS, atol=0.5)  # it learned
    out = capsys.readouterr().out
    assert "linear regression, 5 parameters | 60 steps | world 1 | float32 | compile False | starting from scratch" in out
    assert "step     0/60 | val loss" in out and "step    50/60 | loss" in out and out.strip().splitlines()[-1].startswith(
        "done: steps 0-60")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 20, 40, 60] and evals[-1]["val_loss"] < evals[0]["val_loss"] / 100
    assert sum(r["kind"] == "train" for r in records) == 60 and records[-1]["tokens"] == 60 * 16
    assert "60 val " in (tmp_path / "log.txt").read_text()
    ckpt = load_checkpoint(tmp_path, kind="linear")
    assert ckpt["step"] == 60 and ckpt["loader"] == [{"pos": 60}] and ckpt["model_config"] == {"in": 4, "out": 1}
    # the base class sets nothing a trainer could come to depend on: only its config and the collective's label
    assert set(vars(trainer)) - {"ctx", "batches", "model", "val_x", "val_y"} == {"cfg", "waiting"}


def test_intervals_of_zero_evaluate_and_save_only_at_the_end(tmp_path):
    cfg = config(tmp_path, checkpoint_interval=0, log_interval=0)
    cfg.eval.eval_interval = 0
    LinearTrainer(cfg).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [60]
    assert [p.name for p in tmp_path.glob("model_*.pt")] == ["model_00060.pt"]


def test_resume_of_the_new_trainer_is_exact(tmp_path):
    straight = LinearTrainer(config(tmp_path / "straight")).fit()
    LinearTrainer(config(tmp_path / "resumed")).fit()
    for step in (40, 60):  # as if it had been killed before step 40's checkpoint
        for name in (f"model_{step:05d}.pt", f"model_{step:05d}.pt.sha256"):
            (tmp_path / "resumed" / name).unlink()
    resumed = LinearTrainer(config(tmp_path / "resumed", resume=True)).fit()
    assert torch.equal(resumed.weight, straight.weight) and torch.equal(resumed.bias, straight.bias)
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and len(steps) == 60 + 4  # no step logged twice
    segments = json.loads((tmp_path / "resumed" / "run.json").read_text())["segments"]  # each start's environment
    assert [s["start_step"] for s in segments] == [0, 20] and segments[1]["environment"]["grad_accum"] == 1


# A new in-loop evaluation as docs/training.md describes it: one file ...
TOY_EVALUATION = '''"""A toy in-loop evaluation: the norm of the model's weights, lower is better."""
import torch

from training.in_loop import InLoopEvaluation, Metric

NORM = Metric("toy_weight_norm", "weight norm", "norm", fmt=".3f", higher_is_better=False)


class WeightNorm(InLoopEvaluation):
    name = "weight norm"
    metrics = (NORM,)

    def due(self, step, last):
        return step % 40 == 0 or last

    @torch.no_grad()
    def run(self, step, last, model):
        norm = torch.cat([p.flatten() for p in model.parameters()]).norm().item()
        return {NORM.name: norm}, f" | weight norm {norm:.3f}"
'''


def test_a_new_in_loop_evaluation_is_one_file_and_one_line(tmp_path, monkeypatch, capsys):
    """Its metric, named in its file only, reaches the stdout line, log.txt, metrics.jsonl, run.json and
    analysis.compare's table and figure: no reader knows its name."""
    (tmp_path / "toy_evaluation.py").write_text(TOY_EVALUATION)
    monkeypatch.syspath_prepend(tmp_path)
    from toy_evaluation import WeightNorm

    monkeypatch.setattr(LinearTrainer, "in_loop", (*LinearTrainer.in_loop, WeightNorm))  # ... and one line
    LinearTrainer(config(tmp_path / "run")).fit()
    printed = re.findall(r"step +(\d+)/60 \| val loss [\d.]+ \| weight norm (\d\.\d{3})\n", capsys.readouterr().out)
    assert [int(step) for step, _ in printed] == [0, 40, 60]  # when it is due, beside the val loss
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    norms = [(r["step"], r["toy_weight_norm"]) for r in records if "toy_weight_norm" in r]
    assert [(step, f"{norm:.3f}") for step, norm in norms] == [(int(step), norm) for step, norm in printed]
    logged = [line.split() for line in (tmp_path / "run" / "log.txt").read_text().splitlines()]
    assert [(int(step), float(value)) for step, kind, value in logged if kind == "toy_weight_norm"] == [
        (step, pytest.approx(norm, abs=1e-6)) for step, norm in norms]
    compare.main([str(tmp_path / "run"), "-o", str(tmp_path / "compare.png")])
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    # the last and the best, which is the lowest: the file says lower is better
    assert cells["weight norm (best)"] == f"{norms[-1][1]:.3f} ({min(n for _, n in norms):.3f})"
    assert (tmp_path / "compare.png").stat().st_size > 10_000


class EvaluationFails(LinearTrainer):
    """Its evaluation at step 20 switches the model to eval mode, then runs out of memory."""

    def evaluate(self, step, last, model):
        if step == 20:
            model.eval()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().evaluate(step, last, model)

    def forward_backward(self, model, seed_micro_batch):
        assert model.training, "a step trained in eval mode"
        return super().forward_backward(model, seed_micro_batch)


def test_a_failed_evaluation_costs_no_training(tmp_path, capsys):
    """The failure is logged with its traceback, the step's checkpoint written (none was due: interval 0), and
    the run goes on to the weights of a run whose evaluations never failed."""
    runs = {name: config(tmp_path / name, checkpoint_interval=0) for name in ("straight", "failed")}
    for cfg in runs.values():
        cfg.optim.max_steps = 40
    straight, failed = LinearTrainer(runs["straight"]).fit(), EvaluationFails(runs["failed"]).fit()
    assert torch.equal(failed.weight, straight.weight) and torch.equal(failed.bias, straight.bias)
    out = capsys.readouterr()
    assert "step    20/40 | evaluation failed (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 " \
           "GiB); the run goes on" in out.out and 'in evaluate\n    raise torch.OutOfMemoryError' in out.err
    assert [p.name for p in sorted((tmp_path / "failed").glob("model_*.pt"))] == ["model_00020.pt", "model_00040.pt"]
    records = [json.loads(line) for line in (tmp_path / "failed" / "metrics.jsonl").read_text().splitlines()]
    failure, = [r for r in records if r.get("evaluation") == "failed"]
    assert failure["step"] == 20 and failure["kind"] == "eval" and failure["error"].startswith("torch.OutOfMemory")
    assert failure["traceback"].startswith("Traceback (most recent call last):")
    assert "in evaluate" in failure["traceback"] and failure["part"] == "evaluation"
    saved = load_checkpoint(tmp_path / "failed" / "model_00020.pt", kind="linear")
    assert saved["loader"] == [{"pos": 20}] and saved["val_loss"] is None
    assert [r["step"] for r in records if "val_loss" in r] == [0, 40]
    assert "20 eval_failed 1.000000\n" in (tmp_path / "failed" / "log.txt").read_text()


class FailingTrainer(LinearTrainer):
    """Fails in its first forward_backward: a bug of its own (numpy's ValueError for shapes that do not
    broadcast), or bad input it reports as the project does."""

    def forward_backward(self, model, seed_micro_batch):
        if self.cfg.run.seed == 1:
            raise DataError("batches.bin: truncated at batch 0; prepare it again")
        return np.ones(3) + np.ones(4)


def test_only_the_projects_own_errors_end_in_one_line(tmp_path):
    """run_cli, the command line of both trainers: a project error is `error: ...` and nothing else; any other
    exception raised inside training, even a ValueError, keeps its traceback down to where it was raised."""
    def main(seed):
        argv = ["--out-dir", str(tmp_path / str(seed)), "--device", "cpu", "--seed", str(seed)]
        return run_cli("a trainer", LinearConfig, argv, lambda cfg: FailingTrainer(cfg).fit())

    with pytest.raises(SystemExit) as ours:
        main(seed=1)
    assert ours.value.code == "error: batches.bin: truncated at batch 0; prepare it again"
    with pytest.raises(ValueError, match="could not be broadcast together") as foreign:
        main(seed=2)
    assert not isinstance(foreign.value, SystemExit) and foreign.traceback[-1].name == "forward_backward"


def test_the_file_the_closing_line_names_holds_the_numbers_it_prints(tmp_path, capsys):
    """The last checkpoint is written after the final evaluation: its val_loss is the final one, not the one
    eval_interval steps earlier."""
    LinearTrainer(config(tmp_path)).fit()
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    printed_val = float(re.search(r"final val loss (\S+)", closing).group(1))
    ckpt = load_checkpoint(tmp_path / re.search(r"(model_\d+\.pt)$", closing).group(1), kind="linear")
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert ckpt["step"] == evals[-1]["step"] == 60 and ckpt["val_loss"] == evals[-1]["val_loss"]
    assert f"{ckpt['val_loss']:.4f}" == f"{printed_val:.4f}" and ckpt["val_loss"] != evals[-2]["val_loss"]


def stopped_at(out_dir, step):
    """As if the run had been killed before the checkpoints after `step`."""
    for path in out_dir.glob("model_*.pt*"):
        if int(path.name[6:11]) > step:
            path.unlink()


def test_a_resume_that_changes_the_result_is_refused_unless_named(tmp_path, capsys):
    """A resume is the same run: another lr is refused in one line naming it, old -> new; named with
    --resume-changes it proceeds, printed, in metrics.jsonl at its step, in run.json and in the later checkpoints.
    Options that change no weight (intervals, logging) may differ without it."""
    LinearTrainer(config(tmp_path)).fit()
    stopped_at(tmp_path, 20)
    changed = config(tmp_path, resume=True, log_interval=5, checkpoint_interval=10)
    changed.optim.lr = 0.02
    with pytest.raises(CheckpointError) as refused:
        LinearTrainer(changed).fit()
    assert "(optim.lr 0.05 -> 0.02)" in str(refused.value) and "--resume-changes lr " in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1

    changed.run.resume_changes = "lr"
    LinearTrainer(changed).fit()
    assert "changed from step 20 on (--resume-changes): optim.lr 0.05 -> 0.02" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    resume, = [r for r in records if r["kind"] == "resume"]
    assert resume["step"] == 20 and resume["changes"] == {"optim.lr": {"from": 0.05, "to": 0.02}}
    assert {r["lr"] for r in records if r["kind"] == "train" and r["step"] >= 20} == {0.02}
    history = [{"step": 20, "changes": {"optim.lr": {"from": 0.05, "to": 0.02}}}]
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert run_json["environment"]["decisions"]["config_changes"] == history
    assert load_checkpoint(tmp_path, kind="linear")["config_changes"] == history


class UpAfter30(LinearTrainer):
    """Descends until step 30, then ascends the loss: the run's best evaluation comes before its end."""

    def learning_rate(self, step):
        return self.cfg.optim.lr if step < 30 else -self.cfg.optim.lr


def test_the_best_val_loss_after_a_resume_is_the_whole_runs(tmp_path, capsys):
    UpAfter30(config(tmp_path / "straight", log_interval=100)).fit()
    evals = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    best = min(evals, key=lambda r: r["val_loss"])
    assert best["step"] < 40  # before the resume below: its evaluation is not repeated after it
    UpAfter30(config(tmp_path / "resumed")).fit()
    stopped_at(tmp_path / "resumed", 40)
    capsys.readouterr()
    UpAfter30(config(tmp_path / "resumed", resume=True, log_interval=100)).fit()
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"(best {best['val_loss']:.4f} at step {best['step']})" in closing, closing
    assert load_checkpoint(tmp_path / "resumed", kind="linear")["best_val"] == (best["val_loss"], best["step"])
