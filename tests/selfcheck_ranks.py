"""tests/test_selfcheck.py's 2 gloo ranks, a command of tests/two_rank_runs.py's job (`python ... OUT`): "auto"
decides with tests/probe_work.by_rank's verdicts (rank 1's AGLU kernel fails), and each rank writes OUT.RANK.json
(its decisions, the paths its modules took, the all-reduces in all). The job's later commands share these
worker processes: the settings patched here are restored."""
import json
import sys

import torch
import torch.distributed as dist

import activations
from activations import impl, policy
from training.distributed import setup
from training.hardware import Platform

if __name__ == "__main__":  # policy's child processes start by importing this file, as the parent's main module
    import probe_work
    kernel_devices, all_reduce = impl.KERNEL_DEVICES, dist.all_reduce
    impl.KERNEL_DEVICES = ("cuda", "cpu")
    d = setup("cpu")
    collectives = []
    dist.all_reduce = lambda *a, **k: collectives.append(1) or all_reduce(*a, **k)
    try:
        model = torch.nn.Sequential(activations.build("aglu"), activations.build("nswish"))
        # a verdict cache per rank: two machines, so that rank 1's failure is its own
        decisions = policy.select(model, (8, 64), Platform("cpu", "cpu", triton="3"), "cpu", torch.float32, False,
                                  d, cache=f"{sys.argv[1]}.cache{d.rank}", work=probe_work.by_rank)
    finally:
        impl.KERNEL_DEVICES, dist.all_reduce = kernel_devices, all_reduce
    with open(sys.argv[1] + f".{d.rank}.json", "w") as f:
        json.dump({"decisions": decisions, "impls": [m.impl for m in model], "collectives": len(collectives)}, f)
    dist.destroy_process_group()
