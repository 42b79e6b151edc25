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
  perplexity stays within (1 + p/100) times the dense one, on the first half of the held-out sequences; the
  sparsity of that model and its perplexity over the dense one on the second half, each with its standard error
  over those sequences.
"""
import contextlib
import math
from typing import NamedTuple

import numpy as np
import torch

from errors import ConfigError

BISECTIONS = 10  # of the PPL-p% search's CETT target in (0, 1): to 1/1024, each a held-out pass
CHUNK_ELEMENTS = 1 << 21  # the CETT scan's working set per chunk of tokens (float32s: in cache)


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
    buffer = torch.empty(chunk * hidden, w.size(1))  # one allocation: a fresh buffer a chunk costs page faults
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


def sequences_of(batches):
    """Each row of (x, y) batches as its own (1, T) sequence: the unit of PPL-p%'s split and standard errors."""
    return [(x[i:i + 1], y[i:i + 1]) for x, y in batches for i in range(len(x))]


def split(sequences):
    """(calibration, evaluation): the first half of the sequences, to calibrate PPL-p%'s thresholds and target on,
    and the rest, to judge them on. Contiguous halves: the shard's sequences are read in order, and interleaving
    would put the two halves of a document on both sides."""
    if len(sequences) < 4:
        raise ConfigError(f"PPL-p% needs at least 4 sequences (2 to calibrate on, 2 to judge on, for a standard "
                          f"error), got {len(sequences)}; measure more --tokens")
    half = len(sequences) // 2
    return sequences[:half], sequences[half:]


@torch.no_grad()
def sequence_losses(model, sequences, thresholds=None):
    """Each sequence's mean cross-entropy (S,) and the fraction of its neurons dropped (S,) (the mean over layers),
    one sequence a forward, with the neurons below `thresholds` dropped; and the fraction dropped per layer."""
    store, losses = {}, []
    with captured(model, store, thresholds):
        for x, y in sequences:
            losses.append(model(x, y)[1].item())
    dropped = np.array([[(a == 0).float().mean().item() for a in parts] for parts in store.values()])
    return np.array(losses), dropped.mean(axis=0), dict(zip(store, dropped.mean(axis=1).tolist()))


def ppl_sparsity(model, calibration, evaluation, layers, p):
    """PPL-p% sparsity, calibrated on one split of the sequences and judged on another (calibrated and judged on
    the same tokens, a 1% budget measured 1.5-1.9% on fresh ones: the search fits their noise). `layers`: each
    layer's Curves on the calibration sequences' untruncated neurons. The search starts from the dense model, whose
    dropped neurons are its exact zeros (target 0: a ReLU model reports at least those), and bisects the common
    CETT target while the truncated model's perplexity on the calibration sequences stays within (1 + p/100) times
    the dense one; each step truncates every layer at its exact largest threshold within the target and costs one
    pass. On the evaluation sequences, at the thresholds found: the perplexity ratio over the dense model and the
    sparsity, each with its standard error over the sequences (a sequence's tokens share a document and its
    context, so their losses and activations are correlated and a per-token error would be too small; the ratio's
    by the delta method on the sequences' paired loss differences). Returns {"cett_target", "sparsity",
    "sparsity_se", "ppl_ratio", "ppl_ratio_se", "layers" (the fraction dropped per layer), "sequences"}."""
    dense = sequence_losses(model, calibration)[0].mean()
    goal = dense + math.log1p(p / 100)  # perplexity ratio -> loss difference

    def thresholds(target):
        return {n: cett_threshold(c, target)[0] for n, c in layers.items()}
    lo, hi = 0.0, 1.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if sequence_losses(model, calibration, thresholds(mid))[0].mean() <= goal:
            lo = mid
        else:
            hi = mid
    base = sequence_losses(model, evaluation)
    loss, dropped, per_layer = sequence_losses(model, evaluation, thresholds(lo)) if lo > 0 else base
    diff = loss - base[0]
    ratio = math.exp(diff.mean())
    from scipy.stats import sem  # here, not at the top: train_gpt2.py imports this file, and scipy.stats is a slow
    # import no other part of a trainer process needs
    return {"cett_target": lo, "sparsity": float(dropped.mean()), "sparsity_se": float(sem(dropped)),
            "ppl_ratio": ratio, "ppl_ratio_se": float(ratio * sem(diff)), "layers": per_layer,
            "sequences": {"calibration": len(calibration), "evaluation": len(evaluation)}}


@torch.no_grad()
def measure(model, batches, cett_target=0.2, ppl_p=(1.0,)):
    """Every sparsity above per layer and for the model (the mean over layers), on `batches`: JSON-ready. CETT and
    top-k on every token; PPL-p% calibrated on the first half of the sequences and judged on the second (split)."""
    model.eval()
    sequences = sequences_of(batches)
    calibration, evaluation = split(sequences)
    neurons = {}
    with captured(model, neurons):
        for x, _ in sequences:
            model(x, head=False)
    layers = dense_sparsity(neurons)
    weights = {name: proj.weight.detach().float() for name, proj in mlp_neurons(model)}
    exact = {name: curves(torch.cat(neurons[name]), w) for name, w in weights.items()}
    for name, layer in exact.items():
        layers[name]["cett_eps"], layers[name]["cett"] = cett_threshold(layer, cett_target)
        layers[name]["topk"] = topk_sparsity(layer, cett_target)
    model_mean = {k: sum(v[k] for v in layers.values()) / len(layers) for k in ("zeros", "dead", "cett", "topk")}
    calibrated = {name: curves(torch.cat(neurons[name][:len(calibration)]), w) for name, w in weights.items()}
    ppl = {f"{p:g}": ppl_sparsity(model, calibration, evaluation, calibrated, p) for p in ppl_p}
    return {"cett_target": cett_target, "layers": layers, "model": model_mean, "ppl": ppl}
