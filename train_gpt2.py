"""Train GPT-2 on token shards with any registered MLP activation.

    torchrun --standalone --nproc_per_node 8 train_gpt2.py --act aglu
    python train_gpt2.py --config configs/gpt2_cpu_tiny.toml --act nswish --max-steps 50
    python train_gpt2.py --config configs/gpt2_cpu_tiny.toml --resume      # continue the newest checkpoint

Every option is a field of TrainConfig below: set it in a TOML file (--config) or as --name value.
"""
import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from data.loader import ShardLoader
from eval import telemetry
from harness import distributed
from harness.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, resume_training,
                                save_training_checkpoint)
from harness.config import ConfigError, RunConfig, help_text, load_config, to_dict
from harness.runlog import RunLog, environment
from harness.schedule import warmup_cosine
from harness.stop import GracefulStop
from harness.training import autocast_context, resolve_precision, stop_if_not_finite
from model import GPT, GPTConfig, sdpa_backends


@dataclass
class DataConfig:
    data_dir: str = "data/fineweb_edu"
    shuffle: bool = True  # shard order and sequence positions permuted per epoch, from the seed
    val_tokens: int = 10_485_760  # per validation, split over ranks: the same val set on any world size
    # (build-nanogpt's 20 steps x 8 GPUs x 64 x 1024)
    hellaswag_interval: int = 0  # 0: off; else HellaSwag every N steps (and at the end)
    hellaswag_data: str = ""  # "" : download into the cache
    hellaswag_limit: int = 0  # 0: all 10,042 items
    sample_interval: int = 0  # 0: off; else print sample generations every N steps


@dataclass
class OptimConfig:
    total_batch_size: int = 524288  # tokens per optimizer step (2**19, ~0.5M as GPT-3 small)
    batch_size: int = 64  # micro-batch B per device; gradient accumulation fills the total
    seq_len: int = 1024
    max_lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 715
    max_steps: int = 19073  # 10B tokens / 2**19 tokens per step: one epoch of sample-10BT
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")


@dataclass
class SpeedConfig:
    """How fast, not what: each option keeps the loss equal to the plain path (tests/test_speed.py),
    none is stored in the model config, so a resumed run may change them. DDP safety: README."""
    loss_chunks: int = 0  # 0: off; else LM head + cross-entropy in N row chunks, never the full fp32 logits
    attention_backend: str = "auto"  # SDPA kernel(s) on CUDA: auto, flash, cudnn, efficient, math or e.g. cudnn,flash
    compile_mode: str = "default"  # torch.compile mode (when compile is on): one of COMPILE_MODES


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)


def steps_per_rank(total, batch_size, seq_len, world_size, name="total_batch_size"):
    """How many (B, T) batches each rank runs so that all ranks together cover `total` tokens."""
    per_pass = batch_size * seq_len * world_size
    if total % per_pass or total == 0:
        raise ConfigError(f"{name} {total} is not divisible by batch_size*seq_len*world_size = "
                          f"{batch_size}*{seq_len}*{world_size} = {per_pass}; change --{name.replace('_', '-')} "
                          "or --batch-size")
    return total // per_pass


@torch.no_grad()
def validation_loss(model, loader, steps, d, autocast):
    model.eval()
    loader.reset()
    total = torch.zeros((), device=d.device)
    for _ in range(steps):
        x, y = loader.next_batch()
        with autocast:
            _, loss = model(x.to(d.device), y.to(d.device))
        total += loss.detach()
    model.train()
    return distributed.all_reduce_mean(total / steps, d).item()


def print_samples(raw_model, d, seed, autocast):
    try:
        import tiktoken
        enc = tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline without TIKTOKEN_CACHE_DIR: samples are optional
        print(f"(no samples: tiktoken gpt2 unavailable: {e})")
        return
    gen = torch.Generator(device=d.device).manual_seed(seed + d.rank)  # own generator: training RNG untouched
    prompt = torch.tensor(enc.encode("Hello, I'm a language model,"), device=d.device).repeat(2, 1)
    raw_model.eval()
    with autocast:
        out = raw_model.generate(prompt, 24, top_k=50, generator=gen)
    raw_model.train()
    for row in out.tolist():
        print(f"rank {d.rank} sample: {enc.decode([t for t in row if t < enc.n_vocab])!r}")


