"""Configuration of a nanoact GPT-2 exported for transformers (loaded with trust_remote_code=True)."""
from transformers import PretrainedConfig


class NanoactConfig(PretrainedConfig):
    """GPT-2 shape plus one activation spec per layer: {"name": "aglu" | "apa" | "nswish" | "nrelu" |
    "gelu" | "gelu_exact" | "relu" | "relu2" | "silu", and that activation's options}."""

    model_type = "nanoact"
    attribute_map = {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "max_position_embeddings": "n_positions"}  # the names generate() looks up, as GPT2Config

    def __init__(self, vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, bias=True,
                 layer_acts=None, **kwargs):
        self.vocab_size, self.n_positions, self.n_embd = vocab_size, n_positions, n_embd
        self.n_layer, self.n_head, self.bias = n_layer, n_head, bias
        self.layer_acts = layer_acts or [{"name": "gelu"}] * n_layer
        kwargs.setdefault("bos_token_id", 50256)
        kwargs.setdefault("eos_token_id", 50256)
        kwargs.setdefault("tie_word_embeddings", False)  # the head reads wte directly; nothing to tie
        super().__init__(**kwargs)
