"""Normalized activations NSwish / NReLU (ANAct, Peiwen & Changsheng; §2.2 and App. A.1).

    out = (lam_n + beta * tanh(alpha)) * (act(x) - mu)                    (Eq. 15, 33, 38)
    lam_n = sqrt((rho + rho') / (2 rho rho'))                             (Eq. 13, 32)
    rho = Var[act(x)] / Var[x],  rho' = E[act'(x)^2],  mu = E[act(x)]     (Eq. 31, 35)

act' is the true derivative: NReLU 1[x > 0] (so rho' = P(x > 0)); NSwish
sigma(x) + x sigma(x)(1 - sigma(x)) (the paper's Eq. 40 writes y where sigma(x) belongs).
mu, rho, rho' carry no gradient (the paper treats them as constants in backward), so
d out/dx = scale * act'(x) and d out/d scale = act(x) - mu.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from activations.aglu import _up
from activations.impl import check_impl, kernels, use_kernels
from errors import ConfigError


def _swish_grad(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def _relu_grad(x):
    return (x > 0).to(x.dtype)


# act, act', and (mu, rho, rho') for x ~ N(0, 1) by numerical integration: the buffers' values
# before the first training batch, so an untrained module already evaluates sensibly.
_ACTS = {
    "swish": (F.silu, _swish_grad, (0.206621, 0.313083, 0.379482)),
    "relu": (F.relu, _relu_grad, (0.398942, 0.340845, 0.5)),
}


class _NormalizedFunction(torch.autograd.Function):
    """out = scale * (y - mu) with y = act(x) given (computed once for the statistics).
    Saves only x, scale, mu: y and act'(x) are recomputed in backward."""

    @staticmethod
    def forward(ctx, x, y, scale, mu, kind):
        ctx.kind = kind
        ctx.save_for_backward(x, scale, mu)
        return torch.sub(y, mu).mul_(scale).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, scale, mu = ctx.saved_tensors
        act, act_grad, _ = _ACTS[ctx.kind]
        xf, g = _up(x), _up(grad)
        gx = (g * scale * act_grad(xf)).to(x.dtype)
        gscale = None
        if ctx.needs_input_grad[2]:  # Eq. 36: sum over every position that shares this scale
            gscale = (g * (act(xf) - mu)).sum_to_size(scale.shape).to(scale.dtype)
        return gx, None, gscale, None, None


