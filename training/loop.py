"""The training loop both trainers share (train_gpt2.py, train_translation.py).

A trainer subclasses Trainer and writes only what is its own: the model, optimizer and data (`build`),
the learning rate, one optimizer step's forward/backward passes, and its evaluations. `fit` does the rest,
in this order: process group, seed and precision; the checkpoint to resume; the run log; compile and DDP;
then evaluate / step / log / checkpoint until max_steps; the trainer's closing work and a summary.
SIGTERM/SIGINT finish the current step, save, and exit with 128 + the signal number (143 for SIGTERM), so
a scheduler sees a preempted job as unfinished; a NaN/inf loss stops before it reaches the weights. Signal
handlers and the process group are released on every exit. A collective that waits past --dist-timeout, or
whose peer died, ends the rank with one line naming the step and what it waited for (`self.waiting`); under
torchrun --max-restarts the next attempt resumes the newest checkpoint that verifies.
"""
import contextlib
import math
import re
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from activations import selfcheck
from training import distributed, hardware
from training.checkpoint import (CheckpointError, latest_checkpoint, newest_good_checkpoint, resume_training,
                                 save_training_checkpoint)
from training.config import ConfigError, to_dict
from training.precision import PRECISIONS, autocast_context, grad_scaler
from training.runlog import RunLog, environment
from training.stop import GracefulStop


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")


