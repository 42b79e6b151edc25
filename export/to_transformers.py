"""Export a nanoact GPT-2 checkpoint as a transformers model directory.

    python export/to_transformers.py log/gelu/model_19073.pt out/gelu_hf  # the README recipe's last, with --act gelu
    python export/to_transformers.py log/aglu out/aglu_hf

    AutoModelForCausalLM.from_pretrained("out/gelu_hf")                          # plain GPT2LMHeadModel
    AutoModelForCausalLM.from_pretrained("out/aglu_hf", trust_remote_code=True)  # custom code
    AutoTokenizer.from_pretrained("out/aglu_hf")                                 # GPT-2's tokenizer
    lm_eval --model hf --model_args pretrained=out/aglu_hf,trust_remote_code=True --tasks hellaswag

Activations GPT-2 has (gelu -> "gelu_new", gelu_exact -> "gelu", relu, relu2, silu) export as a plain
GPT2LMHeadModel: any GPT-2 tooling reads it, a --param mup or completep model with its multipliers folded into
its weights (sp_equivalent). AGLU/APA/NSwish/NReLU (learned parameters, running
statistics), any other registered activation, every gated MLP (swiglu, aglu_glu ...), every normalization but
GPT-2's LayerNorm (--norm rmsnorm, dyt, none) and rotary positions (--pos-emb rope) export with remote code
copied from the real model.py and activations/ at export time (export/remote_code.py), with the small wrapper
export/transformers_wrapper.py.
The vocabulary is cut back from 50304 to GPT-2's 50257. Every export holds GPT-2's tokenizer
(export/tokenizer.py), built from tiktoken's gpt2 ranks, or from OpenAI's encoder.json + vocab.bpe with
--tokenizer-dir; both give the same files.
"""
import argparse
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from activations.basic import GELU, GELUExact, ReLU, ReLU2, SiLU
from data.tokenizer import EOT, VOCAB_SIZE
from errors import CheckpointError, ConfigError, NanoactError
from export.remote_code import AUTO_MAP, write_remote_code
from model import GPT
from model_parts.transformers_layout import nanoact_to_hf
from training.checkpoint import load_checkpoint

# The activations GPT-2 has, by class, and their names in GPT2Config.activation_function.
GPT2_ACTIVATIONS = {GELU: "gelu_new", GELUExact: "gelu", ReLU: "relu", ReLU2: "relu2", SiLU: "silu"}


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


def export_gpt2(model, out_dir, activation_function):
    """A GPT2LMHeadModel; missing biases (bias=False models) become zeros, which is what bias=False means."""
    from transformers import GPT2Config, GPT2LMHeadModel  # see export(): transformers is imported on first use
    c = model.config
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function=activation_function, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, bos_token_id=EOT, eos_token_id=EOT))
    state = nanoact_to_hf(model.state_dict(), VOCAB_SIZE)
    for key, value in hf.state_dict().items():
        if key not in state and key.endswith(".bias"):
            state[key] = torch.zeros_like(value)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to wte
    if missing or unexpected:
        raise CheckpointError(f"cannot map the checkpoint onto GPT2LMHeadModel: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    hf.save_pretrained(out_dir)


def export_remote(model, out_dir):
    """Our GPT in the NanoactForCausalLM wrapper, with remote code copied from the real sources (vocabulary
    cut to 50257)."""
    from export.transformers_wrapper import NanoactConfig, NanoactForCausalLM  # see export()
    write_remote_code(model.config, out_dir)
    hf = NanoactForCausalLM(NanoactConfig(**{**asdict(model.config), "vocab_size": VOCAB_SIZE}, auto_map=AUTO_MAP))
    state = model.state_dict()
    for key in ("transformer.wte.weight", "lm_head.weight"):
        state[key] = state[key][:VOCAB_SIZE]
    hf.gpt.load_state_dict(state)
    hf.save_pretrained(out_dir)


def export(checkpoint, out_dir, tokenizer_dir=None):
    """Write the transformers directory, GPT-2's tokenizer included (from OpenAI's files in `tokenizer_dir`, else
    from tiktoken); returns "gpt2" or "remote" (which kind was written)."""
    # transformers costs seconds to import: imported here and in export_gpt2/export_remote, not at the top, so
    # `--help` and a bad checkpoint path answer at once
    from export.tokenizer import bpe_from_openai_files, bpe_from_tiktoken, save_gpt2_tokenizer
    model = GPT.from_checkpoint(load_checkpoint(checkpoint, kind="gpt2"), "cpu")
    # the tokenizer first: a missing tiktoken cache then fails before any file is written
    vocab, merges = bpe_from_openai_files(tokenizer_dir) if tokenizer_dir else bpe_from_tiktoken()
    gpt2_names = {GPT2_ACTIVATIONS.get(type(block.mlp.act)) for block in model.transformer.h}
    gated = any(block.mlp.c_up is not None for block in model.transformer.h)  # GPT2LMHeadModel has no gated MLP
    # one activation GPT-2 has, everywhere, GPT-2's LayerNorm and learned positions (GPT2LMHeadModel has no others)
    plain = (len(gpt2_names) == 1 and None not in gpt2_names and not gated and model.config.norm == "layernorm"
             and model.config.pos_emb == "learned")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if plain:  # a mup or completep model's multipliers folded into its weights: GPT2LMHeadModel has none
        export_gpt2(sp_equivalent(model), out_dir, gpt2_names.pop())
    else:
        export_remote(model, out_dir)
    save_gpt2_tokenizer(out_dir, vocab, merges, model.config.block_size)
    return "gpt2" if plain else "remote"


def main(argv=None):
    p = argparse.ArgumentParser(description="Export a nanoact GPT-2 checkpoint as a transformers model directory.")
    p.add_argument("checkpoint", help="checkpoint file, or run directory (its newest checkpoint)")
    p.add_argument("out_dir")
    p.add_argument("--tokenizer-dir", help="build the tokenizer from GPT-2's encoder.json + vocab.bpe in this "
                   "directory instead of tiktoken's gpt2 ranks (the same files result)")
    args = p.parse_args(argv)
    try:
        kind = export(args.checkpoint, args.out_dir, args.tokenizer_dir)
    except NanoactError as e:
        sys.exit(f"error: {e}")
    how = "GPT2LMHeadModel" if kind == "gpt2" else "custom code: from_pretrained(..., trust_remote_code=True)"
    print(f"wrote {args.out_dir} ({how}; GPT-2 tokenizer: AutoTokenizer.from_pretrained)")


if __name__ == "__main__":
    main()
