"""training/memory.py's estimate per rank against the peak of real training steps on the CPU (peak RSS, less the
process's RSS before the model is built): plain (1 process) or --dist fsdp on 2 gloo ranks.

    python bench/memory_estimate.py                        # 1 process, float32
    torchrun --nproc_per_node 2 bench/memory_estimate.py   # FSDP over 2 ranks (training/fsdp.py's layout)
    python bench/memory_estimate.py --activation-checkpointing
    torchrun --nproc_per_node 2 bench/memory_estimate.py --checkpoint sharded --out /tmp/ckpt   # or whole

Each rank trains 3 steps (AdamW's state exists from the first) of the GPT --shape on random tokens and prints
its measured peak, the estimate and their ratio. The shape's default keeps the run under ~2 GB per rank.
With --checkpoint, each rank then saves the training state and prints its peak RSS during the save above its RSS
before it (Linux: freed memory is returned with malloc_trim and the peak reset through /proc/self/clear_refs, so
training's own peak does not hide it): `sharded`
as the trainer saves an FSDP run (training/sharded_checkpoint.py), `whole` gathered on rank 0 and torch.save'd
there (the full state dicts of torch.distributed.checkpoint.state_dict: what a consolidated save costs).
"""
import argparse
import ctypes
import json
import resource
import sys
from dataclasses import replace
from pathlib import Path

import torch

from model import GPTConfig
from train_gpt2 import TrainConfig, build_model, memory_shape
from training import distributed, fsdp, memory
from training.loop import Context
from training.optimizer import adamw

SHAPE = dict(n_layer=6, n_embd=512, n_head=8, vocab_size=16384, block_size=256)


def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=json.loads, default=SHAPE)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--act", default="gelu")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--checkpoint", choices=("sharded", "whole"), help="then save the state, into --out")
    p.add_argument("--out", default="bench_checkpoint")
    a = p.parse_args(argv)
    d = distributed.setup("cpu")
    torch.set_num_threads(1)
    config = replace(GPTConfig(**a.shape), act=a.act)
    cfg = TrainConfig(model=config)
    cfg.run = replace(cfg.run, dist="fsdp", activation_checkpointing=a.activation_checkpointing)
    x = torch.randint(0, config.vocab_size, (a.batch_size, config.block_size + 1))
    before = rss()
    model, _ = build_model(cfg, Context(d, "float32", None, None, False), None)
    optimizer = adamw(model, 1e-4, 0.1, (0.9, 0.95), 1e-8, "cpu")
    for _ in range(3):
        model(x[:, :-1], x[:, 1:])[1].backward()
        fsdp.reduce_replicated(model, d.world_size)
        fsdp.clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay allocated, as the estimate counts them
    peak = rss() - before
    est = memory.estimate(memory_shape(config), a.batch_size, config.block_size, "fsdp", d.world_size, "float32",
                          a.activation_checkpointing)
    print(f"rank {d.rank}/{d.world_size} {a.act} {a.shape} B={a.batch_size}: measured peak {peak / 2**20:,.0f} MiB, "
          f"estimate {est.total / 2**20:,.0f} MiB ({est.line()}), ratio {peak / est.total:.3f}", flush=True)
    if a.checkpoint:
        # the allocator's freed pages (training's activations) go back to the system, else a save would reuse them
        # unseen; then the peak RSS (VmHWM) restarts from the current RSS
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        before = status_bytes("VmRSS")
        save(model, optimizer, a.checkpoint, a.out, d)
        params = sum(p.numel() for p in model.parameters())  # a shard's numel is the whole tensor's
        print(f"rank {d.rank}/{d.world_size} {a.checkpoint} checkpoint of {params / 1e6:.1f}M parameters: peak "
              f"{(status_bytes('VmHWM') - before) / 2**20:,.0f} MiB above the RSS before the save", flush=True)
    distributed.cleanup(d)


def status_bytes(field):
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: the peak), in bytes."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def save(model, optimizer, how, out, d):
    """The training state saved `how`: each rank its shards, or all gathered whole on rank 0."""
    from training.checkpoint import save_checkpoint, save_training_checkpoint

    if how == "sharded":
        model_state, optimizer_state = fsdp.training_states(model, optimizer)
        state = {"kind": "gpt2", "model": model_state, "model_config": {}, "config": {}, "optimizer": optimizer_state}
        save_training_checkpoint(state, Stream(), d, out, 1, sharded=True)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=whole)
    if d.master:
        save_checkpoint({"kind": "gpt2", "model": model_state, "optimizer": optimizer_state}, out, 1)
    distributed.any_rank(False, d)  # the others wait for rank 0's file


class Stream:
    """A data loader's place in its stream, for save_training_checkpoint."""

    def state_dict(self):
        return {}


if __name__ == "__main__":
    main(sys.argv[1:])
