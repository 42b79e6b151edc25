"""What the activations are doing: per-layer statistics of every MLP/FFN activation on one batch.

    from activations.telemetry import collect
    record = collect(model, x, autocast)   # {"layers": [...], "anact_score": ...}, JSON-ready

For every module named `act` (what the activation registry builds inside GPT-2's MLP and the translation
FFN), one forward pass of the model in eval mode measures, on that module's real input x and output y:
  sparsity   fraction of |y| < SPARSE_THRESHOLD (activation sparsity; for ANAct this is the normalised output)
  out_mean, out_std
  rho        Var[y] / Var[x]          (ANAct Eq. 7: forward variance gain)
  rho_prime  E[act'(x)^2]             (ANAct Eq. 8: backward gain; act' by autograd, see below)
and adds the module's own state from its `telemetry()` (AGLU kappa, lam; NSwish/NReLU alpha, the running
rho, rho', mu and the resulting scale) under "params". In a gated MLP the `act` is the gate's activation, so
these describe the gate (x its pre-activation), and a sibling `glu` module (activations/gated.py) adds
  product_sparsity   fraction of |act(x W_gate) * (x W_up)| < SPARSE_THRESHOLD (what the down projection sees) anact_score = sum over layers of
(|ln rho| + |ln rho'|) / 2, ANAct's Eq. 22 score (0 when every layer preserves both variances).

act' comes from the gradient of sum(act(x)) with respect to x, which is the elementwise derivative for
elementwise activations; ANAct in eval mode uses fixed running statistics, so it is elementwise too (with
per-token statistics it is not, and rho' then includes the statistics' dependence on x).
"""
import contextlib
import math

import torch

SPARSE_THRESHOLD = 1e-2
MAX_ROWS = 8  # sequences of the batch used: 8 x 1024 tokens x 3072 channels is plenty, and cheap at 124M


def activation_modules(model):
    """(name, module) of each activation built by the registry: the submodules named `act`."""
    return [(name, m) for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "act"]


def gated_product(model, act_name):
    """The `glu` module beside the activation named act_name (a gated MLP's product), or None."""
    parent = act_name.rpartition(".")[0]
    try:
        return model.get_submodule(f"{parent}.glu" if parent else "glu")
    except AttributeError:  # no such submodule, or a plain MLP's glu = None
        return None


def layer_stats(act, x, y, threshold=SPARSE_THRESHOLD):
    """Measured statistics of one activation from its input x and output y (float64 reductions)."""
    x64, y64 = x.detach().double(), y.detach().double()
    with torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
        xg = x.detach().float().requires_grad_(True)
        # .forward, not __call__: the hook that called us must not fire again
        (grad,) = torch.autograd.grad(act.forward(xg).sum(), xg)
    stats = {
        "sparsity": (y64.abs() < threshold).double().mean().item(),
        "out_mean": y64.mean().item(),
        "out_std": y64.std(correction=0).item(),
        "rho": (y64.var(correction=0) / x64.var(correction=0)).item(),
        "rho_prime": grad.double().square().mean().item(),
    }
    if hasattr(act, "telemetry"):
        stats["params"] = {k: float(v) for k, v in act.telemetry().items()}
    return stats


def anact_score(layers):
    def ln_abs(v):
        return abs(math.log(v)) if v > 0 else math.inf
    return sum((ln_abs(layer["rho"]) + ln_abs(layer["rho_prime"])) / 2 for layer in layers)


@torch.no_grad()
def collect(model, x, autocast=None, acts=None, max_rows=MAX_ROWS, threshold=SPARSE_THRESHOLD):
    """Telemetry of `acts` ((name, module) pairs; default: every `act` in model) on token batch x.

    x is the model's input, or a tuple of inputs (an encoder-decoder's source and target batches).
    Runs model(x[:max_rows]) once in eval mode under `autocast` and restores the previous mode. Pass the
    unwrapped model (not DDP / torch.compile): hooks go on its modules and only this process runs it.
    """
    acts = activation_modules(model) if acts is None else list(acts)
    if not acts:
        raise ValueError("no activation modules: the model has no submodule named 'act' (pass acts=[(name, module)])")
    layers = [None] * len(acts)

    def hook_for(i, name):
        def hook(module, inputs, output):
            layers[i] = {"name": name, "kind": type(module).__name__, **layer_stats(module, inputs[0], output, threshold)}
        return hook

    def product_hook(i):
        def hook(module, inputs, output):
            products[i] = (output.detach().double().abs() < threshold).double().mean().item()
        return hook

    products = {}
    handles = [m.register_forward_hook(hook_for(i, name)) for i, (name, m) in enumerate(acts)]
    for i, (name, _) in enumerate(acts):
        glu = gated_product(model, name)
        if glu is not None:
            handles.append(glu.register_forward_hook(product_hook(i)))
    was_training = model.training
    model.eval()
    try:
        with autocast or contextlib.nullcontext():
            model(*(t[:max_rows] for t in (x if isinstance(x, (tuple, list)) else (x,))))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    missing = [name for (name, _), layer in zip(acts, layers) if layer is None]
    if missing:
        raise ValueError(f"activation(s) {', '.join(missing)} did not run in the forward pass")
    for i, sparsity in products.items():
        layers[i]["product_sparsity"] = sparsity
    return {"layers": layers, "anact_score": anact_score(layers)}