def run_hellaswag(model, d, cfg, autocast):
    from eval.hellaswag import evaluate_model  # the same scorer as eval/hellaswag.py
    t0 = time.time()  # the whole call: on the first one, tokenizing (then cached) and compiling the eval graphs
    result = evaluate_model(model, device=d.device, data_path=cfg.data.hellaswag_data or None,
                            limit=cfg.data.hellaswag_limit or None, scoring="completion", dist_info=d,
                            autocast=autocast, progress=False, cache=True)
    return {**result["completion"], "call_seconds": time.time() - t0}


def check_speed(speed):
    """Bad speed options fail before any data or device is touched."""
    if speed.compile_mode not in COMPILE_MODES:
        raise ConfigError(f"unknown compile_mode {speed.compile_mode!r}; choose {', '.join(COMPILE_MODES)}")
    if speed.loss_chunks < 0:
        raise ConfigError(f"loss_chunks {speed.loss_chunks} must be >= 0 (0: off)")
    sdpa_backends(speed.attention_backend)  # a ValueError that names the choices


def train(cfg):
    check_speed(cfg.speed)
    d = distributed.setup(cfg.run.device)
    torch.manual_seed(cfg.run.seed)
    o = cfg.optim
    accum = steps_per_rank(o.total_batch_size, o.batch_size, o.seq_len, d.world_size)
    val_steps = steps_per_rank(cfg.data.val_tokens, o.batch_size, o.seq_len, d.world_size, "val_tokens")
    precision = resolve_precision(cfg.run.dtype, d.device_type)
    autocast = autocast_context(d.device_type, precision)
    use_compile = d.device_type == "cuda" if cfg.run.compile is None else cfg.run.compile
    if d.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    train_loader = ShardLoader(cfg.data.data_dir, "train", o.batch_size, o.seq_len, d.rank, d.world_size,
                               seed=cfg.run.seed, shuffle=cfg.data.shuffle, vocab_size=cfg.model.vocab_size)
    val_loader = ShardLoader(cfg.data.data_dir, "val", o.batch_size, o.seq_len, d.rank, d.world_size, shuffle=False,
                             vocab_size=cfg.model.vocab_size)
    model = GPT(cfg.model, cfg.speed.loss_chunks, cfg.speed.attention_backend).to(d.device)
    optimizer = model.configure_optimizers(o.weight_decay, o.max_lr, o.betas, o.eps, d.device_type)

    start_step, ckpt_path = 0, latest_checkpoint(cfg.run.out_dir) if cfg.run.resume else None
    if ckpt_path is not None:
        start_step = resume_training(load_checkpoint(ckpt_path, kind="gpt2"), dataclasses.asdict(cfg.model),
                                     d.world_size, d.rank, model, optimizer, train_loader)
    log = RunLog(cfg.run.out_dir, d.master, resume_step=start_step if ckpt_path else None,
                 tensorboard=cfg.run.tensorboard)
    log.write_run_info(to_dict(cfg), environment(d))
    if d.master:
        where = f"resuming {ckpt_path} at step {start_step}" if ckpt_path else "starting from scratch"
        print(f"{model.num_params() / 1e6:.2f}M parameters | act {cfg.model.act} | world {d.world_size} | "
              f"grad accum {accum} | {precision} | compile {use_compile} | {where}", flush=True)

    raw_model = model
    if use_compile:
        # static graphs: train, val and each HellaSwag length bucket
        model = torch.compile(model, dynamic=False, mode=cfg.speed.compile_mode)
    if d.ddp:
        model = DDP(model, device_ids=[d.local_rank] if d.device_type == "cuda" else None)
    eval_model = unwrap_ddp(model)  # compiled when compile is on: evaluation keeps the compiled graph
    device_name = torch.cuda.get_device_name() if d.device_type == "cuda" else None
    stop = GracefulStop()
    try:
        step, val = start_step, None
        while True:
            last = step == o.max_steps
            if step % cfg.run.eval_interval == 0 or last:
                val = validation_loss(eval_model, val_loader, val_steps, d, autocast)
                fields = {"val_loss": val}
                if d.master:  # per-layer activation statistics on the first validation batch (eval/telemetry.py)
                    val_loader.reset()
                    fields["telemetry"] = telemetry.collect(raw_model, val_loader.next_batch()[0].to(d.device), autocast)
                if cfg.data.hellaswag_interval and (step % cfg.data.hellaswag_interval == 0 or last):
                    hella = run_hellaswag(eval_model, d, cfg, autocast)
                    log.scalar(step, "hella", hella["acc_norm"])
                    fields.update(hellaswag_acc=hella["acc"], hellaswag_acc_norm=hella["acc_norm"],
                                  hellaswag_seconds=hella["call_seconds"])
                if d.master:
                    hella_text = "" if "hellaswag_acc" not in fields else (
                        f" | hellaswag acc {fields['hellaswag_acc']:.4f} acc_norm {fields['hellaswag_acc_norm']:.4f} "
                        f"({fields['hellaswag_seconds']:.1f}s)")
                    print(f"step {step:5d} | val loss {val:.4f}{hella_text}", flush=True)
                log.scalar(step, "val", val)
                log.record(step, kind="eval", tokens=step * o.total_batch_size, **fields)
            if cfg.data.sample_interval and step % cfg.data.sample_interval == 0 and step > 0 and not last:
                print_samples(raw_model, d, cfg.run.seed, autocast)
            if last:
                break

            t0 = time.time()
            lr = warmup_cosine(step, o.warmup_steps, o.max_steps, o.max_lr, o.min_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=d.device)
            for micro in range(accum):
                x, y = train_loader.next_batch()
                x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
                # all-reduce gradients only on the last micro-step of the accumulation
                sync = contextlib.nullcontext() if not d.ddp or micro == accum - 1 else model.no_sync()
                with sync:
                    with autocast:
                        _, loss = model(x, y)
                        loss = loss / accum
                    loss_sum += loss.detach()
                    loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            loss_value = distributed.all_reduce_mean(loss_sum, d).item()
            stop_if_not_finite(step, loss_value, norm.item(), lr, raw_model, cfg.run.out_dir, "--max-lr")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if d.device_type == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
            tok_per_s = o.total_batch_size / dt
            mfu = raw_model.estimate_mfu(tok_per_s / d.world_size, o.seq_len, device_name)
            if d.master and step % cfg.run.log_interval == 0:
                mfu_text = f" | mfu {100 * mfu:.1f}%" if mfu is not None else ""
                print(f"step {step:5d} | loss {loss_value:.6f} | lr {lr:.4e} | norm {norm.item():.4f} | "
                      f"dt {1000 * dt:.1f}ms | tok/sec {tok_per_s:.0f}{mfu_text}", flush=True)
            log.scalar(step, "train", loss_value)
            log.record(step, kind="train", loss=loss_value, lr=lr, grad_norm=norm.item(), dt_ms=1000 * dt,
                       tok_per_s=tok_per_s, mfu=mfu, tokens=(step + 1) * o.total_batch_size)
            step += 1

            stopping = distributed.any_rank(stop.requested, d)
            if step % cfg.run.checkpoint_interval == 0 or step == o.max_steps or stopping:
                state = {"kind": "gpt2", "model": raw_model.state_dict(), "model_config": dataclasses.asdict(cfg.model),
                         "config": to_dict(cfg), "optimizer": optimizer.state_dict(), "val_loss": val}
                save_training_checkpoint(state, train_loader, d, cfg.run.out_dir, step, cfg.run.keep_checkpoints)
            if stopping:
                break
    finally:  # also on a NaN stop or an exception: leave signal handlers and the process group as found
        stop.close()
        log.close()
        distributed.cleanup(d)
    return raw_model


def unwrap_ddp(model):
    return model.module if isinstance(model, DDP) else model


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__ + "\noptions (default):\n" + help_text(TrainConfig))
        return
    try:
        cfg = load_config(TrainConfig, argv)
        train(cfg)
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
