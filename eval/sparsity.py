"""Activation sparsity of GPT-2's MLPs, as each paper in the literature defines it.

A neuron i of an MLP is the i-th input a_i of its down projection c_proj (a gated MLP's product act(gate) * up);
its contribution to the MLP's output is n_i = a_i W[:, i], of norm |a_i| ||W[:, i]||.
- zeros: the fraction of a_i that are exactly 0 (ReLU-family sparsity).
- dead: the fraction of neurons that are 0 on every evaluated token (only a true zero counts, so GELU has none).
- CETT (Zhang et al. 2024, "ReLU^2 Wins", Eq. 2): a threshold eps drops the neurons with ||n_i|| < eps, and
  CETT(eps) = ||sum of the dropped n_i|| / ||sum of all n_i||, per token, averaged. Each layer's eps is found by
  bisection so that its CETT is the target (the paper's 0.2); the sparsity is the fraction of neurons dropped.
- top-k at the same target: one k per layer, every token keeping its k largest ||n_i||, the smallest k whose CETT
  is within the target.
- PPL-p% sparsity (Luo et al. 2024, "Sparsing Law", §3): one CETT target for every layer, thresholds calibrated as
  above on the untruncated activations (to 1/32 of a layer's neurons), raised by bisection until the truncated
  model's perplexity on held-out tokens is (1 + p/100) times the dense one; the sparsity of that model.
"""
import contextlib
import math

import torch

BISECTIONS = 8  # of the PPL-p% search's CETT target in (0, 1): to 1/256, each a held-out pass
GRID = 32  # the PPL-p% search truncates each layer at one of 32 quantiles of its neurons' sizes


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


def cett(a, weight, keep, full=None):
    """Mean over tokens of ||W (a * ~keep)|| / ||W a||: the share of the output the dropped neurons carry. full:
    ||W a|| per token, when the caller already has it (a search asks for many keeps of one a)."""
    full = (a @ weight.t()).norm(dim=-1) if full is None else full
    dropped = ((a * ~keep) @ weight.t()).norm(dim=-1)
    return (dropped / full.clamp_min(torch.finfo(full.dtype).tiny)).mean().item()


def cett_threshold(a, weight, target):
    """(eps, sparsity): the largest threshold whose CETT is within `target`, and the fraction of neurons it drops.
    CETT only changes at the neurons' own sizes, so the bisection runs over them, sorted: exact, no tolerance."""
    size = a.abs() * weight.norm(dim=0)
    values, full = size.flatten().unique(), (a @ weight.t()).norm(dim=-1)  # values[0] drops nothing: CETT 0
    lo, hi = 0, values.numel() - 1
    while lo < hi:  # the largest index whose threshold keeps CETT <= target
        k = (lo + hi + 1) // 2
        lo, hi = (k, hi) if cett(a, weight, size >= values[k], full) <= target else (lo, k - 1)
    eps = values[lo]
    return eps.item(), (size < eps).float().mean().item()


def topk_sparsity(a, weight, target):
    """The sparsity of the smallest per-layer k whose every-token top-k keeps CETT within `target`."""
    size = a.abs() * weight.norm(dim=0)
    order, full = size.argsort(dim=-1, descending=True), (a @ weight.t()).norm(dim=-1)
    lo, hi = 0, a.size(-1)  # CETT(hi) = 0 <= target; find the smallest k with CETT(k) <= target
    while lo < hi:
        k = (lo + hi) // 2
        keep = torch.zeros_like(a, dtype=torch.bool).scatter_(-1, order[:, :k], True)
        lo, hi = (lo, k) if cett(a, weight, keep, full) <= target else (k + 1, hi)
    return 1 - hi / a.size(-1)


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


def cett_curve(a, weight, levels=GRID):
    """(thresholds, CETT at each): the thresholds that drop 0, 1/levels, 2/levels ... of the neurons (quantiles of
    their sizes), and the CETT each gives; CETT grows along it."""
    size = a.abs() * weight.norm(dim=0)
    sorted_sizes = size.flatten().sort().values
    index = (torch.arange(levels + 1) * (sorted_sizes.numel() - 1)) // levels
    thresholds, full = torch.cat([torch.zeros(1), sorted_sizes[index[1:]]]), (a @ weight.t()).norm(dim=-1)
    return thresholds, torch.tensor([cett(a, weight, size >= eps, full) for eps in thresholds])


def ppl_sparsity(model, batches, neurons, p):
    """PPL-p% sparsity: (the common CETT target, the mean fraction of neurons dropped, per layer), where the
    truncated model's perplexity is (1 + p/100) times the dense model's. Each step of the search truncates every
    layer at the largest threshold of its CETT curve within the target: to 1/GRID of its neurons, so that the
    search costs forward passes, not a calibration each."""
    weights = dict(mlp_neurons(model))
    curves = {n: cett_curve(torch.cat(a), weights[n].weight.detach().float()) for n, a in neurons.items()}
    dense, _ = mean_loss(model, batches)
    goal = dense + math.log1p(p / 100)  # perplexity ratio -> loss difference

    def thresholds(target):
        return {n: eps[cett_at <= target].max().item() for n, (eps, cett_at) in curves.items()}
    lo, hi, best = 0.0, 1.0, {n: 0.0 for n in neurons}
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
    for name, proj in mlp_neurons(model):
        a, w = torch.cat(neurons[name]), proj.weight.detach().float()
        eps, layers[name]["cett"] = cett_threshold(a, w, cett_target)
        layers[name]["cett_eps"] = eps
        layers[name]["topk"] = topk_sparsity(a, w, cett_target)
    model_mean = {k: sum(v[k] for v in layers.values()) / len(layers) for k in ("zeros", "dead", "cett", "topk")}
    ppl = {}
    for p in ppl_p:
        target, mean, per_layer = ppl_sparsity(model, batches, neurons, p)
        ppl[f"{p:g}"] = {"cett_target": target, "sparsity": mean, "layers": per_layer}
    return {"cett_target": cett_target, "layers": layers, "model": model_mean, "ppl": ppl}