class _NormalizedActivation(nn.Module):
    """Normalized `kind` activation; see the module docstring for the formula.

    Args:
        momentum: m of Eq. 16-18, the weight of the current batch (BatchNorm's convention).
        lower, upper: L and U of Eq. 17-18; a batch rho (rho') outside (L*prev, U*prev) is
            ignored. The paper gives no m, L, U; defaults m=0.1 (BatchNorm's), L=0.5, U=2.0
            (a factor 2 either way: the running value moves at most 10% per step, so it follows
            real drift, while a batch of outliers, e.g. mostly padding, is dropped).
        beta: bound of the learnable adjustment beta*tanh(alpha); alpha is 0-dim, init 0.
        per_instance: mean/variance per token over the last dim, in training and evaluation,
            with no running statistics (what the paper used for translation, §3.4).
        eps: floor for rho and rho', so lam_n <= eps^-1/2 and a constant input stays finite.
        impl: "auto" (the fused Triton kernels on CUDA, else PyTorch), "triton" or "torch"
            (activations/impl.py). per_instance rows longer than kernels.MAX_ROW take PyTorch.

    Batch mode (default), training: mu_M, rho_M, rho'_M are taken over the whole batch in fp32,
    without gradient; the running buffers are updated by Eq. 16-18 (the first batch
    initialises all three, as Eq. 17-18 do for rho, rho'; Eq. 16 has no t=0 case and starting
    mu from 0 would shift the first outputs), and the output uses these updated values
    mu^(t), rho^(t), rho'^(t): the paper smooths the statistics "to control the noise", so
    the smoothed ones normalise. Evaluation uses the running values, like BatchNorm.
    Each micro-batch of gradient accumulation counts as one batch t.

    Distributed: statistics stay per rank. An all-reduce in every MLP forward would cost a
    collective per layer per micro-batch; like BatchNorm (not SyncBatchNorm), each replica
    normalises with its own batch. The running values are buffers: DDP broadcasts them from
    rank 0 at construction and, with its forward buffer sync on (the default:
    `forward_sync_buffers`, formerly `broadcast_buffers=True`, deprecated in torch 2.13), at
    the start of every forward that follows a gradient-synchronising forward, i.e. about once
    per optimizer step under no_sync / require_backward_grad_sync accumulation. In between,
    each rank folds in its own micro-batches; checkpoints saved by rank 0 hold rank 0's values.
    """

    kind = None

    def __init__(self, momentum=0.1, lower=0.5, upper=2.0, beta=0.3, per_instance=False, eps=1e-5, impl="auto"):
        super().__init__()
        if not (0.0 < momentum <= 1.0 and 0.0 <= lower < 1.0 < upper):
            raise ConfigError(f"need 0 < momentum <= 1 and lower < 1 < upper, got {momentum}, {lower}, {upper}")
        self.momentum, self.lower, self.upper, self.beta = momentum, lower, upper, beta
        self.per_instance, self.eps, self.impl = per_instance, eps, check_impl(impl)
        self.alpha = nn.Parameter(torch.zeros(()))
        if not per_instance:
            mu, rho, rho_prime = _ACTS[self.kind][2]
            self.register_buffer("running_mu", torch.tensor(mu))
            self.register_buffer("running_rho", torch.tensor(rho))
            self.register_buffer("running_rho_prime", torch.tensor(rho_prime))
            # A buffer, not a Python flag: survives state_dict round trips, no recompiles.
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _stats(self, xf, y, dim):
        """(mu, rho, rho') over `dim` (None: all elements), population variances, fp32."""
        keep = dim is not None
        var_y, mu = torch.var_mean(y, dim=dim, correction=0, keepdim=keep)
        var_x = torch.var(xf, dim=dim, correction=0, keepdim=keep)
        rho = self._rho(var_y, var_x)
        rho_prime = _ACTS[self.kind][1](xf).square().mean(dim=dim, keepdim=keep).clamp_min(self.eps)
        return mu, rho, rho_prime

    def _rho(self, var_y, var_x):
        """rho = Var[y] / Var[x] (Eq. 31); kernels.py's rows kernel computes it, and rho', the same way.
        var_x only floored against 0/0 (rho is a ratio, fine at any scale); rho and rho' are
        floored at eps, which caps lam_n at eps^-1/2 (an all-negative NReLU token has rho' = 0)."""
        return (var_y / var_x.clamp_min(torch.finfo(torch.float32).tiny)).clamp_min(self.eps)

    def _track(self, mu_b, rho_b, rho_prime_b):
        """Eq. 16-18, branch-free (torch.where) so it compiles to one graph. Returns the new
        values as fresh tensors and copies them into the buffers."""
        first = self.num_batches_tracked == 0
        m = self.momentum
        mu = torch.where(first, mu_b, torch.lerp(self.running_mu, mu_b, m))
        out = [mu]
        for prev, new in ((self.running_rho, rho_b), (self.running_rho_prime, rho_prime_b)):
            inside = (new > self.lower * prev) & (new < self.upper * prev)
            out.append(torch.where(first, new, torch.where(inside, torch.lerp(prev, new, m), prev)))
        for buf, value in zip((self.running_mu, self.running_rho, self.running_rho_prime), out):
            buf.copy_(value)
        self.num_batches_tracked.add_(1)
        return out

    def _scale(self, rho, rho_prime):
        lam_n = torch.sqrt((rho + rho_prime) / (2 * rho * rho_prime))
        return lam_n + self.beta * torch.tanh(self.alpha)

    def forward(self, x):
        if use_kernels(self, x) and not (self.per_instance and x.shape[-1] > kernels.MAX_ROW):
            return self._forward_kernels(x)
        act = _ACTS[self.kind][0]
        with torch.no_grad():
            xf = _up(x)
            y = act(xf)
            if self.per_instance:
                mu, rho, rho_prime = self._stats(xf, y, dim=-1)
            else:
                if self.training:
                    mu, rho, rho_prime = self._track(*self._stats(xf, y, dim=None))
                else:  # mu is saved for backward: clone, or a later training step's in-place update breaks it
                    mu, rho, rho_prime = self.running_mu.clone(), self.running_rho, self.running_rho_prime
        return _NormalizedFunction.apply(x, y, self._scale(rho, rho_prime), mu, self.kind)

    def _forward_kernels(self, x):
        """forward() with kernels.py: the same statistics, tracking and scale."""
        swish = self.kind == "swish"
        if self.per_instance:
            return kernels.anact_rows(x, self.beta * torch.tanh(self.alpha), self.eps, swish)
        with torch.no_grad():
            if self.training:
                mu, var_y, var_x, mean_grad_sq = kernels.anact_stats(x, swish).unbind()
                mu, rho, rho_prime = self._track(mu, self._rho(var_y, var_x), mean_grad_sq.clamp_min(self.eps))
            else:
                mu, rho, rho_prime = self.running_mu.clone(), self.running_rho, self.running_rho_prime
        return kernels.anact(x, self._scale(rho, rho_prime), mu, swish)

    def telemetry(self):
        out = {"alpha": self.alpha.item()}
        if not self.per_instance:
            with torch.no_grad():
                out["scale"] = self._scale(self.running_rho, self.running_rho_prime).item()
            out.update(mu=self.running_mu.item(), rho=self.running_rho.item(), rho_prime=self.running_rho_prime.item())
        return out


class NSwish(_NormalizedActivation):
    __doc__ = "NSwish: normalized SiLU/Swish.\n" + _NormalizedActivation.__doc__
    kind = "swish"


class NReLU(_NormalizedActivation):
    __doc__ = "NReLU: normalized ReLU.\n" + _NormalizedActivation.__doc__
    kind = "relu"
