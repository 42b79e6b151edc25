"""torchrun-aware setup: one process per device, NCCL on CUDA, gloo on CPU. Nothing home-made:
world size, ranks and rendezvous (several nodes included) come from torchrun's environment.

Elastic restarts (`torchrun --max-restarts N`): torchrun restarts every worker, but by default the workers
share its agent's store, which keeps the previous attempt's keys, and a re-formed group that reads them
connects to the dead workers' addresses (gloo: `connectFullMesh failed ... Connection refused`). On one node
each attempt therefore builds its group in its own PrefixStore named by TORCHELASTIC_RESTART_COUNT and by the
groups this worker set up before (a driver or notebook that trains twice in one torchrun job: its second group
must not read the first one's keys either); gloo and NCCL both exchange their setup through it. On several
nodes those counts can differ between nodes (an agent that restarts for another node's failure does not count
it), so there torchrun must be started with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch then makes a fresh
store for every rendezvous round.

A stalled rank: every collective waits at most --dist-timeout seconds (torch's own process-group timeout);
`stalled_ranks` then asks the store which ranks still answer, so the error can name the one that does not.
"""
import itertools
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from errors import DistributedError


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: 0 on the first attempt
    store: object = None  # this attempt's store (torch.distributed.Store), for naming stalled ranks
    timeout: float = 600.0  # seconds any collective may wait

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
            raise DistributedError(f"--device {requested} asked for, but torch sees no CUDA device; use --device cpu")
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


_GROUP_NUMBERS = itertools.count()  # the process groups this worker builds, numbered for the store prefix


def setup(requested_device="auto", timeout=600.0):
    """Initialise the process group when launched by torchrun; a plain `python` run is world size 1.
    `timeout`: seconds a collective (or the group's setup) may wait for the other ranks."""
    if "RANK" not in os.environ:
        return Dist(device=pick_device(requested_device), timeout=timeout)
    local_rank, restart = int(os.environ["LOCAL_RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    shared_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent's store outlives attempts
    if shared_store and int(os.environ.get("GROUP_WORLD_SIZE", 1)) > 1 and \
            int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0:
        # Each node's agent counts restarts itself (one that restarts for another node's failure does not count
        # it), so the attempt prefix would differ between nodes; torch's own per-round store avoids stale keys.
        raise DistributedError("torchrun --max-restarts on several nodes: start torchrun with "
                                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment on every node, so that each "
                                 "restart gets a fresh store (docs/fault_tolerance.md)")
    device = pick_device(requested_device)
    wait = timedelta(seconds=timeout)
    # torch's env:// rendezvous (MASTER_ADDR/PORT: torchrun's agent store, or rank 0's), as init_process_group
    # would do itself, but with the attempt's own key prefix
    store, rank, world = next(dist.rendezvous("env://", timeout=wait))
    store.set_timeout(wait)
    if shared_store:
        # every rank sets up its groups in the same order, so the numbers agree
        store = dist.PrefixStore(f"nanoact/attempt{restart}/group{next(_GROUP_NUMBERS)}/", store)
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=wait,
                                device_id=torch.device(device))
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
    return Dist(rank, local_rank, world, device, restart, store, timeout)


def collective_failure(error):
    """"timeout" for a collective that waited longer than the process group's timeout, "peer" for one whose
    peer went away (killed, crashed: torchrun restarts or ends the job), else None (gloo's and NCCL's words)."""
    text = str(error)
    if not isinstance(error, RuntimeError):
        return None
    if any(words in text for words in ("Timed out", "timed out", "timeout", "Timeout")):
        return "timeout"
    if any(words in text for words in ("closed by peer", "reset by peer", "Broken pipe", "NCCL communicator was aborted")):
        return "peer"
    return None


def stalled_ranks(d, grace):
    """After a timeout: the ranks that do not check in through the store within `grace` seconds.
    Every live rank that timed out calls this and checks in; a store that no longer answers gives None."""
    try:
        d.store.set(f"alive/{d.rank}", "1")
        keys = [f"alive/{r}" for r in range(d.world_size)]
        deadline = time.monotonic() + grace
        while not d.store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [r for r, key in enumerate(keys) if not d.store.check([key])]
    except RuntimeError:  # the store itself is on the stalled node
        return None


def failure_message(error, d, waiting):
    """The one line a rank ends with when a collective failed, or None if `error` is something else.
    `waiting` is (step, what the rank was waiting for), kept by the training loop as it goes."""
    failure = collective_failure(error) if d.ddp else None
    if failure is None:
        return None
    step, what = waiting
    if failure == "peer":
        reason = re.sub(r"^\[[^\]]*\]\s*", "", str(error).splitlines()[0]).split(". ")[0]  # gloo: "[file:line] What."
        return (f"error: step {step}: rank {d.rank} lost a peer during {what} ({reason}); "
                "torchrun --max-restarts restarts the group from the newest checkpoint, else rerun with --auto-resume")
    missing = stalled_ranks(d, grace=min(d.timeout, 30))
    who = ("no rank answered through torchrun's store afterwards (its host may be the one stalled)" if missing is None
           else f"rank {', '.join(map(str, missing))} did not answer afterwards (stalled or dead: check that "
                "process and its node)" if missing else "every rank answered afterwards: one was slow, not stuck")
    return (f"error: step {step}: rank {d.rank} waited more than {d.timeout:g}s (--dist-timeout) for {what}; "
            f"{who}; stopping this rank. Restart with --auto-resume (torchrun --max-restarts does it itself), "
            "or raise --dist-timeout if such a wait is expected")


def cleanup(d):
    if d.ddp and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(tensor, d):
    if d.ddp:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG if d.device_type == "cuda" else dist.ReduceOp.SUM)
        if d.device_type != "cuda":
            tensor /= d.world_size  # gloo has no AVG
    return tensor


def all_reduce_sum(tensor, d):
    if d.ddp:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag, d):
    """True on every rank when `flag` is true on at least one (so all ranks stop together)."""
    if not d.ddp:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def before_collective(work, d):
    """work() (it must use no collective), then one all-reduce saying whether it raised on any rank: every rank
    raises before the collective that follows, so a failure on one rank (a CUDA OOM on one GPU) never leaves the
    others waiting in that collective for it. Returns work()'s result."""
    error = None
    try:
        result = work()
    except Exception as e:
        if not d.ddp:
            raise
        error = e
    if any_rank(error is not None, d):
        raise error or RuntimeError("this work failed on another rank (that rank's log has its traceback)")
    return result


def gather_objects(obj, d):
    """Every rank's `obj`, as a list on every rank (used for per-rank RNG states in checkpoints)."""
    if not d.ddp:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out
