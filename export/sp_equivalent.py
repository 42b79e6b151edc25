"""A mup or completep GPT as an sp one computing the same function, for readers that know only GPT-2's
multipliers (transformers' GPT2LMHeadModel)."""
import math
from dataclasses import replace

import torch

from errors import ConfigError
from model import GPT


@torch.no_grad()
def sp_equivalent(model):
    """A GPT in sp computing `model`'s function: its multipliers (model_parts/parametrization.py) folded into
    weights. The attention's 1 / d_head is SP's 1 / sqrt(d_head) on queries scaled by 1 / sqrt(d_head); the
    branch scale scales each branch's last layer, c_proj; the logits' divisor divides ln_f's output (the head
    is the token embedding, which the input keeps unscaled)."""
    c, p = model.config, model.parametrization
    if c.param == "sp":
        return model
    if not hasattr(model.transformer.ln_f, "weight"):
        raise ConfigError(f"norm {c.norm!r} has no ln_f weight to fold the output multiplier 1/m_width into")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    d_head = c.n_embd // c.n_head
    for i in range(c.n_layer):
        for key in (f"transformer.h.{i}.attn.c_attn.weight", f"transformer.h.{i}.attn.c_attn.bias"):
            if key in state:
                state[key][:c.n_embd] /= math.sqrt(d_head)
        for branch in ("attn", "mlp"):
            for key in (f"transformer.h.{i}.{branch}.c_proj.weight", f"transformer.h.{i}.{branch}.c_proj.bias"):
                if key in state:
                    state[key] *= p.branch_scale
    for key in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
        if key in state:
            state[key] /= p.logit_divisor
    sp = GPT(replace(c, param="sp", base_width=0, base_depth=0), seed=0)  # every weight is model's
    sp.load_state_dict(state)
    return sp.to(next(model.parameters()).device).train(model.training)
