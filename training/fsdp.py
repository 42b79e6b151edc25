"""--dist fsdp: the model sharded over the ranks with FSDP2 (torch.distributed.fsdp.fully_shard), so that each
rank holds 1/world_size of the parameters, gradients and AdamW moments instead of all of them (DDP).

The layout is torchtitan's: one FSDP group per transformer block, one for the tied token embedding and output
head together (a weight that two groups see raises on recent torch: accelerate #4171, torchtitan #2495), and
the root for what remains (positions, the final norm). Every group all-gathers its parameters before its
forward and backward and reduce-scatters the gradients after; under --dtype bfloat16 the gathered parameters
are bfloat16 and the gradients are reduced in float32 (MixedPrecisionPolicy), the sharded master copy and
AdamW's state staying float32.

A model too large for one process is built on the meta device (`meta_init`): only the tensors that
nn.Linear and nn.Embedding allocate with torch.empty (>= 2-D, every one drawn by the model's init) stay
unallocated; the small ones (biases, norms, an activation's scalars and buffers) are built and drawn as in a
plain build. After sharding, each rank draws every large parameter in full from its own stream
(activations/init_streams.py) and keeps its shard: the same weights as the plain build for a seed.

Checkpoints are sharded: each rank's shards of the weights and AdamW's state (training_states) are written by
that rank through torch.distributed.checkpoint, with a JSON index instead of DCP's pickled metadata
(training/sharded_checkpoint.py), and read back into any layout (load_sharded_training_states): no process ever
holds the whole training state.

A vocabulary that does not divide by the world size leaves the last rank a shorter shard of the tied
embedding (pytorch #176076: rows of that shard were not updated on some versions); tests/test_fsdp.py checks
that every row moves as under DDP on a split that is uneven.
"""
import contextlib
import functools
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from activations.init_streams import draw_parameter
from errors import ConfigError

DISTS = ("ddp", "fsdp", "hsdp")
SHARDED = ("fsdp", "hsdp")


# torch.distributed's fsdp, tensor and checkpoint modules cost about a CPU-second to import: imported where a model
# is sharded, so that a DDP run and every script reading checkpoints do without. A tensor or module can only be
# FSDP's once they are imported.
def _is_dtensor(tensor):
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def _whole_options(cpu_offload):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def check_dist(name):
    if name not in DISTS:
        raise ConfigError(f"unknown dist {name!r}; choose {', '.join(DISTS[:-1])} or {DISTS[-1]}")


def shard_group_size(dist, world_size, local_world_size):
    """The ranks one copy of the model is sharded over: every rank under fsdp; under hsdp a node's (torchrun's
    LOCAL_WORLD_SIZE), the nodes holding replicas that all-reduce their gradients, so that the all-gathers and
    reduce-scatters of every step stay on a node's fast links and only one all-reduce crosses nodes."""
    if dist != "hsdp":
        return world_size
    if world_size % local_world_size:
        raise ConfigError(f"--dist hsdp: {world_size} ranks do not split into nodes of {local_world_size}; "
                          "give every node the same number of processes (torchrun --nproc-per-node)")
    return local_world_size


