"""A made-up activation that tests/test_export.py registers at run time: it must export as remote code
with no change to export/, its file copied like the files of activations/."""
import torch
import torch.nn as nn

from activations.aglu import _up


class TanhGate(nn.Module):
    """x * tanh(scale * x) with one learned scale."""

    def __init__(self, scale_init=1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale_init)))

    def forward(self, x):
        xf = _up(x)
        return (xf * torch.tanh(self.scale * xf)).to(x.dtype)
