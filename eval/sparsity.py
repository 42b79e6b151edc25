"""Activation sparsity of GPT-2's MLPs, as each paper in the literature defines it.

A neuron i of an MLP is the i-th input a_i of its down projection c_proj (a gated MLP's product act(gate) * up);
its contribution to the MLP's output is n_i = a_i W[:, i], of norm |a_i| ||W[:, i]||.
- zeros: the fraction of a_i that are exactly 0 (ReLU-family sparsity).
- dead: the fraction of neurons that are 0 on every evaluated token (only a true zero counts, so GELU has none).
- CETT (Zhang et al. 2024, "ReLU^2 Wins", Eq. 2): a threshold eps drops the neurons with ||n_i|| < eps, and
  CETT(eps) = ||sum of the dropped n_i|| / ||sum of all n_i||, per token, averaged. Each layer's eps is the largest
  whose CETT is within the target (the paper's 0.2), found by an exact scan over every threshold (curves): CETT
  is not monotone in eps, so a bisection may stop at a smaller one. The sparsity is the fraction of neurons dropped.
- top-k at the same target: one k per layer, every token keeping its k largest ||n_i||, the smallest k whose CETT
  is within the target (every k's CETT from the same scan).
- PPL-p% sparsity (Luo, Song et al. 2024, "Sparsing Law", §3, the ProSparse line's measure): one CETT target for
  every layer, each layer's exact threshold for it calibrated on the untruncated activations, the target raised
  by bisection from 0 (the dense model, whose dropped neurons are its exact zeros) while the truncated model's
  perplexity on held-out tokens stays within (1 + p/100) times the dense one; the sparsity of that model.
"""
import contextlib
import math
from typing import NamedTuple

import torch

BISECTIONS = 10  # of the PPL-p% search's CETT target in (0, 1): to 1/1024, each a held-out pass
CHUNK_ELEMENTS = 1 << 21  # the CETT scan's working set per chunk of tokens (8 MB of float32: in cache)


def mlp_neurons(model):
    """(name, c_proj module) of each GPT-2 MLP's down projection, in order."""
    return [(f"h.{i}", block.mlp.c_proj) for i, block in enumerate(model.transformer.h)]


@contextlib.contextmanager
def captured(model, store, thresholds=None):
    """Records each MLP's neurons (tokens, hidden) in `store` by layer name; with `thresholds` (layer name ->
    eps), drops the neurons whose ||n_i|| is below eps before c_proj sees them."""
    def hook(name, proj):
        norms = proj.weight.detach().float().norm(dim=0)

        def pre(module, args):
            a = args[0]
            if thresholds is not None:
                a = a * (a.detach().float().abs() * norms >= thresholds[name]).to(a.dtype)
            store.setdefault(name, []).append(a.detach().float().reshape(-1, a.size(-1)))
            return (a,)
        return proj.register_forward_pre_hook(pre)
    handles = [hook(name, proj) for name, proj in mlp_neurons(model)]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


class Curves(NamedTuple):
    """A layer's exact CETT curves. thresholds, cett, sparsity: for each threshold that is the largest feasible
    one of some target, its CETT and the fraction of neurons it drops, all three increasing. topk_cett[j]: the
    CETT when every token drops its j smallest neurons (keeps hidden - j)."""
    thresholds: torch.Tensor
    cett: torch.Tensor
    sparsity: torch.Tensor
    topk_cett: torch.Tensor


