"""torchrun-aware setup: one process per device, NCCL on CUDA, gloo on CPU. Nothing home-made:
world size, ranks and rendezvous (several nodes included) come from torchrun's environment."""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def ddp(self):
        return self.world_size > 1

    @property
    def master(self):
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(":")[0]


def pick_device(requested="auto"):
    if requested != "auto":
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"--device {requested} asked for, but torch sees no CUDA device; use --device cpu")
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def setup(requested_device="auto"):
    """Initialise the process group when launched by torchrun; a plain `python` run is world size 1."""
    if "RANK" not in os.environ:
        return Dist(device=pick_device(requested_device))
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device(requested_device)
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")
    return Dist(rank, local_rank, world, device)


def cleanup(d):
    if d.ddp and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(tensor, d):
    if d.ddp:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG if d.device_type == "cuda" else dist.ReduceOp.SUM)
        if d.device_type != "cuda":
            tensor /= d.world_size  # gloo has no AVG
    return tensor


def any_rank(flag, d):
    """True on every rank when `flag` is true on at least one (so all ranks stop together)."""
    if not d.ddp:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather_objects(obj, d):
    """Every rank's `obj`, as a list on every rank (used for per-rank RNG states in checkpoints)."""
    if not d.ddp:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out
