"""APA gate and AGLU (Alexandridis et al., "Adaptive Parametric Activation", §3, App. B).

    APA:  eta(z; kappa, lam) = (lam * exp(-kappa z) + 1) ** (-1/lam)          (Eq. 5)
    AGLU: z * eta(z; kappa, lam)                                              (Eq. 6)

Computed in the stable form of App. B.1 (Eq. 13), with v = ln(lam) - kappa z:
    ln eta = logsigmoid(-v) / lam = -softplus(v) / lam
so ln eta is never taken from an eta that has already underflowed to 0.

Backward (derived here and checked against float64 autograd in tests/test_activations.py;
the paper's Eq. 8 for d/dlam misses the second term). With q = sigmoid(v) / lam = 1/(lam + e^{kappa z}):
    d ln eta / dz     = kappa q
    d ln eta / dkappa = z q
    d ln eta / dlam   = -(q + ln eta) / lam      [= -q/lam + ln(1 + lam e^{-kappa z}) / lam^2]
and d out / d ln eta = out (out = eta or z eta), plus eta for AGLU's own z factor.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from activations.impl import check_impl, loaded_kernels, use_kernels
from errors import ConfigError

LAM_MIN = 1e-4  # the authors' clamp keeping lam > 0; below it lam gets no gradient (like torch.clamp)
LOG2_E, LN_2 = 1.4426950408889634, 0.6931471805599453


def _log2_eta(zf, kappa, lam):
    """v = ln lam - kappa z and log2 eta = -softplus(v) / (lam ln 2), fp32 (float64 kept).
    Base 2 because exp2 is cheaper than exp in fused CPU kernels; the 1/ln 2 rides on the
    1/lam multiply, so it costs no extra pass in eager mode. Returns (v, log2 eta)."""
    v = torch.addcmul(torch.log(lam), zf, kappa, value=-1.0)
    # softplus switches to the identity above 20: error e^-20 relative, harmless in fp32.
    return v, F.softplus(v).mul_(-LOG2_E / lam)


def _up(t):
    """Compute dtype: fp32 for bf16/fp16/fp32 tensors, float64 kept (for gradcheck)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _output(t, dtype):
    """A Function's output `t` in `dtype`. Under torch.compile a tensor of its own: torch 2.11's dynamo gives zero
    gradients to a Function whose output was last written in place or is `.to` of itself (2.13 and 2.14 are
    right); inductor fuses the copy away, and eager mode keeps the in-place ops' memory."""
    return t.to(dtype, copy=torch.compiler.is_compiling())


class _APAFunction(torch.autograd.Function):
    """out = z * eta (gated=True, AGLU) or eta (APA). Saves only z and the two parameters:
    eta is recomputed in backward, so AGLU keeps no more for backward than GELU does.
    The backward is out of place so that it is itself differentiable (gradgradcheck)."""

    @staticmethod
    def forward(ctx, z, kappa, lam, gated):
        ctx.gated = gated
        ctx.save_for_backward(z, kappa, lam)
        zf = _up(z)
        _, log2_eta = _log2_eta(zf, _up(kappa), _up(lam).clamp_min(LAM_MIN))
        eta = log2_eta.exp2_()
        return _output(eta.mul_(zf) if ctx.gated else eta, z.dtype)

    @staticmethod
    def backward(ctx, grad):
        z, kappa, lam = ctx.saved_tensors
        zf, k, lf = _up(z), _up(kappa), _up(lam)
        lc = lf.clamp_min(LAM_MIN)
        v, log2_eta = _log2_eta(zf, k, lc)
        eta = log2_eta.exp2()
        q = torch.sigmoid(v) / lc  # sigmoid(v), not 1 - sigmoid(-v): no cancellation when kappa z >> 0
        ge = _up(grad) * eta
        w = ge * zf if ctx.gated else ge  # grad * d out / d ln eta
        t = w * q
        gz = torch.addcmul(ge, t, k) if ctx.gated else t * k
        gk = gl = None
        if ctx.needs_input_grad[1]:
            gk = (t * zf).sum_to_size(kappa.shape).to(kappa.dtype)
        if ctx.needs_input_grad[2]:
            gl = -(t.sum_to_size(lam.shape) + (w * log2_eta).sum_to_size(lam.shape) * LN_2) / lc
            gl = torch.where(lf >= LAM_MIN, gl, 0.0).to(lam.dtype)  # the clamp's gradient
        return gz.to(z.dtype), gk, gl, None