def curves(a, weight):
    """The exact CETT of every threshold and of every top-k, by one scan over the neurons sorted by size: each
    token's contributions summed in that order give its CETT after dropping its j smallest (O(tokens hidden d),
    in chunks of tokens that stay in cache); a threshold eps drops, of every token, the neurons below it, so
    summing each neuron's change to its token's CETT in the order of all sizes gives CETT(eps) at every eps.
    CETT is not monotone in eps (dropped contributions are vectors that can cancel), so a threshold is kept only
    where no larger one has a CETT as small: the largest feasible threshold of a target is then the last one
    whose CETT is within it."""
    tokens, hidden = a.shape
    w = weight.t().contiguous()
    sizes, order = (a.abs() * weight.norm(dim=0)).sort(dim=-1)
    full = (a @ w).norm(dim=-1).clamp_min(torch.finfo(a.dtype).tiny)
    ratio = torch.zeros(tokens, hidden + 1)  # [t, j]: token t's CETT with its j smallest neurons dropped
    chunk = max(1, CHUNK_ELEMENTS // w.numel())
    buffer = torch.empty(chunk * hidden, w.size(1))  # one allocation: a fresh 8 MB a chunk costs page faults
    for s in range(0, tokens, chunk):
        o = order[s:s + chunk]
        parts = torch.index_select(w, 0, o.flatten(), out=buffer[:o.numel()]).view(*o.shape, -1)
        parts.mul_(a[s:s + chunk].gather(1, o).unsqueeze(-1))
        ratio[s:s + chunk, 1:] = torch.linalg.vector_norm(parts.cumsum_(1), dim=-1)
    ratio /= full.unsqueeze(1)
    size, by_size = sizes.flatten().sort()
    change = (ratio[:, 1:] - ratio[:, :-1]).flatten()[by_size].double()
    cett_at = torch.cat([torch.zeros(1, dtype=torch.float64), change.cumsum(0)[:-1]]) / tokens  # the j smallest dropped
    # a threshold drops every size below it: a cut between equal sizes is no threshold's
    cut = torch.cat([torch.tensor([True]), size[1:] > size[:-1]]).nonzero().squeeze(1)
    lowest_after = cett_at[cut].flip(0).cummin(0).values.flip(0)
    best = torch.cat([lowest_after[1:] > lowest_after[:-1], torch.tensor([True])])
    return Curves(size[cut[best]], lowest_after[best], cut[best] / size.numel(), ratio.double().mean(dim=0))


def cett_threshold(layer, target):
    """(eps, sparsity): the largest threshold whose CETT is within `target` (a layer's Curves), and the fraction
    of neurons it drops. Exact: every threshold's CETT was computed, none is assumed from its neighbours."""
    i = torch.searchsorted(layer.cett, torch.tensor([target], dtype=torch.float64), right=True).item() - 1
    return layer.thresholds[i].item(), layer.sparsity[i].item()


def topk_sparsity(layer, target):
    """The sparsity of the smallest per-layer k whose every-token top-k keeps CETT within `target`: every k's
    CETT computed, the largest number of neurons dropped that is within it."""
    dropped = (layer.topk_cett <= target).nonzero().max().item()
    return dropped / (layer.topk_cett.numel() - 1)


def dense_sparsity(neurons):
    """Per layer: zeros (the fraction of exact zeros) and dead (neurons 0 on every token)."""
    out = {}
    for name, parts in neurons.items():
        a = torch.cat(parts)
        zero = a == 0
        out[name] = {"zeros": zero.float().mean().item(), "dead": zero.all(dim=0).float().mean().item()}
    return out


@torch.no_grad()
def on_batch(model, x, autocast=contextlib.nullcontext()):
    """zeros and dead per layer on one batch of token ids: the in-loop part (one forward)."""
    was_training = model.training
    model.eval()
    neurons = {}
    with captured(model, neurons), autocast:
        model(x, head=False)
    model.train(was_training)
    return dense_sparsity(neurons)


@torch.no_grad()
def mean_loss(model, batches, thresholds=None):
    """Mean cross-entropy over `batches` ((x, y) pairs), with the neurons below `thresholds` dropped; also returns
    the fraction of neurons dropped per layer."""
    store, losses = {}, []
    with captured(model, store, thresholds):
        for x, y in batches:
            losses.append(model(x, y)[1].item())
    dropped = {name: (torch.cat(parts) == 0).float().mean().item() for name, parts in store.items()}
    return sum(losses) / len(losses), dropped


def ppl_sparsity(model, batches, layers, p):
    """PPL-p% sparsity: (the common CETT target, the mean fraction of neurons dropped, per layer), where the
    truncated model's perplexity is within (1 + p/100) times the dense model's. `layers`: each layer's Curves on
    the untruncated neurons. The search starts from the dense model, whose dropped neurons are its exact zeros
    (target 0: a ReLU model reports at least those), and bisects the target; each step truncates every layer at
    its exact largest threshold within the target and costs one held-out pass."""
    dense, zeros = mean_loss(model, batches)
    goal = dense + math.log1p(p / 100)  # perplexity ratio -> loss difference

    def thresholds(target):
        return {n: cett_threshold(c, target)[0] for n, c in layers.items()}
    lo, hi, best = 0.0, 1.0, zeros
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        loss, dropped = mean_loss(model, batches, thresholds(mid))
        if loss <= goal:
            lo, best = mid, dropped
        else:
            hi = mid
    return lo, sum(best.values()) / len(best), best


@torch.no_grad()
def measure(model, batches, cett_target=0.2, ppl_p=(1.0,)):
    """Every sparsity above per layer and for the model (the mean over layers), on `batches`: JSON-ready."""
    model.eval()
    neurons = {}
    with captured(model, neurons):
        for x, _ in batches:
            model(x, head=False)
    layers = dense_sparsity(neurons)
    exact = {name: curves(torch.cat(neurons[name]), proj.weight.detach().float()) for name, proj in mlp_neurons(model)}
    for name, layer in exact.items():
        layers[name]["cett_eps"], layers[name]["cett"] = cett_threshold(layer, cett_target)
        layers[name]["topk"] = topk_sparsity(layer, cett_target)
    model_mean = {k: sum(v[k] for v in layers.values()) / len(layers) for k in ("zeros", "dead", "cett", "topk")}
    ppl = {}
    for p in ppl_p:
        target, mean, per_layer = ppl_sparsity(model, batches, exact, p)
        ppl[f"{p:g}"] = {"cett_target": target, "sparsity": mean, "layers": per_layer}
    return {"cett_target": cett_target, "layers": layers, "model": model_mean, "ppl": ppl}
