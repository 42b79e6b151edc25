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
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from activations.aglu import _output, _up
from activations.impl import check_impl, loaded_kernels, use_kernels
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
        return _output(torch.sub(y, mu).mul_(scale), x.dtype)

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

    Batch mode (default): the batch t of Eq. 16-18 is the optimizer step's batch, whatever its split into
    micro-batches (gradient accumulation) and ranks. A training forward adds its micro-batch's pooled
    moments (count, sums of y, y^2, x, x^2, act'(x)^2, float64) to a pending sum, and
    `activations.step_statistics(model)` (training/loop.py calls it once per step, after the backward
    passes) all-reduces every module's sums in one collective and applies Eq. 16-18 to the whole step's
    statistics: the running buffers are the same on every rank, and the same for 1 process accumulating
    2 micro-batches as for 2 ranks with 1 each. The first step initialises all three (as Eq. 17-18 do
    for rho, rho'; Eq. 16 has no t=0 case and starting mu from 0 would shift the first outputs).

    The output: the paper normalises with the updated values mu^(t), rho^(t), rho'^(t) (it smooths
    them "to control the noise"), which contain the current batch. The step's statistics exist only
    after its last micro-batch, so each micro-batch normalises with Eq. 16-18 applied to the running
    values as of the step's start and its OWN statistics (torch.where, no buffer written): what the
    update would give if this micro-batch were the step's batch. That depends on the micro-batch alone,
    never on how the others are grouped over ranks and accumulation, but on its size: the outputs are
    exactly the paper's only with one micro-batch per step on one process (a run with more says so in its
    start line: micro_batch_note). Evaluation uses the running values, like BatchNorm.
    Modules trained without step_statistics (a bare module in a test) keep their initial buffers.
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
            # The step's micro-batches so far: (count, sum y, sum y^2, sum x, sum x^2, sum act'(x)^2). Raw sums
            # pool over micro-batches and ranks by addition; float64 keeps E[y^2] - E[y]^2 from cancelling.
            # Not saved: step_statistics empties it at every step's end, where checkpoints are taken.
            self.register_buffer("pending", torch.zeros(6, dtype=torch.float64), persistent=False)

    def _moments(self, xf, y, dim):
        """(E[y], Var[y], E[x], Var[x], E[act'(x)^2]) over `dim` (None: all elements), population variances."""
        keep = dim is not None
        var_y, mean_y = torch.var_mean(y, dim=dim, correction=0, keepdim=keep)
        # not var_mean: on the CPU its reduction over all elements is slower than var's and mean's together
        var_x, mean_x = torch.var(xf, dim=dim, correction=0, keepdim=keep), xf.mean(dim=dim, keepdim=keep)
        return mean_y, var_y, mean_x, var_x, _ACTS[self.kind][1](xf).square().mean(dim=dim, keepdim=keep)

    def _rho(self, var_y, var_x):
        """rho = Var[y] / Var[x] (Eq. 31); kernels.py's rows kernel computes it, and rho', the same way.
        var_x only floored against 0/0 (rho is a ratio, fine at any scale); rho and rho' are
        floored at eps, which caps lam_n at eps^-1/2 (an all-negative NReLU token has rho' = 0)."""
        return (var_y / var_x.clamp_min(torch.finfo(torch.float32).tiny)).clamp_min(self.eps)

    def _smoothed(self, mean_y, var_y, var_x, mean_grad_sq):
        """Eq. 16-18 on the running buffers and these statistics, branch-free (torch.where) so it compiles to
        one graph: new (mu, rho, rho') tensors; the buffers are not written."""
        mu_b, rho_b, rho_prime_b = mean_y, self._rho(var_y, var_x), mean_grad_sq.clamp_min(self.eps)
        first = self.num_batches_tracked == 0
        m = self.momentum
        out = [torch.where(first, mu_b, torch.lerp(self.running_mu, mu_b, m))]
        for prev, new in ((self.running_rho, rho_b), (self.running_rho_prime, rho_prime_b)):
            inside = (new > self.lower * prev) & (new < self.upper * prev)
            out.append(torch.where(first, new, torch.where(inside, torch.lerp(prev, new, m), prev)))
        return out

    def _micro_batch(self, n, mean_y, var_y, mean_x, var_x, mean_grad_sq):
        """A training micro-batch of n elements: its moments join the step's pending sums; returns the
        (mu, rho, rho') it normalises with (class docstring)."""
        m = torch.stack([mean_y, var_y, mean_x, var_x, mean_grad_sq]).double()
        self.pending.add_(n * torch.stack([torch.ones_like(m[0]), m[0], m[1] + m[0] * m[0], m[2],
                                           m[3] + m[2] * m[2], m[4]]))
        dtype = self.running_mu.dtype
        return self._smoothed(mean_y.to(dtype), var_y.to(dtype), var_x.to(dtype), mean_grad_sq.to(dtype))

    @torch.no_grad()
    def _step_update(self, sums):
        """Eq. 16-18 with the step's pooled sums (every micro-batch, every rank) into the buffers; a module
        that saw no training batch this step keeps them."""
        count, moments = sums[0], sums[1:] / sums[0].clamp_min(1)
        mean_y, mean_y2, mean_x, mean_x2, mean_grad_sq = moments.unbind()
        var_y, var_x = (mean_y2 - mean_y * mean_y).clamp_min(0), (mean_x2 - mean_x * mean_x).clamp_min(0)
        dtype = self.running_mu.dtype
        new = self._smoothed(*(t.to(dtype) for t in (mean_y, var_y, var_x, mean_grad_sq)))
        seen = count > 0
        for buf, value in zip((self.running_mu, self.running_rho, self.running_rho_prime), new):
            buf.copy_(torch.where(seen, value, buf))
        self.num_batches_tracked.add_(seen.long())
        self.pending.zero_()

    def _scale(self, rho, rho_prime):
        lam_n = torch.sqrt((rho + rho_prime) / (2 * rho * rho_prime))
        return lam_n + self.beta * torch.tanh(self.alpha)

    def forward(self, x):
        if use_kernels(self, x) and not (self.per_instance and x.shape[-1] > loaded_kernels().MAX_ROW):
            return self._forward_kernels(x)
        act = _ACTS[self.kind][0]
        with torch.no_grad():
            xf = _up(x)
            y = act(xf)
            if self.per_instance:
                mu, var_y, _, var_x, mean_grad_sq = self._moments(xf, y, dim=-1)
                rho, rho_prime = self._rho(var_y, var_x), mean_grad_sq.clamp_min(self.eps)
            elif self.training:
                mu, rho, rho_prime = self._micro_batch(x.numel(), *self._moments(xf, y, dim=None))
            else:  # mu is saved for backward: clone, or a later step's in-place update would break it
                mu, rho, rho_prime = self.running_mu.clone(), self.running_rho, self.running_rho_prime
        return _NormalizedFunction.apply(x, y, self._scale(rho, rho_prime), mu, self.kind)

    def _forward_kernels(self, x):
        """forward() with kernels.py: the same statistics, pending sums and scale."""
        kernels = loaded_kernels()
        swish = self.kind == "swish"
        if self.per_instance:
            return kernels.anact_rows(x, self.beta * torch.tanh(self.alpha), self.eps, swish)
        with torch.no_grad():
            if self.training:
                mu, rho, rho_prime = self._micro_batch(x.numel(), *kernels.anact_stats(x, swish).unbind())
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


