"""A nanoact GPT-2 for transformers: pre-LN decoder, learned positions, output head tied to the token
embedding, and the learned MLP activations (AGLU/APA, NSwish/NReLU) it was trained with.

Standalone on purpose (exported next to the weights, loaded with trust_remote_code=True): it imports
only torch and transformers. Inference semantics: NSwish/NReLU use their running statistics, like
BatchNorm in eval mode. Weights keep nanoact's names (nn.Linear layout, not GPT-2's Conv1D).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_nanoact import NanoactConfig


def _up(t):
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _swish_grad(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


PLAIN = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "gelu_exact": F.gelu, "relu": F.relu,
         "relu2": lambda x: F.relu(x).square(), "silu": F.silu, "swish": F.silu}
NORMALIZED = {"nswish": (F.silu, _swish_grad), "nrelu": (F.relu, lambda x: (x > 0).to(x.dtype))}


class Plain(nn.Module):
    def __init__(self, spec, n_channels):
        super().__init__()
        self.fn = PLAIN[spec["name"]]

    def forward(self, x):
        return self.fn(x)


class APA(nn.Module):
    """eta = (lam e^{-kappa z} + 1)^(-1/lam), as ln eta = -softplus(ln lam - kappa z) / lam (stable
    form, APA paper App. B.1); AGLU = z * eta. lam is clamped at 1e-4 as in training."""

    def __init__(self, spec, n_channels):
        super().__init__()
        shape = (n_channels,) if spec.get("channelwise") else ()
        self.kappa, self.lam = nn.Parameter(torch.ones(shape)), nn.Parameter(torch.ones(shape))
        self.gated = spec["name"] == "aglu"

    def forward(self, z):
        zf, lam = _up(z), _up(self.lam).clamp_min(1e-4)
        eta = torch.exp(-F.softplus(torch.log(lam) - zf * _up(self.kappa)) / lam)
        return (zf * eta if self.gated else eta).to(z.dtype)


class Normalized(nn.Module):
    """ANAct: (sqrt((rho + rho') / (2 rho rho')) + beta tanh(alpha)) * (act(x) - mu), with mu, rho, rho'
    the running statistics, or per token over the channels when per_instance."""

    def __init__(self, spec, n_channels):
        super().__init__()
        self.act, self.act_grad = NORMALIZED[spec["name"]]
        self.beta, self.eps, self.per_instance = spec.get("beta", 0.3), spec.get("eps", 1e-5), spec.get("per_instance")
        self.alpha = nn.Parameter(torch.zeros(()))
        if not self.per_instance:
            for name in ("running_mu", "running_rho", "running_rho_prime"):
                self.register_buffer(name, torch.ones(()))

    def forward(self, x):
        xf = _up(x)
        y = self.act(xf)
        if self.per_instance:
            var_y, mu = torch.var_mean(y, dim=-1, correction=0, keepdim=True)
            var_x = torch.var(xf, dim=-1, correction=0, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
            rho = (var_y / var_x).clamp_min(self.eps)
            rho_prime = self.act_grad(xf).square().mean(-1, keepdim=True).clamp_min(self.eps)
        else:
            mu, rho, rho_prime = self.running_mu, self.running_rho, self.running_rho_prime
        scale = torch.sqrt((rho + rho_prime) / (2 * rho * rho_prime)) + self.beta * torch.tanh(self.alpha)
        return ((y - mu) * scale).to(x.dtype)


ACTIVATIONS = {**{k: Plain for k in PLAIN}, "aglu": APA, "apa": APA, "nswish": Normalized, "nrelu": Normalized}


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head = c.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, c, spec):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.act = ACTIVATIONS[spec["name"]](spec, 4 * c.n_embd)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c, spec):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c.n_embd, bias=c.bias), Attention(c)
        self.ln_2, self.mlp = nn.LayerNorm(c.n_embd, bias=c.bias), MLP(c, spec)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoactForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoactConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"

    def __init__(self, config):
        super().__init__(config)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.n_positions, config.n_embd),
            h=nn.ModuleList(Block(config, spec) for spec in config.layer_acts),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.post_init()

    def _init_weights(self, module):
        """Every weight comes from the exported checkpoint; there is nothing to initialise."""

    def get_input_embeddings(self):
        return self.transformer.wte

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """There is no KV cache: generate() must feed the whole sequence at every step, not the new token."""
        n = self.config.n_positions
        mask = None if attention_mask is None else attention_mask[:, -n:]
        return {"input_ids": input_ids[:, -n:], "attention_mask": mask}

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not torch.equal(attention_mask, attention_mask.cummin(dim=1).values):
            raise ValueError("nanoact models use absolute positions from 0: pad on the right (no left padding)")
        T = input_ids.size(1)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(torch.arange(T, device=input_ids.device))
        for block in self.transformer.h:
            x = block(x)
        logits = F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)
