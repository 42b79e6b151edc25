"""Compiled training of an encoder-decoder stack (the translation Transformer): each layer compiled on its own.

Compiling the whole model traces its 12 layers into one graph and compiles it again for every batch shape
(BENCHMARKS.md, "Translation: each layer compiled once"). Layers of one structure run the
same code, so dynamo compiles that code once and every layer of the stack reuses it (its parameters are inputs
of the graph, not constants): compile time no longer grows with depth (torchtune's and torchtitan's per-block
compile; PyTorch's "regional compilation" recipe). Batch and sequence dimensions are dynamic, so one graph
serves every padded length; all padded shapes run once in an untimed warm-up before the first step, and a
training step that would compile after it is an error (`no_recompiles`) instead of a silent stall.
Embeddings, the output projection and the loss stay eager: evaluation and decoding use the uncompiled model.
Measured by `bench/translation_compile.py` (BENCHMARKS.md, "Translation: each layer compiled once").
"""
import contextlib
import time

import torch
import torch.nn as nn
from torch._dynamo.utils import counters

from training.loop import allow_recompiles


class RegionallyCompiled(nn.Module):
    """model(src, tgt_in) with its encoder and decoder layers compiled; `model` itself stays eager."""

    def __init__(self, model, mode="default", dynamic=True, backend="inductor"):
        super().__init__()
        self.model = model
        # plain lists, not submodules: the state dict, parameters and DDP see the model's own names
        self.encoder_layers = [torch.compile(layer, mode=mode, dynamic=dynamic, backend=backend)
                               for layer in model.encoder]
        self.decoder_layers = [torch.compile(layer, mode=mode, dynamic=dynamic, backend=backend)
                               for layer in model.decoder]

    def forward(self, src, tgt_in):
        memory, mask = self.model.encode(src, self.encoder_layers)
        return self.model.decode(tgt_in, memory, mask, layers=self.decoder_layers)


def compiled_graphs():
    """Graphs dynamo has compiled in this process (every frame, every recompile)."""
    return counters["stats"]["unique_graphs"]


def warm_up(compiled, model, shapes, autocast, device):
    """Forward and backward of one batch of each (rows, length) shape in training mode, compiling every graph
    the steps will run; `model` is left as it was (buffers such as NSwish/NReLU's pending statistics, no
    gradients, the RNG streams dropout drew from). Returns (seconds, graphs compiled)."""
    cfg, device = model.cfg, torch.device(device)
    allow_recompiles(len(shapes) * (cfg.enc_layers + cfg.dec_layers))  # a static compile's worst case
    buffers = [(b, b.clone()) for b in model.buffers()]
    graphs, start = compiled_graphs(), time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for rows, length in shapes:
            src = torch.full((rows, length), cfg.eos_id, device=device)
            tgt = torch.full((rows, length), cfg.bos_id, device=device)
            with autocast:
                loss = model.loss(compiled(src, tgt), src)
            loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    for buffer, saved in buffers:
        buffer.copy_(saved)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start, compiled_graphs() - graphs


@contextlib.contextmanager
def no_recompiles(shape):
    """A compiled step after the warm-up: compiling again (a shape or a guard the warm-up missed) stops the run
    with the reason, rather than spending minutes on it or falling back to eager at dynamo's recompile limit."""
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            yield
    except torch._dynamo.exc.RecompileError as e:
        reason = str(e).strip().splitlines()
        raise SystemExit(f"a training batch of shape {tuple(shape)} needed a new compiled graph after the warm-up "
                         f"compiled every padded shape ({reason[-1] if reason else 'no reason given'}); "
                         "train with --compile false and report it") from None
