"""Fixed (parameter-free) activations: GPT-2's tanh GELU, exact GELU, ReLU, squared ReLU and LeakyReLU, SiLU, Mish."""
import torch.nn as nn
import torch.nn.functional as F


class GELU(nn.Module):
    """GELU with the tanh approximation, as in the original GPT-2."""

    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class GELUExact(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class ReLU(nn.Module):
    def forward(self, x):
        return F.relu(x)


class ReLU2(nn.Module):
    """Squared ReLU (So et al., Primer)."""

    def forward(self, x):
        return F.relu(x).square()


class LeakyReLU2(nn.Module):
    """Squared LeakyReLU(0.5), ReLU^2's sibling in speedrun-style GPT-2 training: max(x, x/2)^2. Unlike
    ReLU^2 its negative side keeps a gradient (x/2), so no unit dies."""

    def forward(self, x):
        return F.leaky_relu(x, 0.5).square()


class SiLU(nn.Module):
    """SiLU / Swish-1: x * sigmoid(x)."""

    def forward(self, x):
        return F.silu(x)


class Mish(nn.Module):
    """Mish (Misra 2019, "Mish: A Self Regularized Non-Monotonic Activation Function", its definition in the
    abstract and §3): x tanh(softplus(x)), softplus(x) = ln(1 + e^x)."""

    def forward(self, x):
        return F.mish(x)
