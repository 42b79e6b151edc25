"""What bench/train_step.py keeps alive from contender to contender, on the CPU: the bytes of every tensor Python can
reach (a kept loss, logits or autograd graph counts: saved tensors are tensors) right after each contender's
measurement, beside what the contenders alive then should hold (their weights, optimizer state and batches).

    python bench/contender_memory.py                       # reference,gelu,aglu,nswish at 1 layer, n_embd 64, B=4
    python bench/contender_memory.py --acts gelu,aglu --batch-size 8

Any revision: it drives that revision's bench/train_step.py main() (PYTHONPATH picks which) and counts after each
call of its saved_for_backward_bytes, the last thing measured of a contender. On a GPU the same bytes are
torch.cuda.memory_allocated(): a graph kept per contender there was the OOM of bench/gpu_check.py's step section.
"""
import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

from bench import train_step

SHAPE = '{"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 512, "block_size": 64}'


def live_bytes():
    """Bytes of the distinct storages of every CPU tensor the collector tracks. After gc.freeze() it leaves out
    what existed then, and the scan is short."""
    tensors = [o for o in gc.get_objects() if type(o) in (torch.Tensor, torch.nn.Parameter) and o.device.type == "cpu"]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--acts", default="reference,gelu,aglu,nswish")
    p.add_argument("--batch-size", default="4")
    args = p.parse_args(argv)
    after, measure = [], train_step.saved_for_backward_bytes

    def counted(*a, **k):
        saved = measure(*a, **k)
        gc.collect()
        after.append(live_bytes())
        return saved

    train_step.saved_for_backward_bytes = counted
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory() as tmp:  # sys.argv: an older main() takes no argv
        sys.argv = ["bench/train_step.py", "--acts", args.acts, "--shape", SHAPE, "--batch-size", args.batch_size,
                    "--seq-len", "64", "--rounds", "1", "--steps", "1", "--warmup", "1", "--no-peak",
                    "--json", f"{tmp}/steps.json"]
        train_step.main()
        results = json.loads(Path(f"{tmp}/steps.json").read_text())["results"]
    gc.collect()
    left = live_bytes()
    # frozen objects are never collected, not even at exit: Triton's, still referenced then, made nanobind print
    # ~80 lines of "nanobind: leaked ..." after the table
    gc.unfreeze()
    print(f"{'contender':10s} {'saved MiB':>9s} {'held MiB':>8s} {'alive after its measurement, MiB':>33s}")
    for (label, r), alive in zip(results.items(), after):
        held = f"{r['held_bytes'] / 2**20:8.2f}" if "held_bytes" in r else f"{'n/a':>8s}"  # older revisions: n/a
        print(f"{label:10s} {r['saved_bytes'] / 2**20:9.2f} {held} {alive / 2**20:33.2f}")
    print(f"alive after the run: {left / 2**20:.2f} MiB (torch {torch.__version__})")

if __name__ == "__main__":
    main()
