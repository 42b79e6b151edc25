"""The gated (GLU) MLP of Shazeer 2020, "GLU Variants Improve Transformer": down(act(x W_gate) * (x W_up)).

Both models build it from the same two pieces: `hidden_width`, the rule that makes a gated MLP as large as
the plain one, and `GatedProduct`, the product act(x W_gate) * (x W_up) as a module of its own, so that
telemetry (activations/telemetry.py) sees the gated product's sparsity beside the gate activation's
statistics. The gate's activation is any registry activation (`activations.mlp_activation` reads the name),
built as in a plain MLP: its kernels, self-check and `impl` policy are its own. The product is left to
PyTorch (and torch.compile, which fuses it with the gate's elementwise work where it can).
"""
import torch.nn as nn

from errors import ConfigError

MULTIPLE = 64  # gated hidden widths are rounded to this: matmul tiles, and Shazeer's / LLaMA's convention


def hidden_width(plain, gated, override=0):
    """The MLP's hidden width. Plain: `plain`. Gated, with `override` 0: 2/3 of `plain` rounded to the nearest
    multiple of 64 (at least 64), so its three matrices hold as many weights as the plain MLP's two
    (GPT-2 124M: 2048 against 3072, 4.72M weights each); else `override`."""
    if override < 0:
        raise ConfigError(f"glu_hidden={override} must be >= 0 (0: 2/3 of the plain width, rounded to {MULTIPLE})")
    if not gated:
        if override:
            raise ConfigError(f"glu_hidden={override} sets a gated MLP's width, and this MLP is plain; leave it at 0 "
                              "or name a gated activation (swiglu, geglu, reglu or NAME_glu)")
        return plain
    return override or max(MULTIPLE, MULTIPLE * int(2 * plain / (3 * MULTIPLE) + 0.5))


class GatedProduct(nn.Module):
    """act(x W_gate) * (x W_up), given both: a module so that a forward hook sees the product."""

    def forward(self, activated, up):
        return activated * up
