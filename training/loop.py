"""The training loop both trainers share (train_gpt2.py, train_translation.py), and the contract between them.

A trainer subclasses Trainer and writes only what is its own (docs/training.md, "Another trainer"):

    build(ctx, ckpt) -> Parts        model, optimizer, data, steps; ctx (a Context) is what fit decided first
    learning_rate(step) -> float
    forward_backward(model, seed_micro_batch) -> (mean loss tensor, tokens)   one step's passes on this rank
    evaluate(step, last, model) -> Evaluation               its evaluations, on the model evaluations run
    optional: inputs() -> checks, step_fields(tok_per_s), after_step(step), checkpoint_state(evaluation),
              finish(step) -> closing record or None
    in_loop = (InLoopEvaluation classes, ...)   evaluations beside evaluate's, one file each (training/in_loop.py)

A hook gets what it needs as arguments, or from what the trainer kept in build: the base class keeps no attribute
a trainer reads. fit() runs: context (process group, seed, precision, compile decision), the checkpoint to resume,
build, resume, the in-loop evaluations, the preflight (training/preflight.py), the activation kernels' decision
(activations/policy.py), the run log, compile and DDP (or the trainer's FSDP sharding: training/fsdp.py), the
loop, finish_run. Each step: the evaluations due (every eval_interval steps and at the end), the train step
(forward_backward, activations.step_statistics, clipping, the optimizer), log, after_step, checkpoint, stop. The last checkpoint follows the final evaluation, so the file the
closing line names holds the numbers it prints. An evaluation that raises is logged with its traceback, that
step's checkpoint written, and the run goes on (`outcome`, `Evaluation.attempt`).

SIGTERM/SIGINT finish the current step, save, and exit with 128 + the signal number, so a scheduler sees a
preempted job as unfinished; a NaN/inf loss stops before it reaches the weights. A collective that waits past
--dist-timeout, or whose peer died, ends the rank with one line naming the step and what it waited for
(`Trainer.waiting`); under torchrun --max-restarts the next attempt resumes the newest checkpoint that verifies.
"""
import contextlib
import gc
import inspect
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from activations import policy, step_statistics
from activations.impl import model_identity
from training import distributed, fsdp, hardware, preflight, runlog
from training.checkpoint import (CheckpointError, declares_world_size, latest_checkpoint, newest_good_checkpoint,
                                 resumed_changes, resume_training, save_training_checkpoint)
from training.config import ConfigError, learning_rate, to_dict
from training.optimizer import set_lr
from training.precision import PRECISIONS, autocast_context, grad_scaler
from training.runlog import RunLog, environment
from training.stop import GracefulStop

# DDP's "no buffer broadcast before forwards": torch 2.13 renamed broadcast_buffers (its old name warns there) to
# forward_sync_buffers, which torch 2.11 and 2.12 lack; the old name's False also skips the buffers' broadcast at
# DDP's start, the same here: every rank starts them from the same seed or checkpoint
NO_BUFFER_SYNC = {"forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
                  else "broadcast_buffers": False}


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")


@dataclass
class Context:
    """What fit() decides before a trainer builds anything, passed to build()."""
    dist: distributed.Dist  # rank, world size, device
    precision: str  # float32, bfloat16 or float16
    autocast: object  # the context every forward pass runs under
    scaler: torch.amp.GradScaler  # scales float16 losses; a no-op otherwise
    compile: bool  # whether fit() will torch.compile the model (e.g. pad batches to few shapes)