class Trainer:
    kind = None  # written into checkpoints: --resume refuses another trainer's
    lr_flag = "--lr"  # the option a non-finite loss message suggests lowering
    token_unit = "tok"  # what the tokens/s of the step line count
    origin = "starting from scratch"  # build() may say which weights the model was initialised from

    def __init__(self, cfg):
        self.cfg = cfg

    # What each trainer writes ------------------------------------------------------------------------------
    def build(self, ckpt):
        """Set self.model, self.optimizer, self.loader (with state_dict/load_state_dict), self.max_steps and
        self.model_config (a dict compared on resume); `ckpt` is the checkpoint being resumed, or None."""
        raise NotImplementedError

    def describe(self):
        """The trainer's part of the first line printed (model size, data)."""
        raise NotImplementedError

    def learning_rate(self, step):
        raise NotImplementedError

    def forward_backward(self, model):
        """Forward and backward passes of one optimizer step on this rank: (mean loss tensor, tokens)."""
        raise NotImplementedError

    def evaluate(self, step, last):
        """Evaluations at this step: (fields for metrics.jsonl, text for the stdout line); may log scalars."""
        raise NotImplementedError

    def mlp_shape(self):
        """(rows, width) of the activation's input in one micro-batch: where impl="auto" times kernels and PyTorch."""
        raise NotImplementedError

    def batch_shapes(self):
        """How many distinct batch shapes training feeds the model: each is compiled once, with
        dynamic=False; None when shapes vary freely (compiled with dynamic=True)."""
        return 1

    def step_fields(self, tok_per_s):
        """Extra numbers for the step's record and stdout line (e.g. MFU, epoch)."""
        return {}

    def checkpoint_state(self):
        """Extra entries of this trainer's checkpoints."""
        return {}

    def finish(self, step):
        """After the last step (not after a signal): final evaluations, samples."""

    # The shared loop ----------------------------------------------------------------------------------------
    def fit(self):
        cfg, run = self.cfg, self.cfg.run
        self.dist = d = distributed.setup(run.device, run.dist_timeout)
        stop = None
        self.waiting = (0, "the checkpoint to resume from")  # (step, what): named if a collective times out
        try:
            torch.manual_seed(run.seed + run.init_seed_offset)
            platform, self.precision, use_compile, decisions = hardware.decide(run, d)
            self.autocast = autocast_context(d.device_type, self.precision)
            self.scaler = grad_scaler(d.device_type, self.precision)
            if d.device_type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True
            if run.compile_mode not in COMPILE_MODES:
                raise ConfigError(f"unknown compile_mode {run.compile_mode!r}; choose {', '.join(COMPILE_MODES)}")
            self.use_compile = use_compile
            ckpt = self.checkpoint_to_resume()
            self.waiting = (ckpt["step"] if ckpt else 0, "the trainer's setup (data, tokenizer)")
            self.build(ckpt)
            start_step, self.tokens = 0, 0
            if ckpt is not None:
                start_step = resume_training(ckpt, self.model_config, d.world_size, d.rank, self.model,
                                             self.optimizer, self.loader)
                self.tokens = ckpt.get("tokens", 0)
                if ckpt.get("scaler"):
                    self.scaler.load_state_dict(ckpt["scaler"])
            # before compile and DDP: the kernels checked and timed on this GPU, at this run's shape and dtype
            decisions["activations"] = selfcheck.select(self.model, self.mlp_shape(), platform, d.device,
                                                        PRECISIONS[self.precision], use_compile, d)
            self.log = RunLog(run.out_dir, d.master, resume_step=start_step if ckpt else None,
                              tensorboard=run.tensorboard, wandb_project=run.wandb_project,
                              wandb_run_name=run.wandb_run_name)
            self.log.write_run_info(to_dict(cfg), {**environment(d), "decisions": decisions})
            if d.master:
                where = f"resuming {ckpt['path']} at step {start_step}" if ckpt else self.origin
                if d.restart:  # torchrun --max-restarts started this attempt after a failure
                    print(f"restart {d.restart}: " + (f"resuming {Path(ckpt['path']).name} at step {start_step}"
                                                      if ckpt else "starting from scratch (no checkpoint yet)"), flush=True)
                print(f"{self.describe()} | {self.max_steps} steps | world {d.world_size} | {self.precision} | "
                      f"compile {use_compile} | {where}", flush=True)
            self.compiled = self.model
            if use_compile:
                shapes = self.batch_shapes()
                if shapes:
                    allow_recompiles(shapes + 1)
                self.compiled = torch.compile(self.model, dynamic=shapes is None, mode=run.compile_mode)
            train_model = self.compiled
            if d.ddp:
                self.waiting = (start_step, "the DDP setup (the parameter broadcast)")
                train_model = DDP(self.compiled, device_ids=[d.local_rank] if d.device_type == "cuda" else None)
            stop = GracefulStop()
            step = self.loop(train_model, start_step, stop)
            if not stop.requested:
                self.finish(step)
                self.log.summary(**self.outcome(step, start_step))
                if d.master:
                    print(self.summary(step, start_step), flush=True)
        except RuntimeError as e:
            failure = distributed.collective_failure(e) if d.ddp else None
            if failure is None:
                raise
            raise SystemExit(self.stall_message() if failure == "timeout" else self.lost_peer_message(e)) from None
        finally:  # also on a NaN stop or an exception: leave signal handlers and the process group as found
            if stop is not None:
                stop.close()
            if getattr(self, "log", None) is not None:
                self.log.close()
            distributed.cleanup(d)
        if stop.requested:
            raise SystemExit(128 + stop.signum)
        return self.model

    def checkpoint_to_resume(self):
        """--resume: the newest checkpoint in out_dir that verifies, which must exist; --auto-resume (and any
        torchrun restart: starting afresh would train over the run's own checkpoints): it, if there is one."""
        run, d = self.cfg.run, self.dist
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

    def stall_message(self):
        """The one line a collective timeout ends the run with, naming the ranks that no longer answer."""
        d = self.dist
        step, what = self.waiting
        missing = distributed.stalled_ranks(d, grace=min(d.timeout, 30))
        who = ("no rank answered through torchrun's store afterwards (its host may be the one stalled)" if missing is None
               else f"rank {', '.join(map(str, missing))} did not answer afterwards (stalled or dead: check that "
                    "process and its node)" if missing else "every rank answered afterwards: one was slow, not stuck")
        return (f"error: step {step}: rank {d.rank} waited more than {d.timeout:g}s (--dist-timeout) for {what}; "
                f"{who}; stopping this rank. Restart with --auto-resume (torchrun --max-restarts does it itself), "
                "or raise --dist-timeout if such a wait is expected")

    def lost_peer_message(self, error):
        step, what = self.waiting
        reason = re.sub(r"^\[[^\]]*\]\s*", "", str(error).splitlines()[0]).split(". ")[0]  # gloo: "[file:line] What."
        return (f"error: step {step}: rank {self.dist.rank} lost a peer during {what} ({reason}); "
                "torchrun --max-restarts restarts the group from the newest checkpoint, else rerun with --auto-resume")

    def loop(self, train_model, step, stop):
        """Evaluate, step, log, checkpoint until max_steps or a signal; returns the last step."""
        cfg, d, log = self.cfg, self.dist, self.log
        self.evals, self.started, first_step_done = [], time.time(), None
        while True:
            last = step == self.max_steps
            if step % cfg.eval.eval_interval == 0 or last:
                self.waiting = (step, "the evaluation (validation loss all-reduce)")
                fields, text = self.evaluate(step, last)
                self.evals.append(fields)
                log.record(step, kind="eval", tokens=self.tokens, **fields)
                if d.master:
                    print(f"step {step:5d}/{self.max_steps} | {text}", flush=True)
            if last:
                return step

            t0 = time.time()
            lr = self.learning_rate(step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.waiting = (step, "the gradient all-reduce (DDP backward)")
            loss, tokens = self.forward_backward(train_model)
            self.scaler.unscale_(self.optimizer)  # a no-op unless float16: clip the true gradients
            norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), cfg.optim.grad_clip).item()
            self.waiting = (step, "the loss all-reduce")
            stats = distributed.all_reduce_mean(torch.stack([loss.detach().float(), torch.as_tensor(
                tokens, dtype=torch.float32, device=loss.device)]), d)
            loss_value, step_tokens = stats[0].item(), round(stats[1].item() * d.world_size)
            # under float16 an overflowed gradient is the GradScaler's to handle: it skips the step, lowers the scale
            stop_if_not_finite(step, loss_value, 0.0 if self.scaler.is_enabled() else norm, lr, self.model,
                               cfg.run.out_dir, self.lr_flag)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            if d.device_type == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
            self.tokens += step_tokens
            extra = self.step_fields(step_tokens / dt)
            log.scalar(step, "train", loss_value)
            log.record(step, kind="train", loss=loss_value, lr=lr, grad_norm=norm, dt_ms=1000 * dt,
                       tok_per_s=step_tokens / dt, tokens=self.tokens, **extra)
            step += 1
            # ETA from the mean wall time per step (evaluations included) after the first, compiling, step
            first_step_done = first_step_done or (time.time(), step)
            if d.master and (step - 1) % cfg.run.log_interval == 0:
                done_since = step - first_step_done[1]
                eta = (time.time() - first_step_done[0]) / done_since * (self.max_steps - step) if done_since else None
                extra_text = "".join(f" | {k} {v:.1%}" if k == "mfu" else f" | {k} {v}" for k, v in extra.items()
                                     if v is not None)
                print(f"step {step - 1:5d}/{self.max_steps} | loss {loss_value:.4f} | lr {lr:.3e} | norm {norm:.3f} | "
                      f"dt {1000 * dt:.0f}ms | {self.token_unit}/s {step_tokens / dt:,.0f}{extra_text} | eta {clock(eta)}",
                      flush=True)

            self.waiting = (step, "the stop-signal all-reduce")
            stopping = distributed.any_rank(stop.requested, d)
            if step % cfg.run.checkpoint_interval == 0 or step == self.max_steps or stopping:
                state = {"kind": self.kind, "model": self.model.state_dict(), "model_config": self.model_config,
                         "config": to_dict(cfg), "optimizer": self.optimizer.state_dict(), "tokens": self.tokens,
                         "val_loss": self.evals[-1].get("val_loss") if self.evals else None,
                         "scaler": self.scaler.state_dict(),
                         **self.checkpoint_state()}
                self.waiting = (step, f"checkpoint model_{step:05d}.pt (gathering states, then rank 0 saving it)")
                save_training_checkpoint(state, self.loader, d, cfg.run.out_dir, step, cfg.run.keep_checkpoints)
            if stopping:
                stop.requested = True  # every rank exits non-zero, not only the one signalled
                stop.signum = stop.signum or 15
                if d.master:
                    print(f"stopped by signal at step {step}; continue with --resume (same --out-dir)", flush=True)
                return step

    def summary(self, step, start_step):
        """The closing line: what ran, how long, the final validation, where the files are."""
        val = [e["val_loss"] for e in self.evals if e.get("val_loss") is not None]
        out = Path(self.cfg.run.out_dir)
        ckpt = latest_checkpoint(out)
        best = f" (best {min(val):.4f})" if len(val) > 1 else ""
        return (f"done: steps {start_step}-{step} in {clock(time.time() - self.started)} | final val loss "
                f"{val[-1]:.4f}{best} | {out}/: log.txt, metrics.jsonl, run.json"
                + (f", {ckpt.name}" if ckpt else ""))

    def outcome(self, step, start_step):
        """The finished run's numbers, for wandb's run summary."""
        val = [e["val_loss"] for e in self.evals if e.get("val_loss") is not None]
        ckpt = latest_checkpoint(self.cfg.run.out_dir)
        return {"start_step": start_step, "final_step": step, "tokens": self.tokens,
                "wall_time_s": time.time() - self.started, "final_val_loss": val[-1] if val else None,
                "best_val_loss": min(val) if val else None, "checkpoint": str(ckpt) if ckpt else None}


def clock(seconds):
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def stop_if_not_finite(step, loss, grad_norm, lr, model, out_dir, lr_flag):
    """A NaN/inf loss or gradient norm ends the run before the optimizer step can spread it into the
    weights, so the newest checkpoint on disk is still a good one; say which, and which grads broke."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    listed = f"{bad[:5]}{' ...' if len(bad) > 5 else ''}"
    raise SystemExit(f"step {step}: loss {loss} / grad norm {grad_norm} is not finite (lr {lr:.3e}; non-finite "
                     f"grads in {listed}). Stopped without saving; last good checkpoint: "
                     f"{latest_checkpoint(out_dir) or 'none'} (lower {lr_flag} or check the data, then --resume)")


def allow_recompiles(n):
    """Keep n static graphs of one model: dynamo's default limit (8) would evict or fall back to eager
    beyond it (the option is recompile_limit since torch 2.6, cache_size_limit before)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), n))


def no_sync_unless(last, model):
    """Gradient accumulation under DDP: all-reduce only on the last micro-step."""
    return model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()
