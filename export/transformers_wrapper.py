"""transformers wrapper around nanoact's GPT: the model of an export with remote code.

Only glue around model.py's GPT. Export copies this file, model.py and the activation files next to
the weights (export/remote_code.py); transformers loads them with trust_remote_code=True.
Inference semantics: NSwish/NReLU use their running statistics, like BatchNorm in eval mode.
"""
from dataclasses import asdict

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from model import GPT, GPTConfig


class NanoactConfig(PretrainedConfig):
    """GPTConfig's fields (so a field added in model.py exports with no change here), plus the names
    generate() looks up."""

    model_type = "nanoact"
    attribute_map = {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "max_position_embeddings": "block_size"}

    def __init__(self, **kwargs):
        for name, default in asdict(GPTConfig()).items():
            setattr(self, name, kwargs.pop(name, default))
        kwargs.setdefault("bos_token_id", 50256)
        kwargs.setdefault("eos_token_id", 50256)
        kwargs.setdefault("tie_word_embeddings", True)  # GPT's head is the token embedding, as in GPT-2
        super().__init__(**kwargs)

    def gpt_config(self):
        return GPTConfig(**{name: getattr(self, name) for name in asdict(GPTConfig())})


class NanoactForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoactConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"
    _tied_weights_keys = {"gpt.lm_head.weight": "gpt.transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config(), seed=0)  # the export's weights are loaded over it
        self.post_init()

    def _init_weights(self, module):
        """GPT initialises itself, and an exported model's weights all come from the checkpoint."""

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """There is no KV cache: generate() must feed the whole sequence at every step, not the new token."""
        n = self.config.block_size
        mask = None if attention_mask is None else attention_mask[:, -n:]
        return {"input_ids": input_ids[:, -n:], "attention_mask": mask}

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if attention_mask is None or bool(attention_mask.all()):
            logits, _ = self.gpt(input_ids)
        else:
            logits = self.padded_logits(input_ids, attention_mask)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here, -100 ignored
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def padded_logits(self, input_ids, attention_mask):
        """Logits of a padded batch, each row's tokens one run between pads. Right pads are harmless under the
        causal mask, but GPT's absolute positions start at the first token it is given: rows with p left pads
        (generate() and lm-eval pad on the left) run from column p on, grouped by p. Pad positions get 0."""
        mask = attention_mask.bool()
        lead, kept = (mask.cumsum(1) == 0).sum(1), mask.sum(1)
        cols = torch.arange(mask.size(1), device=mask.device)
        if not torch.equal(mask, (cols >= lead[:, None]) & (cols < (lead + kept)[:, None])):
            raise ValueError("attention_mask: each row's tokens must be one run between its left and right padding")
        logits = None
        for p in lead.unique().tolist():
            rows = lead == p
            if p == mask.size(1):  # a row of padding only
                continue
            part, _ = self.gpt(input_ids[rows, p:])
            if logits is None:
                logits = part.new_zeros(*mask.shape, part.size(-1))
            logits[rows, p:] = part
        return logits
