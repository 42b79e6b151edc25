"""How init, forward and AdamW scale with the model's size: GPTConfig.param's multipliers, computed once.

sp is GPT-2 as build-nanogpt trains it; mup is Tensor Programs V (Yang et al. 2022) as EleutherAI/nanoGPT-mup
implements it; completep is Dey et al. 2025 (arXiv 2505.01618) Table 1 at alpha = 1. Each scales from a base
model (base_width, base_depth) whose lr, init and weight decay were tuned: m_width = n_embd / base_width,
m_depth = n_layer / base_depth. The rule table, and when to use which: docs/training.md, "Parametrization".
Each field is held in the form model.py applies it (a divisor stays a divisor), so sp is GPT-2 bit for bit.
"""
import math
from dataclasses import dataclass

import torch.nn as nn

from errors import ConfigError

PARAMETRIZATIONS = ("sp", "mup", "completep")


@dataclass(frozen=True)
class Parametrization:
    name: str
    m_width: float
    m_depth: float
    hidden_std: float  # init std of the blocks' matrices (c_attn, c_fc, c_up); embeddings keep init_std
    residual_std: float  # init std of the branches' last matrices (c_proj)
    attention_scale: float | None  # q.k times this; None: SDPA's own 1 / sqrt(d_head)
    branch_scale: float  # x + branch_scale F(x)
    logit_divisor: float  # lm_head(h / logit_divisor): on the head's input (tied head and chunked loss alike)
    hidden_lr_scale: float  # AdamW: the hidden matrices' lr multiple of the schedule's lr
    hidden_decay_factor: float  # their weight decay multiple, so that AdamW's lr * wd stays the base's
    eps_divisor: float  # every group's Adam eps / eps_divisor

    @classmethod
    def of(cls, config):
        """config's multipliers; a one-line ConfigError for an unknown param or a base it lacks."""
        if config.param not in PARAMETRIZATIONS:
            raise ConfigError(f"unknown param {config.param!r}; choose one of {', '.join(PARAMETRIZATIONS)}")
        if config.param != "sp" and config.base_width <= 0:
            raise ConfigError(f"param {config.param} needs base_width > 0: the n_embd its lr was tuned at "
                              "(--base-width; the tuned model's own n_embd for that model itself)")
        if config.param == "completep" and config.base_depth <= 0:
            raise ConfigError("param completep needs base_depth > 0: the n_layer its lr was tuned at (--base-depth; "
                              "the tuned model's own n_layer for that model itself)")
        m_width = 1.0 if config.param == "sp" else config.n_embd / config.base_width
        m_depth = config.n_layer / config.base_depth if config.param == "completep" else 1.0
        sp, hidden_std = config.param == "sp", config.init_std / math.sqrt(m_width)
        # muP's q.k / d_head keeps the logits' scale as d_head grows, q and k being correlated once trained
        return cls(config.param, m_width, m_depth, hidden_std=hidden_std,
                   residual_std=hidden_std * (2 * config.n_layer) ** -0.5 if sp else hidden_std,
                   attention_scale=None if sp else config.n_head / config.n_embd, branch_scale=1 / m_depth,
                   logit_divisor=m_width, hidden_lr_scale=1 / m_width, hidden_decay_factor=m_width,
                   eps_divisor=m_width * m_depth)

    def optimizer_groups(self, model, weight_decay, eps):
        """AdamW's parameter groups, each with its weight decay, eps and lr_scale (the multiple of the
        schedule's lr it steps at: training/optimizer.py's set_lr); None under sp, whose groups are
        training/optimizer.py's decay split. Hidden: the blocks' matrices; embeddings: wte (= lm_head) and wpe;
        the rest (norms, biases, an activation's own parameters) vector-like, never decayed."""
        if self.name == "sp":
            return None
        hidden, embeddings, vectors = [], [], []
        for name, parameter in model.named_parameters():
            module = model.get_submodule(name.rpartition(".")[0])
            if not parameter.requires_grad:
                continue
            if name.startswith("transformer.h.") and isinstance(module, nn.Linear) and name.endswith(".weight"):
                hidden.append(parameter)
            elif isinstance(module, nn.Embedding):
                embeddings.append(parameter)
            else:
                vectors.append(parameter)
        eps = eps / self.eps_divisor
        return [{"params": hidden, "weight_decay": weight_decay * self.hidden_decay_factor,
                 "lr_scale": self.hidden_lr_scale, "eps": eps},
                {"params": embeddings, "weight_decay": weight_decay, "lr_scale": 1.0, "eps": eps},
                {"params": vectors, "weight_decay": 0.0, "lr_scale": 1.0, "eps": eps}]
