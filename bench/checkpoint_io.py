"""What verified checkpoints cost: the save and load of a GPT-2 124M training checkpoint (weights + AdamW
state, 12 bytes a parameter) with and without the sha256 sidecar and its checks. Nothing of it runs per training step;
this is the cost per checkpoint.

    python bench/checkpoint_io.py                      # GPT-2 124M, 3 rounds, files in a temporary directory
    python bench/checkpoint_io.py --dir /shared/ckpt   # on the filesystem your runs write to
    python bench/checkpoint_io.py --smoke --rounds 1   # a 2-layer, 64-wide GPT (tests the script itself)

Rows: `torch.save + fsync` is the save as it was (temporary file, fsync, rename); `save_checkpoint` adds the
checksum computed while writing, the sidecar and the read-back that verifies the file before older ones may
be deleted. `torch.load` is weights_only=True alone; `read_checkpoint_file` adds the sidecar check. Medians of
--rounds; the read-back reads from the page cache when the file is still there, as right after a save.
"""
import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from data.files import atomic_file
from model import GPT, GPTConfig
from training.checkpoint import checkpoint_path, read_checkpoint_file, save_checkpoint
from training.optimizer import adamw


def training_state(config):
    model = GPT(config, seed=0)
    optimizer = adamw(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, "cpu")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's exp_avg / exp_avg_sq: two more copies of the weights
    return {"kind": "gpt2", "model": model.state_dict(), "model_config": {}, "step": 1,
            "optimizer": optimizer.state_dict()}


def plain_save(state, out_dir, step):
    final = checkpoint_path(out_dir, step)
    with atomic_file(final, durable=True) as f:
        torch.save(state, f)
    return final


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="where the checkpoints are written (default: a temporary directory)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="a 2-layer, 64-wide GPT instead of GPT-2 124M")
    args = p.parse_args()
    state = training_state(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=512) if args.smoke else GPTConfig())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        out = Path(tmp)
        times = {name: [] for name in ("torch.save + fsync", "save_checkpoint", "torch.load", "read_checkpoint_file")}
        for _ in range(args.rounds):  # each round runs every case in turn: a transient load hits all alike
            times["torch.save + fsync"].append(timed(lambda: plain_save(state, out, 1)))
            times["save_checkpoint"].append(timed(lambda: save_checkpoint(state, out, 2)))
            times["torch.load"].append(timed(lambda: torch.load(checkpoint_path(out, 1), weights_only=True)))
            times["read_checkpoint_file"].append(timed(lambda: read_checkpoint_file(checkpoint_path(out, 2))))
        size = checkpoint_path(out, 2).stat().st_size
    print(f"{platform.node()} | {platform.processor() or platform.machine()} | torch {torch.__version__} | "
          f"{os.cpu_count()} CPUs | checkpoint {size / 2**30:.2f} GiB | {args.rounds} rounds")
    for name, values in times.items():
        print(f"{name:22s} {statistics.median(values):7.2f} s  ({size / 2**20 / statistics.median(values):,.0f} MiB/s)")


if __name__ == "__main__":
    main()