@dataclass
class Parts:
    """What build() returns: everything the loop trains, checkpoints and announces."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: object  # training batches; state_dict/load_state_dict, so a resume continues the data order
    max_steps: int
    model_config: dict  # stored in checkpoints: a resume with another one (impl aside, a speed option) is refused
    mlp_shape: tuple  # (rows, width) of the activation's input per micro-batch: where kernels are timed
    description: str  # the trainer's part of the first stdout line (model size, data)
    origin: str = "starting from scratch"  # or which weights the model was initialised from
    batch_shapes: int | None = 1  # distinct batch shapes, each compiled once; None: free (compiled dynamic)
    params: dict = field(default_factory=dict)  # parameter counts (the model's param_counts()), for run.json
    accum: int = 1  # micro-batches each rank accumulates per optimizer step, for run.json
    # training FLOPs per token (GPT: model.py's flops_per_token, the count MFU uses), for run.json and the eval
    # records' cumulative `flops`, so that a compute ladder (analysis/ladder_report.py) reads compute from any run;
    # None where the trainer has no FLOP count
    flops_per_token: int | None = None


@dataclass
class Evaluation:
    """What evaluate() returns: a metrics.jsonl record, the stdout text after `step N/M |`, log.txt's scalars."""
    fields: dict
    text: str
    scalars: dict = field(default_factory=dict)  # kind -> value, e.g. {"val": 3.28, "hella": 0.29}
    failed: dict = field(default_factory=dict)  # part -> traceback of the parts that raised (attempt)

    def attempt(self, part, evaluation, d):
        """Add evaluation()'s Evaluation to this one, or, when it raised on any rank, its traceback to `failed`:
        a part that fails (HellaSwag) leaves the others (the val loss) recorded. Every rank calls it."""
        done, failure = outcome(evaluation, d)
        if failure is not None:
            self.failed[part] = failure
            self.text += f" | {part} failed"
            return
        self.fields.update(done.fields)
        self.scalars.update(done.scalars)
        self.text += done.text
        self.failed.update(done.failed)


def outcome(work, d):
    """(work()'s result, None), or on every rank (one gather) (None, the traceback of the lowest rank where it
    raised): an evaluation's failure (a bad file, a full disk, an OOM) is recorded, never the end of the run. A lost
    or stalled peer is re-raised: fit() ends the rank with its one line."""
    try:
        result, failure = work(), None
    except Exception as e:
        if d.ddp and distributed.collective_failure(e):
            raise
        result, failure = None, "".join(traceback.format_exception(e))
    failures = [f for f in distributed.gather_objects(failure, d) if f]
    return (result, None) if not failures else (None, failures[0])


@dataclass
class FitState:
    """The state of one fit(), created there and passed to each step of the loop."""
    ctx: Context
    parts: Parts
    log: RunLog
    eval_model: torch.nn.Module  # what evaluations run: the model, compiled when the run compiles
    train_model: torch.nn.Module  # what the steps run: the same, in DDP when there are several ranks
    step: int
    tokens: int
    in_loop: list  # the trainer's in-loop evaluations (training/in_loop.py), built for this run
    evals: list = field(default_factory=list)  # every Evaluation's fields, in order
    started: float = field(default_factory=time.time)
    first_step_done: tuple | None = None  # (time, step) after the first, compiling, step: the ETA's origin
    kernels: dict = field(default_factory=dict)  # the activation kernel decisions, kept in checkpoints for a resume
    # what the closing line and wandb's summary report, and checkpoints keep: over the whole run, resumes included
    best_val: tuple | None = None  # (lowest val loss, its step)
    config_changes: list = field(default_factory=list)  # [{step, changes: {option: {from, to}}}] (--resume-changes)
    saved_step: int | None = None  # the step of the newest checkpoint this fit() wrote


def param_line(counts):
    """The start line's model size, e.g. 124.49M parameters (85.07M outside embeddings, 4.723M per MLP)."""
    return (f"{counts['total'] / 1e6:.2f}M parameters ({counts['non_embedding'] / 1e6:.2f}M outside embeddings, "
            f"{counts['mlp_per_layer'] / 1e6:.3f}M per MLP)")


