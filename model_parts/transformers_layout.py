"""GPT-2's weights in transformers' GPT2LMHeadModel layout and ours: the same names, Conv1D's matrices
stored transposed against nn.Linear's."""
from errors import CheckpointNotFound

TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_to_nanoact(hf_state):
    out = {}
    for key, value in hf_state.items():
        if key.endswith(("attn.masked_bias", "attn.bias")) and value.dim() > 1:
            continue  # causal-mask buffers of older transformers versions
        out[key] = value.t() if key.endswith(TRANSPOSED) else value
    return out


def nanoact_to_hf(state, vocab_size=50257):
    """Our state dict -> GPT2LMHeadModel's (unpadded vocabulary, Conv1D-transposed weights)."""
    out = {}
    for key, value in state.items():
        if ".mlp.act." in key:
            continue
        if key in ("transformer.wte.weight", "lm_head.weight"):
            value = value[:vocab_size]
        out[key] = value.t().contiguous() if key.endswith(TRANSPOSED) else value
    return out


def pretrained_gpt2(name_or_dir):
    """(GPTConfig architecture fields, our state dict) of transformers GPT-2 weights: a directory written by
    save_pretrained, or a hub name (read from the hub's cache when offline)."""
    from transformers import GPT2LMHeadModel  # a slow import, needed only to read GPT-2 weights

    try:
        hf = GPT2LMHeadModel.from_pretrained(name_or_dir)
    except (OSError, ValueError) as e:  # transformers' messages span lines; the first says what failed
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise CheckpointNotFound(f"{name_or_dir}: no transformers GPT-2 there ({first.strip()}); give a directory "
                                 "written by save_pretrained, or a hub name such as gpt2 or openai-community/gpt2 "
                                 "(downloaded once, then read from the cache offline)") from None
    hc = hf.config
    architecture = dict(block_size=hc.n_positions, vocab_size=hc.vocab_size, n_layer=hc.n_layer, n_head=hc.n_head,
                        n_embd=hc.n_embd, dropout=0.0, bias=True)
    return architecture, hf_to_nanoact(hf.state_dict())