class _LargeOnMeta(TorchFunctionMode):
    """torch.empty of >= 2 dimensions on the meta device: nn.Linear's and nn.Embedding's weights."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty and kwargs.get("device") is None:
            shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            if len(shape) >= 2:
                kwargs["device"] = "meta"
        return func(*args, **kwargs)


def meta_init():
    """The context a model is built in for sharding: its large weights unallocated (see the module's docstring)."""
    return _LargeOnMeta()


def shard(model, groups, precision, device, world_size, shard_size=None):
    """fully_shard each module (or list of modules sharing a weight) of `groups`, then the root `model`, over
    `shard_size` ranks (all of them by default); fewer: HSDP, a 2-D mesh of world_size / shard_size replicas.
    precision: the run's (bfloat16: bfloat16 parameters in compute, float32 gradient reduction)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shard_size = shard_size or world_size
    if shard_size == world_size:
        mesh = init_device_mesh(torch.device(device).type, (world_size,))
    else:  # fully_shard takes a 2-D mesh as (replicate, shard)
        mesh = init_device_mesh(torch.device(device).type, (world_size // shard_size, shard_size),
                                mesh_dim_names=("replicate", "shard"))
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(precision)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    # fully_shard refuses 0-D parameters (an activation's scalars, DyT's alpha): each rank keeps them whole and
    # reduce_replicated averages their gradients, as DDP would
    scalars = {p for p in model.parameters() if p.dim() == 0}
    for group in groups:
        fully_shard(group, mesh=mesh, mp_policy=policy, ignored_params=scalars)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=scalars)
    return model


def replicated(model):
    """The parameters of a sharded model that every rank holds whole (shard's scalars)."""
    return [p for p in model.parameters() if not _is_dtensor(p)]


def reduce_replicated(model, world_size):
    """After a sharded model's backward: the mean over ranks of its replicated parameters' gradients (one
    all-reduce); FSDP has reduce-scattered the others."""
    if sharded_root(model) is None:
        return
    grads = [p.grad for p in replicated(model) if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def clip_grad_norm(model, max_norm):
    """torch's clip_grad_norm_ over all of `model`'s gradients; a sharded model's norm is taken over every
    rank's shards and its replicated parameters together. Returns the norm before clipping, a plain tensor."""
    params = [p for p in model.parameters() if p.grad is not None]
    if sharded_root(model) is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    sharded = [p.grad for p in params if _is_dtensor(p.grad)]
    whole = [p.grad for p in params if not _is_dtensor(p.grad)]
    parts = [full_value(torch.nn.utils.get_total_norm(sharded))] if sharded else []
    if whole:
        parts.append(torch.nn.utils.get_total_norm(whole))
    norm = torch.linalg.vector_norm(torch.stack(parts))
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # torch's clip coefficient
    for grad in [*sharded, *whole]:
        local_value(grad).mul_(scale)
    return norm


@torch.no_grad()
def materialize(model, small, seed, init, device):
    """After shard(): allocate the meta model on `device`, put back the `small` tensors ({name: value} of the
    parameters and buffers built for real) and draw every other parameter in full from its stream, keeping this
    rank's shard. A large buffer has no init rule here: refused."""
    large = [name for name, p in model.named_parameters() if name not in small]
    meta_buffers = [name for name, b in model.named_buffers() if b.is_meta]
    if meta_buffers:
        raise ConfigError(f"buffers {meta_buffers[:3]} were built on the meta device and have no init rule; "
                          "build them with a factory other than torch.empty")
    model.to_empty(device=device)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name in small:
            value = small[name].to(device)
        elif name in large:
            value = torch.empty(tensor.shape, dtype=tensor.dtype)
            draw_parameter(model, name, value, seed, init)
        else:
            continue
        if _is_dtensor(tensor):  # every rank drew the whole tensor: each keeps its own shard, no messages
            from torch.distributed.tensor import distribute_tensor

            value = distribute_tensor(value.to(device), tensor.device_mesh, tensor.placements, src_data_rank=None)
        tensor.copy_(value)


def real_tensors(model):
    """{name: a copy} of the parameters and buffers of a meta_init model that were built for real."""
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]
            if not t.is_meta}


def checkpoint_activations(block):
    """Recompute `block`'s activations in backward instead of keeping them (torch.utils.checkpoint, non-reentrant:
    the recomputed forward draws the same dropout masks). A forward with a cache (generation) is left as it is."""
    forward = block.forward

    @functools.wraps(forward)
    def recomputed(x, cache=None):
        if cache is None and torch.is_grad_enabled():
            return checkpoint(forward, x, use_reentrant=False)
        return forward(x, cache)

    block.forward = recomputed


def sharded_root(model):
    """The FSDP2 module under a torch.compile wrapper, or None when `model` is not sharded."""
    inner = getattr(model, "_orig_mod", model)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return inner if fsdp is not None and isinstance(inner, fsdp.FSDPModule) else None


def gradient_sync(model, last):
    """Gradient accumulation: FSDP reduce-scatters only on the last micro-step (DDP's no_sync); a context."""
    root = sharded_root(model)
    if root is not None:
        root.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def full_value(tensor):
    """A DTensor's whole value (an all-gather: every rank calls it); a plain tensor as it is."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def local_value(tensor):
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor



def training_states(model, optimizer):
    """(model state, optimizer state) as a checkpoint stores them. Sharded: this rank's shards (DTensors), the
    optimizer's state keyed by parameter name (torch.distributed.checkpoint.state_dict's), for
    training/sharded_checkpoint.py to write, so that any world size, sharded or not, reads them."""
    if sharded_root(model) is None:
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer)


def load_sharded_training_states(model, optimizer, read_into, param_groups):
    """Load a sharded checkpoint into this run's layout, sharded or not: `read_into` (Shards.read_into) fills
    this model's and optimizer's state dicts in place, each rank reading its own chunks (DCP reshards), and
    `param_groups` (keyed by name) come from the checkpoint's state.pt."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # get_state_dict creates a fresh optimizer's moments (a step at lr 0), so that there is a state to fill
    model_state, optimizer_state = get_state_dict(model, optimizer)
    read_into({"model": model_state, "optimizer": {"state": optimizer_state["state"]}})
    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict={"state": optimizer_state["state"], "param_groups": param_groups})


def whole_model_state(model):
    """A sharded model's weights whole on rank 0 (a collective), {} elsewhere; an unsharded model's state_dict."""
    if sharded_root(model) is None:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_whole_options(cpu_offload=True))


def load_training_states(model, optimizer, model_state, optimizer_state):
    """Load what training_states saved, on this run's layout: DDP's (optimizer state keyed by position) or a
    sharded run's (keyed by name) into a sharded or unsharded model alike."""
    by_name = any(isinstance(p, str) for group in optimizer_state["param_groups"] for p in group["params"])
    if sharded_root(model) is None and not by_name:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    if not by_name:
        optimizer_state = named_optimizer_state(model, optimizer, optimizer_state)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = _whole_options(cpu_offload=False)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def named_optimizer_state(model, optimizer, state):
    """optimizer.state_dict()'s positional keys -> parameter names, by the position of each parameter in this
    run's optimizer (built as the one that saved it)."""
    names = {p: name for name, p in model.named_parameters()}
    saved = [i for group in state["param_groups"] for i in group["params"]]
    ours = [names[p] for group in optimizer.param_groups for p in group["params"]]
    if len(saved) != len(ours):
        raise ConfigError(f"the checkpoint's optimizer holds {len(saved)} parameters, this model {len(ours)}")
    name = dict(zip(saved, ours))
    return {"state": {name[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [name[i] for i in group["params"]]}
                             for group in state["param_groups"]]}