def _init(value, shape, generator=None):
    """(lo, hi) -> U(lo, hi) as in the paper's Table 8; a number -> that constant. Built alone, the module draws
    from the global RNG, as nn.Linear does; in a model, init_parameter draws each parameter again from the
    model's stream for its name (activations/init_streams.py), so the draw shifts no other weight."""
    if isinstance(value, (int, float)):
        return torch.full(shape, float(value))
    lo, hi = value
    return torch.empty(shape).uniform_(lo, hi, generator=generator)


class APA(nn.Module):
    """The APA gate eta alone (for attention-style use, replacing a sigmoid).

    Args:
        kappa_init, lam_init: (lo, hi) for a uniform init or a number for a constant.
            Defaults U(0,1) for both (paper Table 8, APA column; attention used U(-1,0), Table 12).
        channelwise: one (kappa, lam) per channel (last dim) instead of one pair per layer
            (the paper found shared scalars better, App. C.4). Needs num_channels.
        impl: "auto" (the fused Triton kernel on CUDA, else PyTorch), "triton" or "torch"
            (activations/impl.py). Channelwise parameters always take the PyTorch path.
    Parameters are 0-dim (1-D if channelwise) so that they never get weight decay in a
    ">= 2-D params decay" optimizer and do not promote bf16 activations. lam is clamped at
    LAM_MIN = 1e-4 in the forward, as the authors do; below it lam's gradient is zero.
    Computation is fp32 inside; the output has the input's dtype.
    """

    gated = False

    def __init__(self, kappa_init=(0.0, 1.0), lam_init=(0.0, 1.0), channelwise=False, num_channels=None,
                 impl="auto"):
        super().__init__()
        if channelwise and not num_channels:
            raise ConfigError("channelwise=True needs num_channels (the size of the last dim)")
        self.impl = check_impl(impl)
        shape = (num_channels,) if channelwise else ()
        self.inits = {"kappa": kappa_init, "lam": lam_init}
        self.kappa = nn.Parameter(_init(kappa_init, shape))
        self.lam = nn.Parameter(_init(lam_init, shape))

    def init_parameter(self, name, generator):
        """Draw kappa or lam again from `generator` (a model's stream for it: activations/init_streams.py)."""
        parameter = getattr(self, name)
        parameter.copy_(_init(self.inits[name], parameter.shape, generator))

    def forward(self, z):
        if self.kappa.dim() == 0 and use_kernels(self, z):
            return loaded_kernels().apa(z, self.kappa, self.lam, LAM_MIN, self.gated)
        return _APAFunction.apply(z, self.kappa, self.lam, self.gated)

    def telemetry(self):
        # lam as the forward uses it: the raw parameter may drift below LAM_MIN (no gradient there).
        lam = self.lam.detach().float().clamp_min(LAM_MIN)
        return {"kappa": self.kappa.detach().float().mean().item(), "lam": lam.mean().item()}


class AGLU(APA):
    """AGLU(z) = z * APA(z): kappa -> inf gives ReLU, lam -> inf the identity, (1, 1) SiLU, (1.702, 1) GELU(sigmoid).

    Same options as APA; kappa defaults to U(0.8, 1.2) (paper Table 8, AGLU column; the
    supplementary uses U(1, 1.3)) and lam to U(0, 1).
    """

    gated = True

    def __init__(self, kappa_init=(0.8, 1.2), lam_init=(0.0, 1.0), channelwise=False, num_channels=None,
                 impl="auto"):
        super().__init__(kappa_init, lam_init, channelwise, num_channels, impl)
