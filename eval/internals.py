"""What flows through GPT-2's residual stream and attention, as the normalization literature measures it.

- Signal propagation (Brock et al. 2021, "Characterizing signal propagation to close the performance gap in
  unnormalized ResNets", §4): after the embeddings and after each block, over every token of a batch, the residual
  stream's average squared channel mean mean_c(E[x_c]^2), its average channel variance mean_c(Var[x_c]), and the
  average channel variance of what the block added (its residual branches). A normalization-free network whose
  stream variance grows with depth shows it here first.
- Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models", §2): per layer, the largest
  |hidden state| of the residual stream against the layer's median |hidden state|.
- Attention entropy (Jha & Reagen 2024, "ReLU's Revival", §3: "entropic overload"): per layer and head, the
  Shannon entropy (nats) of each query's causal attention distribution, averaged over queries. A head that attends
  uniformly to the t+1 tokens it sees has entropy ln(t+1).
"""
import contextlib
import math

import torch
import torch.nn.functional as F


@contextlib.contextmanager
def residual_streams(model, store):
    """Appends to `store` the residual stream after the embeddings and after each block ((B, T, C) float)."""
    def keep(module, args, out):
        store.append(out.detach().float())
    handles = [model.transformer.drop.register_forward_hook(keep)]
    handles += [block.register_forward_hook(keep) for block in model.transformer.h]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def signal_propagation(streams):
    """Per point of the stream (0: embeddings, l: after block l): squared mean, variance, branch variance."""
    out = []
    for i, x in enumerate(streams):
        flat = x.reshape(-1, x.size(-1)).double()
        var, mean = torch.var_mean(flat, dim=0, correction=0)
        row = {"squared_mean": mean.square().mean().item(), "variance": var.mean().item()}
        if i:
            branch = flat - streams[i - 1].reshape(-1, x.size(-1)).double()
            row["branch_variance"] = branch.var(dim=0, correction=0).mean().item()
        out.append(row)
    return out


def massive_activations(streams):
    """Per block: max |x|, median |x| and their ratio over the batch's residual stream after it."""
    out = []
    for x in streams[1:]:
        top, median = x.abs().max().item(), x.abs().median().item()
        out.append({"max": top, "median": median, "ratio": top / median if median > 0 else math.inf})
    return out


@contextlib.contextmanager
def attention_inputs(model, store):
    """Appends to `store` each attention layer's input (after ln_1), from which its probabilities are recomputed:
    the model itself runs SDPA, which never forms them."""
    def keep(module, args):
        store.append(args[0].detach())
    handles = [block.attn.register_forward_pre_hook(keep) for block in model.transformer.h]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def attention_entropy(model, inputs):
    """[layer][head] mean entropy (nats) of the causal attention distributions of `inputs` (per layer)."""
    out = []
    for block, x in zip(model.transformer.h, inputs):
        attn = block.attn
        B, T, C = x.shape
        q, k, _ = attn.c_attn(x).float().split(C, dim=2)
        q, k = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // attn.n_head)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), -math.inf)
        logp = F.log_softmax(scores, dim=-1)
        entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)  # (B, H, T); 0 log 0 = 0
        out.append(entropy.mean(dim=(0, 2)).tolist())
    return out


@torch.no_grad()
def measure(model, x, autocast=contextlib.nullcontext()):
    """All three on one batch of token ids x, the model in eval mode: JSON-ready."""
    was_training = model.training
    model.eval()
    streams, inputs = [], []
    with residual_streams(model, streams), attention_inputs(model, inputs), autocast:
        model(x, head=False)
    entropy = attention_entropy(model, inputs)
    model.train(was_training)
    return {"signal": signal_propagation(streams), "massive": massive_activations(streams),
            "attention_entropy": entropy}
