"""PolyReLU and PolyNorm (Zhuo et al., ICLR 2025, "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", arXiv 2411.03884, §2 and the PyTorch-style Algorithms 1-2).

    PolyReLU(x) = sum_{i=0}^{r} a_i ReLU(x)^i
    PolyNorm(x) = a_0 + sum_{i=1}^{r} a_i norm(x^i),   norm(u) = u / sqrt(mean(u^2 over the last dim) + eps)

r = 3 and a = (a_0, a_1, a_2, a_3) = (0, 1/3, 1/3, 1/3), learned, as in the authors' code (weight =
torch.ones(3) / 3 for a_3..a_1, bias = torch.zeros(1) for a_0; eps = 1e-6). The paper writes the i = 0 term
as a_0 norm(x^0); the authors' code adds a_0 itself (norm(1) = (1 + eps)^-1/2), and so do we.
norm is RMS normalisation over the hidden units of each token (the last dim), with no gain: PolyNorm is not
elementwise. The coefficients are one 1-D parameter, so a ">= 2-D weights decay" optimizer never decays them,
as neither of the authors' training codes does (Megatron: 1-D parameters; OLMo: every activation parameter).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from activations.aglu import _up
from errors import ConfigError

COEFFS = (0.0, 1 / 3, 1 / 3, 1 / 3)  # a_0 .. a_3: third order


class _PolyCom(nn.Module):
    """A learned polynomial of order len(coeffs_init) - 1 (coeffs[i] = a_i); fp32 inside (float64 kept), the
    input's dtype out."""

    def __init__(self, coeffs_init=COEFFS):
        super().__init__()
        if len(coeffs_init) < 2:
            raise ConfigError(f"coeffs_init={list(coeffs_init)} needs a_0 and at least a_1 (order >= 1)")
        self.coeffs = nn.Parameter(torch.tensor([float(a) for a in coeffs_init]))

    def telemetry(self):
        return {f"a{i}": a for i, a in enumerate(self.coeffs.detach().float().tolist())}


class PolyReLU(_PolyCom):
    def forward(self, x):
        relu, a = F.relu(_up(x)), _up(self.coeffs)
        out = a[-1]
        for i in range(len(a) - 2, -1, -1):  # Horner: ((a_r z + a_{r-1}) z + ...) z + a_0, z = ReLU(x)
            out = out * relu + a[i]
        return out.to(x.dtype)


class PolyNorm(_PolyCom):
    eps = 1e-6  # the authors' code

    def forward(self, x):
        xf, a = _up(x), _up(self.coeffs)
        out = a[0]
        for i in range(1, len(a)):
            power = xf.pow(i)
            out = out + a[i] * power * torch.rsqrt(power.square().mean(-1, keepdim=True) + self.eps)
        return out.to(x.dtype)
