"""training/memory.py's estimate per rank against the peak of real training steps on the CPU (peak RSS, less the
process's RSS before the model is built): plain (1 process) or --dist fsdp on 2 gloo ranks.

    python bench/memory_estimate.py                        # 1 process, float32
    torchrun --nproc_per_node 2 bench/memory_estimate.py   # FSDP over 2 ranks (training/fsdp.py's layout)
    python bench/memory_estimate.py --activation-checkpointing

Each rank trains 3 steps (AdamW's state exists from the first) of the GPT --shape on random tokens and prints
its measured peak, the estimate and their ratio. The shape's default keeps the run under ~2 GB per rank.
"""
import argparse
import json
import resource
import sys
from dataclasses import replace

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
    distributed.cleanup(d)


if __name__ == "__main__":
    main(sys.argv[1:])
