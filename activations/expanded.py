"""xATLU, xGELU, xSiLU (Huang 2024, "Expanded Gating Ranges Improve Activation Functions", arXiv 2405.20768).

A self-gated activation x g(x) has a gate g with range [0, 1]. The paper expands it with one trainable scalar
alpha per MLP block:

    xNAME(x) = x ((1 + 2 alpha) g(x) - alpha),   gate range [-alpha, 1 + alpha]

    xATLU: g(x) = arctan(x) / pi + 1/2     (ArcTan Linear Unit, the paper's new gate)
    xGELU: g(x) = Phi(x)                   (the exact normal CDF: erf, not GPT-2's tanh approximation)
    xSiLU: g(x) = sigmoid(x)

alpha starts at 0 (`alpha_init`), as in a public implementation of the paper's classes (torch.zeros; the
paper's full text was not at hand), so xGELU and xSiLU start as GELU (erf) and SiLU. With alpha > 0 negative
inputs keep a gradient (d/dx -> -alpha as x -> -inf), the paper's argument for the expansion.
"""
import math

import torch
import torch.nn as nn

from activations.aglu import _up


class _ExpandedGate(nn.Module):
    """x ((1 + 2 alpha) g(x) - alpha) for the subclass's gate g. alpha is a 0-dim parameter (no weight decay in
    a ">= 2-D weights decay" optimizer); fp32 inside (float64 kept), the input's dtype out."""

    def __init__(self, alpha_init=0.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))

    def forward(self, x):
        xf, alpha = _up(x), _up(self.alpha)
        return (xf * ((1 + 2 * alpha) * self.gate(xf) - alpha)).to(x.dtype)

    def telemetry(self):
        return {"alpha": self.alpha.detach().float().item()}


class XATLU(_ExpandedGate):
    @staticmethod
    def gate(x):
        return torch.atan(x) / math.pi + 0.5


class XGELU(_ExpandedGate):
    @staticmethod
    def gate(x):
        return 0.5 * (1 + torch.erf(x * 0.5 ** 0.5))


class XSiLU(_ExpandedGate):
    @staticmethod
    def gate(x):
        return torch.sigmoid(x)