def batch_mode(model):
    """The NSwish/NReLU modules of `model` that take batch statistics (not per_instance)."""
    return [m for m in model.modules() if isinstance(m, _NormalizedActivation) and not m.per_instance]


def micro_batch_note(model, micro_batches):
    """For a run's start line: with several micro-batches a step (accumulation x ranks), a batch-mode
    NSwish/NReLU's forward normalises each with its own statistics (and the step's starting running values),
    so results depend on the micro-batch size, not only on the step's batch: the paper's exactly only with one."""
    if micro_batches > 1 and batch_mode(model):
        return (f" | NSwish/NReLU normalise each of the step's {micro_batches} micro-batches with its own statistics: "
                "results depend on the micro-batch size (the paper's exactly with 1 micro-batch a step)")
    return ""


def step_statistics(model):
    """End of an optimizer step: every batch-mode NSwish/NReLU in `model` folds the step's pending moments
    into its running buffers (Eq. 16-18, t = the step). The sums of all modules go in one float64
    all-reduce over the default process group when there is one (one collective per step, not one per layer
    per micro-batch), so every rank ends the step with the same buffers. Call it on every rank."""
    modules = batch_mode(model)
    if not modules:
        return
    sums = torch.stack([m.pending for m in modules])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)
    for m, row in zip(modules, sums):
        m._step_update(row)
