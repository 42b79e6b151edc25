"""The gated (GLU) MLP of Shazeer 2020, "GLU Variants Improve Transformer": down(act(x W_gate) * (x W_up)).

Both models build it from the same pieces: `hidden_width`, the rule that makes a gated MLP as large as
the plain one, `width_note`, the start line's word when it is not, and `GatedProduct`, the product
act(x W_gate) * (x W_up) as a module of its own, so that telemetry (activations/telemetry.py) sees the gated
product's sparsity beside the gate activation's statistics. The gate's activation is any registry activation
(`activations.mlp_activation` reads the name), built as in a plain MLP: its kernels, self-check and `impl`
policy are its own. The product is left to PyTorch (and torch.compile, which fuses it with the gate's
elementwise work where it can).
"""
import torch.nn as nn

from errors import ConfigError

MATCH = 0.005  # a gated MLP "matches" the plain one when their parameter counts differ by at most 0.5%
# Gated widths are rounded to the coarsest of these that still matches: 64 for matmul tiles (and Shazeer's /
# LLaMA's convention), down to 8, the fp16/bf16 tensor cores' alignment, and 1 where no multiple of 8 matches.
MULTIPLES = (64, 32, 16, 8, 1)


def mlp_params(d_model, width, gated, bias=True):
    """Weights and biases of d_model -> width -> d_model (gated: two input matrices, gate and up)."""
    inputs = 2 if gated else 1
    return (inputs + 1) * d_model * width + bias * (inputs * width + d_model)


def mismatch(d_model, plain, width, bias=True):
    """The gated MLP of `width` against the plain one of `plain`: relative difference of parameter counts."""
    return mlp_params(d_model, width, True, bias) / mlp_params(d_model, plain, False, bias) - 1


def hidden_width(d_model, plain, gated, override=0, bias=True):
    """The MLP's hidden width. Plain: `plain`. Gated, with `override` 0: the width whose three matrices (and
    biases) hold as many parameters as the plain MLP's two, 2/3 of `plain` for bias-free layers, rounded to the
    coarsest of MULTIPLES within 0.5% of them (GPT-2 124M: 2048 against 3072, 4.72M weights each; the
    translation FFN, d 512 and 1024 wide: 680, -0.36%, where 704 would be +3.2%); else `override`."""
    if override < 0:
        raise ConfigError(f"glu_hidden={override} must be >= 0 (0: the width with the plain MLP's parameters)")
    if not gated:
        if override:
            raise ConfigError(f"glu_hidden={override} sets a gated MLP's width, and this MLP is plain; leave it at 0 "
                              "or name a gated activation (swiglu, geglu, reglu or NAME_glu)")
        return plain
    if override:
        return override
    exact = (mlp_params(d_model, plain, False, bias) - bias * d_model) / (3 * d_model + 2 * bias)
    for multiple in MULTIPLES:
        width = max(multiple, multiple * round(exact / multiple))
        if abs(mismatch(d_model, plain, width, bias)) <= MATCH:
            return width
    return width  # the nearest integer: tiny models, where one unit of width is over 0.5%


def width_note(d_model, plain, gated, override=0, bias=True):
    """The start line's ' | gated MLP 704 wide: +3.16% parameters against the plain 1024' when a gated MLP does not
    match the plain one (a glu_hidden of the user's, a tiny model); '' when it does, or is plain."""
    width = hidden_width(d_model, plain, gated, override, bias)
    off = mismatch(d_model, plain, width, bias)
    if not gated or abs(off) <= MATCH:
        return ""
    return f" | gated MLP {width} wide: {off:+.2%} parameters against the plain {plain}"


class GatedProduct(nn.Module):
    """act(x W_gate) * (x W_up), given both: a module so that a forward hook sees the product."""

    def forward(self, activated, up):
        return activated * up