class Trainer:
    kind = None  # written into checkpoints: --resume refuses another trainer's
    in_loop = ()  # its in-loop evaluations (training/in_loop.py), each built after build as cls(trainer, ctx)
    lr_flag = "--lr"  # the option a non-finite loss message suggests lowering
    token_unit = "tok"  # what the tokens/s of the step line count
    shards = False  # whether build() honours --dist fsdp and --activation-checkpointing (training/fsdp.py)

    def __init__(self, cfg):
        self.cfg = cfg
        self.waiting = (0, "the process group")  # (step, what): named in the error if a collective fails

    # What each trainer writes ------------------------------------------------------------------------------
    def build(self, ctx, ckpt):
        """The trainer's model, optimizer and data as Parts; `ckpt` is the checkpoint being resumed, or None
        (fit() then loads its weights, optimizer and loader states into these parts)."""
        raise NotImplementedError

    def learning_rate(self, step):
        raise NotImplementedError

    def forward_backward(self, model, seed_micro_batch):
        """Forward and backward passes of one optimizer step on this rank, through `model` (compiled, DDP):
        (loss tensor, tokens): the step's loss is that tensor's mean over ranks (a mean over this rank's batches,
        or, as train_translation.py's, this rank's share of a sum normalised over all ranks). Call
        seed_micro_batch(micro) before the forward of micro-batch `micro` (0, 1, ... on every rank): its dropout
        is then the same whichever rank or accumulation step runs it (micro_batch_seeds). Scale the loss
        with the Context's scaler before backward."""
        raise NotImplementedError

    def evaluate(self, step, last, model):
        """This step's evaluations as an Evaluation; `model` is the one evaluations run (compiled when the run
        compiles, never DDP). Every rank calls it: evaluations split their work over ranks."""
        raise NotImplementedError

    def inputs(self):
        """Checks (callables raising a NanoactError) of what the trainer reads after step 0, e.g. an evaluation's
        data: run on every rank before the first step (training/preflight.py), so a missing one costs no training."""
        return []

    def step_fields(self, tok_per_s):
        """Extra numbers for the step's record and stdout line (e.g. MFU, epoch)."""
        return {}

    def after_step(self, step):
        """After each optimizer step (`step` steps done), on every rank: work between evaluations, such as the
        GPT trainer's samples every --sample-interval steps. It must not use a collective."""

    def checkpoint_state(self, evaluation):
        """Extra entries of this trainer's checkpoints; `evaluation` is the newest Evaluation's fields or None."""
        return {}

    def finish(self, step):
        """After the last step (not after a signal): closing evaluations (test BLEU, samples). Returns the fields
        of the run's closing metrics.jsonl record (`kind: test`), or None for no record."""
        return None

    # The shared loop ----------------------------------------------------------------------------------------
    def fit(self):
        """Train until max_steps (returns the model) or a signal (exits 128 + its number)."""
        run_cfg = self.cfg.run
        hardware.check_cuda(run_cfg.device)  # the driver, torch's build and the GPU agree, before anything is built
        d = distributed.setup(run_cfg.device, run_cfg.dist_timeout)
        stop = log = state = None
        try:
            ctx, platform, decisions = self.context(d)
            ckpt, start, parts, changes = self.build_or_resume(ctx, d)
            in_loop = [evaluation(self, ctx) for evaluation in self.in_loop]
            decisions["activations"] = self.before_step_0(ctx, parts, ckpt, start, platform, in_loop)
            log = RunLog(run_cfg.out_dir, d.master, resume_step=start if ckpt else None,
                         tensorboard=run_cfg.tensorboard, wandb_project=run_cfg.wandb_project,
                         wandb_run_name=run_cfg.wandb_run_name)
            history = self.record_start(log, ctx, ckpt, start, parts, changes, decisions, in_loop)
            eval_model, train_model = self.wrap(ctx, parts, start, log)
            state = FitState(ctx, parts, log, eval_model, train_model, step=start, in_loop=in_loop,
                             tokens=ckpt.get("tokens", 0) if ckpt else 0, kernels=decisions["activations"],
                             best_val=ckpt and ckpt.get("best_val"), config_changes=history)
            stop = GracefulStop()
            self.loop(state, stop)
            if not stop.requested:
                self.finish_run(state, start)
        except RuntimeError as e:
            message = distributed.failure_message(e, d, self.waiting)
            if message is None:
                raise
            raise SystemExit(message) from None
        finally:  # also on a NaN stop or an exception: leave signal handlers and the process group as found
            if stop is not None:
                stop.close()
            if log is not None:
                log.close()
            # DDP's reducer holds the process group: freed after the group is destroyed (when fit returns), gloo's
            # destructor can deadlock (torch 2.13; seen when a worker trains twice). It goes first.
            state = eval_model = train_model = None
            distributed.cleanup(d)
        if stop.requested:
            raise SystemExit(128 + stop.signum)
        return parts.model

    def build_or_resume(self, ctx, d):
        """The checkpoint to resume (or None), its step (0 without one), the trainer's Parts with the checkpoint's
        weights, optimizer, loader and scaler states loaded, and the options it changes on purpose
        (--resume-changes: {option: (old, new)})."""
        self.waiting = (0, "the checkpoint to resume from")
        ckpt = self.checkpoint_to_resume(d)
        start = ckpt["step"] if ckpt else 0
        self.waiting = (start, "the trainer's setup (data, tokenizer)")
        parts = self.build(ctx, ckpt)
        changes = {}
        if ckpt is not None:
            resume_training(ckpt, parts.model_config, d.world_size, d.rank, parts.model, parts.optimizer,
                            parts.loader, resized=declares_world_size(self.cfg))
            changes = resumed_changes(ckpt, self.cfg, d.world_size)
            if ckpt.get("scaler"):
                ctx.scaler.load_state_dict(ckpt["scaler"])
        return ckpt, start, parts, changes

    def before_step_0(self, ctx, parts, ckpt, start, platform, in_loop):
        """Every rank at once: what the run reads later and where it writes (training/preflight.py); then, before
        compile and DDP, the activation kernels checked and timed on this GPU at this run's shape and dtype, or
        the decision this run (or the run named by --kernels-from) recorded under the same key. Returns it."""
        d, run_cfg = ctx.dist, self.cfg.run
        self.waiting = (start, "the check of the run's inputs and out_dir (training/preflight.py)")
        writes = preflight.out_dir_checks(run_cfg.out_dir, parts.model, parts.optimizer, start, parts.max_steps,
                                          run_cfg.checkpoint_interval, run_cfg.keep_checkpoints) if d.master else []
        preflight.resolve([*self.inputs(), *(check for e in in_loop for check in e.inputs()), *writes], d)
        recorded = ckpt.get("kernels") if ckpt else None
        if recorded is None and run_cfg.kernels_from:
            recorded = runlog.recorded_kernels(run_cfg.kernels_from)
        return policy.select(parts.model, parts.mlp_shape, platform, d.device, PRECISIONS[ctx.precision], ctx.compile,
                             d, recorded=recorded, cache=run_cfg.kernel_cache or None, reprobe=run_cfg.kernel_reprobe,
                             timeout=policy.probe_bound(run_cfg.dist_timeout), fuse=run_cfg.fused_mlp)

    def record_start(self, log, ctx, ckpt, start, parts, changes, decisions, in_loop):
        """run.json (the config, this start's environment and decisions, the in-loop metrics the readers show), a
        `resume` record for options changed on purpose, and the start lines on stdout. Returns the run's
        config changes, this start's last."""
        d = ctx.dist
        history = list(ckpt.get("config_changes", [])) if ckpt else []
        if changes:  # a deliberate change (--resume-changes): the run's record says from which step on
            history.append({"step": start, "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}})
        decisions["config_changes"] = history
        log.write_run_info(to_dict(self.cfg), {**environment(d), "grad_accum": parts.accum, "decisions": decisions,
                                               "params": parts.params, "flops_per_token": parts.flops_per_token},
                           lr=learning_rate(self.cfg),
                           metrics=[metric.record() for evaluation in in_loop for metric in evaluation.metrics])
        if changes:
            log.record(start, kind="resume", changes=history[-1]["changes"])
        if d.master:
            if d.restart:
                print(runlog.restart_line(d.restart, ckpt and ckpt["path"], start), flush=True)
            where = f"resuming {ckpt['path']} at step {start}" if ckpt else parts.origin
            print(runlog.start_line(parts.description, parts.max_steps, d.world_size, ctx.precision, ctx.compile,
                                    where), flush=True)
            if changes:
                print(runlog.changes_line(start, changes), flush=True)
        return history

    def finish_run(self, state, start):
        """After the last step: the trainer's closing evaluations (their record, or their failure) and the
        closing line."""
        closing, failure = outcome(lambda: self.finish(state.step), state.ctx.dist)
        if failure is not None:
            self.record_failures(state, {"finish": failure})
        if closing is not None:
            state.log.record(state.step, kind="test", **closing)
        self.summarize(state, start)

    def context(self, d):
        """Seed, precision, autocast, GradScaler, TF32 and the compile decision: (Context, the platform, the
        decisions made, for run.json)."""
        run = self.cfg.run
        fsdp.check_dist(run.dist)
        if (run.dist in fsdp.SHARDED or run.activation_checkpointing) and not self.shards:
            raise ConfigError(f"the {self.kind} trainer has no FSDP layout or activation checkpointing: "
                              "use --dist ddp and --no-activation-checkpointing")
        torch.manual_seed(run.init_seed)
        platform, precision, use_compile, decisions = hardware.decide(run, d)
        if d.device_type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if run.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"unknown compile_mode {run.compile_mode!r}; choose {', '.join(COMPILE_MODES)}")
        ctx = Context(d, precision, autocast_context(d.device_type, precision), grad_scaler(d.device_type, precision),
                      use_compile)
        return ctx, platform, decisions

    def checkpoint_to_resume(self, d):
        """--resume: the newest checkpoint in out_dir that verifies, which must exist; --auto-resume (and any
        torchrun restart: starting afresh would train over the run's own checkpoints): it, if there is one."""
        run = self.cfg.run
        d.restart = max(distributed.gather_objects(d.restart, d))  # nodes count restarts apart: any one counts
        if not (run.resume or run.auto_resume or d.restart):
            return None
        ckpt, skipped = newest_good_checkpoint(run.out_dir, self.kind, d)
        if ckpt is None:
            if run.resume:
                raise CheckpointError(f"--resume: no checkpoint (model_*.pt) in {run.out_dir}; check --out-dir, or "
                                      "use --auto-resume to continue when there is one and start fresh otherwise")
            return None
        if skipped and d.master:
            print(f"{'; '.join(skipped)}; resuming {ckpt['path']}, the newest checkpoint that verifies", flush=True)
        return ckpt

    def compile(self, ctx, parts, step, log):
        """The model compiled, whole: one graph per batch shape (dynamic when the shapes are free). A trainer may
        compile otherwise (train_translation.py: each layer once, shapes warmed up before the first step)."""
        if parts.batch_shapes:
            allow_recompiles(parts.batch_shapes + 1)
        return torch.compile(parts.model, dynamic=parts.batch_shapes is None, mode=self.cfg.run.compile_mode)

    def wrap(self, ctx, parts, step, log):
        """(the model evaluations run, the model the steps run): compiled if the run compiles, then DDP; a model the
        trainer's build sharded (--dist fsdp, training/fsdp.py) steps as it is."""
        model = self.compile(ctx, parts, step, log) if ctx.compile else parts.model
        if not ctx.dist.ddp or fsdp.sharded_root(parts.model) is not None:  # FSDP: sharded by the trainer's build
            return model, model
        self.waiting = (step, "the DDP setup (the parameter broadcast)")
        # no buffer broadcast before forwards: the only buffers that change, NSwish/NReLU's running statistics,
        # are the same on every rank after each step (activations.step_statistics)
        return model, DDP(model, device_ids=[ctx.dist.local_rank] if ctx.dist.device_type == "cuda" else None,
                          **NO_BUFFER_SYNC)

    def loop(self, state, stop):
        """Evaluate, step, log, checkpoint until max_steps or a signal."""
        interval = self.cfg.run.checkpoint_interval
        while True:
            last = state.step == state.parts.max_steps
            if every(state.step, self.cfg.eval.eval_interval) or last:
                self.evaluate_and_record(state, last)
            if last:  # saved after the final evaluation, so the last checkpoint holds its val loss (and BLEU)
                self.checkpoint(state)
                return
            loss, lr, norm, seconds, step_tokens = self.train_step(state)
            self.log_step(state, loss, lr, norm, seconds, step_tokens)
            self.after_step(state.step)
            self.waiting = (state.step, "the stop-signal all-reduce")
            stopping = distributed.any_rank(stop.requested, state.ctx.dist)
            if (every(state.step, interval) and state.step < state.parts.max_steps) or stopping:
                self.checkpoint(state)
            if stopping:
                stop.requested = True  # every rank exits non-zero, not only the one signalled
                stop.signum = stop.signum or 15
                if state.ctx.dist.master:
                    print(f"stopped by signal at step {state.step}; continue with --resume (same --out-dir)",
                          flush=True)
                return

    def evaluate_and_record(self, state, last):
        """evaluate_all at this step, recorded (val loss, log.txt scalars, metrics.jsonl, stdout); a failure
        recorded too, and this step's weights saved to evaluate again."""
        result = self.evaluate_all(state, last)
        state.evals.append(result.fields)  # a failed evaluation's: empty, so this step's checkpoint holds no val loss
        val = result.fields.get("val_loss")
        if val is not None and (state.best_val is None or val < state.best_val[0]):
            state.best_val = (val, state.step)
        for kind, value in result.scalars.items():
            state.log.scalar(state.step, kind, value)
        flops = {} if state.parts.flops_per_token is None else {"flops": state.tokens * state.parts.flops_per_token}
        if result.fields:
            state.log.record(state.step, kind="eval", tokens=state.tokens, **flops, **result.fields)
        if state.ctx.dist.master and result.fields:
            print(runlog.eval_line(state.step, state.parts.max_steps, result.text), flush=True)
        if result.failed:
            self.record_failures(state, result.failed)
            if not last and state.saved_step != state.step:  # the last step saves next anyway
                self.checkpoint(state)  # this step's weights, to evaluate again

    def evaluate_all(self, state, last):
        """The trainer's evaluate, then its in-loop evaluations that are due: one Evaluation. One that raises leaves
        the others recorded (Evaluation.attempt); where evaluate raises, nothing of the step is."""
        d = state.ctx.dist
        self.waiting = (state.step, "the evaluation (validation loss all-reduce)")
        result, failure = outcome(lambda: self.evaluate(state.step, last, state.eval_model), d)
        if result is None:
            return Evaluation({}, "", failed={"evaluation": failure})
        for evaluation in state.in_loop:
            if evaluation.due(state.step, last):
                self.waiting = (state.step, f"the {evaluation.name} evaluation")
                result.attempt(evaluation.name, lambda: in_loop_result(evaluation, state.step, last,
                                                                       state.eval_model), d)
        return result

    def record_failures(self, state, failures):
        """Evaluations that raised ({part: traceback}) cost no training: the model goes back to training mode, what
        they held on the GPU is freed, and log.txt (`eval_failed`), metrics.jsonl (`evaluation: failed`, with the
        traceback) and stderr record them; the run goes on (docs/training.md says why)."""
        state.parts.model.train()
        if state.ctx.dist.device_type == "cuda":  # give back what the evaluation held (its traceback's frames too)
            gc.collect()
            torch.cuda.empty_cache()
        state.log.scalar(state.step, "eval_failed", len(failures))
        for part, failure in failures.items():
            error = failure.strip().splitlines()[-1]
            state.log.record(state.step, kind="eval", evaluation="failed", part=part, error=error, traceback=failure)
            if state.ctx.dist.master:
                print(failure, end="", file=sys.stderr, flush=True)
                print(runlog.eval_line(state.step, state.parts.max_steps, f"{part} failed ({error}); the run goes on"),
                      flush=True)

    def train_step(self, state):
        """One optimizer step: (loss, lr, grad norm, seconds, tokens of all ranks)."""
        ctx, parts, t0 = state.ctx, state.parts, time.time()
        lr = self.learning_rate(state.step)
        set_lr(parts.optimizer, lr)
        self.waiting = (state.step, "the gradient all-reduce (DDP backward)")
        seeds = micro_batch_seeds(self.cfg.run.init_seed, state.step, ctx.dist)
        loss, tokens = self.forward_backward(state.train_model, seeds)
        fsdp.reduce_replicated(parts.model, ctx.dist.world_size)
        self.waiting = (state.step, "the activation statistics all-reduce")
        step_statistics(parts.model)
        ctx.scaler.unscale_(parts.optimizer)  # a no-op unless float16: clip the true gradients
        norm = fsdp.clip_grad_norm(parts.model, self.cfg.optim.grad_clip).item()
        self.waiting = (state.step, "the loss all-reduce")
        stats = distributed.all_reduce_mean(torch.stack([loss.detach().float(), torch.as_tensor(
            tokens, dtype=torch.float32, device=loss.device)]), ctx.dist)
        loss_value, step_tokens = stats[0].item(), round(stats[1].item() * ctx.dist.world_size)
        # under float16 an overflowed gradient is the GradScaler's to handle: it skips the step, lowers the scale
        stop_if_not_finite(state.step, loss_value, 0.0 if ctx.scaler.is_enabled() else norm, lr, parts.model,
                           self.cfg.run.out_dir, self.lr_flag)
        ctx.scaler.step(parts.optimizer)
        ctx.scaler.update()
        parts.optimizer.zero_grad(set_to_none=True)
        if ctx.dist.device_type == "cuda":
            torch.cuda.synchronize()
        return loss_value, lr, norm, time.time() - t0, step_tokens

    def log_step(self, state, loss, lr, norm, seconds, step_tokens):
        """The step's log.txt line and record, and (every log_interval steps) its stdout line; advances the step."""
        state.tokens += step_tokens
        extra = self.step_fields(step_tokens / seconds)
        state.log.scalar(state.step, "train", loss)
        state.log.record(state.step, kind="train", loss=loss, lr=lr, grad_norm=norm, dt_ms=1000 * seconds,
                       tok_per_s=step_tokens / seconds, tokens=state.tokens, **extra)
        state.step += 1
        # ETA from the mean wall time per step (evaluations included) after the first, compiling, step
        state.first_step_done = state.first_step_done or (time.time(), state.step)
        if state.ctx.dist.master and every(state.step - 1, self.cfg.run.log_interval):
            since, done = time.time() - state.first_step_done[0], state.step - state.first_step_done[1]
            eta = since / done * (state.parts.max_steps - state.step) if done else None
            print(runlog.step_line(state.step - 1, state.parts.max_steps, loss, lr, norm, seconds, self.token_unit,
                                   step_tokens / seconds, extra, eta), flush=True)

    def checkpoint(self, state):
        parts, cfg = state.parts, self.cfg
        sharded = fsdp.sharded_root(parts.model) is not None
        self.waiting = (state.step, f"checkpoint model_{state.step:05d}" + (".dcp (every rank writing its shards)"
                                    if sharded else ".pt (gathering states, then rank 0 saving it)"))
        model_state, optimizer_state = fsdp.training_states(parts.model, parts.optimizer)  # FSDP: this rank's
        contents = {"kind": self.kind, "model": model_state, "model_config": model_identity(parts.model_config),
                    "config": to_dict(cfg), "optimizer": optimizer_state, "tokens": state.tokens,
                    "val_loss": state.evals[-1].get("val_loss") if state.evals else None, "best_val": state.best_val,
                    "config_changes": state.config_changes,
                    "scaler": state.ctx.scaler.state_dict(), "kernels": state.kernels,
                    **self.checkpoint_state(state.evals[-1] if state.evals else None)}
        save_training_checkpoint(contents, parts.loader, state.ctx.dist, cfg.run.out_dir, state.step,
                                 cfg.run.keep_checkpoints, sharded=sharded)
        state.saved_step = state.step

    def summarize(self, state, start_step):
        """The finished run's numbers for wandb's summary, and the closing stdout line: the best val loss is the
        whole run's (a resumed run's earlier evaluations are in its checkpoint's best_val)."""
        final = state.evals[-1].get("val_loss") if state.evals else None  # None: the final evaluation failed
        best, best_step = state.best_val or (None, None)
        ckpt = latest_checkpoint(self.cfg.run.out_dir)
        seconds = time.time() - state.started
        state.log.summary(start_step=start_step, final_step=state.step, tokens=state.tokens, wall_time_s=seconds,
                        final_val_loss=final, best_val_loss=best, best_val_step=best_step,
                        checkpoint=str(ckpt) if ckpt else None)
        if state.ctx.dist.master:
            print(runlog.summary_line(start_step, state.step, seconds, final, state.best_val,
                                      Path(self.cfg.run.out_dir), ckpt), flush=True)


def in_loop_result(evaluation, step, last, model):
    """An in-loop evaluation's run as an Evaluation: its fields, its text, its plotted metrics for log.txt."""
    fields, text = evaluation.run(step, last, model)
    return Evaluation(fields, text, evaluation.scalars(fields))


def stop_if_not_finite(step, loss, grad_norm, lr, model, out_dir, lr_flag):
    """A NaN/inf loss or gradient norm ends the run before the optimizer step can spread it into the
    weights, so the newest checkpoint on disk is still a good one; say which, and which grads broke."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    bad = [n for n, p in model.named_parameters()  # FSDP: this rank's shards
           if p.grad is not None and not torch.isfinite(fsdp.local_value(p.grad)).all()]
    listed = f"{bad[:5]}{' ...' if len(bad) > 5 else ''}"
    raise SystemExit(f"step {step}: loss {loss} / grad norm {grad_norm} is not finite (lr {lr:.3e}; non-finite "
                     f"grads in {listed}). Stopped without saving; last good checkpoint: "
                     f"{latest_checkpoint(out_dir) or 'none'} (lower {lr_flag} or check the data, then --resume)")


def every(step, interval):
    """True at every interval-th step; an interval of 0 is never (the end of a run still evaluates and saves)."""
    return interval > 0 and step % interval == 0


def allow_recompiles(n):
    """Keep n static graphs of one model: dynamo's default limit (8) would evict or fall back to eager
    beyond it (the option is recompile_limit since torch 2.6, cache_size_limit before)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), n))


def micro_batch_seeds(seed, step, d):
    """forward_backward's seed_micro_batch: seed_micro_batch(micro) seeds torch (the CPU and every CUDA
    generator) from (seed, step, micro * world_size + rank): the micro-batch's place in the step's data, as
    data/loader.py and data/parallel_corpus.py hand a step's batches out (consecutive over ranks, then over
    micro-steps). Its dropout masks are then a function of the data it trains on, not of the rank: 2 ranks x
    1 micro-batch draw what 1 process x 2 draws, ranks do not share masks, a resume needs no RNG state for
    them, and compiled graphs (which take their seeds from these generators at each call) repeat too."""
    def seed_micro_batch(micro):
        entropy = np.random.SeedSequence([seed, step, micro * d.world_size + d.rank])
        torch.manual_seed(int(entropy.generate_state(1, np.uint64)[0]))
    return seed_micro_batch


def no_sync_unless(last, model):
    """Gradient accumulation under DDP (FSDP): all-reduce (reduce-scatter) only on the last micro-step."""
    if fsdp.sharded_root(model) is not None:
        return fsdp.gradient_sync(model, last)
    return model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()
