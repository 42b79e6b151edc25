"""Each parameter's init drawn from a random stream of its own: a generator seeded by (seed, its qualified name).

Models compared at one seed differ in a few modules: a gated MLP adds c_up, AGLU adds kappa and lam. Drawn in
build order from torch's one global generator, every weight built after such a module would start elsewhere,
and an activation pair would share its data order but not its starting point. Drawn from its own stream, a
parameter's start depends only on the seed, its name, its shape and its init rule: two models start equal on
every parameter they share, one with the same qualified name and shape (docs/comparing_runs.md, which names the
one rule that depends on the MLP's width), whatever else either has.
"""
import hashlib

import torch


def parameter_generator(seed, name):
    """A CPU generator seeded by (seed, name). sha256, not Python's hash(): that one is salted per process."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@torch.no_grad()
def init_parameters(model, seed, init):
    """Initialise every parameter of `model` (a tied one once, under its first name) from its own generator:
    init(name, module, parameter, generator), module being the parameter's owner. An owner with an
    `init_parameter(attr, generator)` method (an activation with a random init: AGLU's kappa and lam) draws its
    parameter itself, so a model's rule covers only its own layers."""
    for name, parameter in model.named_parameters():
        if parameter.is_meta:  # a model built on the meta device (a plan's count of FLOPs) holds nothing to draw
            continue
        draw_parameter(model, name, parameter, seed, init)


def draw_parameter(model, name, tensor, seed, init):
    """init_parameters' draw of the parameter `name` into `tensor`: the parameter itself, or a full-size stand-in
    for one that is sharded (training/fsdp.py draws it whole and keeps its shard)."""
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    generator = parameter_generator(seed, name)
    if hasattr(module, "init_parameter"):
        if tensor is not getattr(module, attr):
            raise ValueError(f"{name}: its owner draws it itself, in place; it cannot be drawn into a stand-in")
        module.init_parameter(attr, generator)
    else:
        init(name, module, tensor, generator)
