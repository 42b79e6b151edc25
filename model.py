"""GPT-2, read top to bottom: a pre-LN Transformer decoder with a swappable MLP activation.

Architecture and init follow OpenAI's GPT-2 (and karpathy/build-nanogpt) by default: learned positions,
tied input/output embeddings, init std 0.02 with residual projections scaled by (2*n_layer)^-0.5.
GPTConfig's options change the MLP's activation (from the `activations` registry; a gated name such as swiglu
or aglu_glu makes it the gated MLP down(act(x W_gate) * (x W_up)) of activations/gated.py), the norm, the
positions (rotary), the init std and the parametrization (sp, mup, completep: model_parts/parametrization.py,
its rule table in docs/training.md).
Two speed options are constructor arguments, not config fields: they change how fast the same model
runs, so checkpoints do not record them and a resumed run may change them (tests/test_speed.py).
"""
import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from activations import layer_activation, load_fused_mlp, mlp_activation
from activations.impl import model_identity
from activations.gated import GatedProduct, hidden_width
from errors import CheckpointError, ConfigError
from activations.init_streams import init_parameters
from model_parts.chunked_loss import linear_cross_entropy
from model_parts.parametrization import Parametrization
from model_parts.transformers_layout import pretrained_gpt2


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # 50257 padded to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    act: str = "gelu"  # a registry name (plain MLP) or a gated one: swiglu, geglu, reglu, NAME_glu
    act_kwargs: dict = field(default_factory=dict)
    plain_top_k: int = 0  # ANAct's "NSwish + k Swish": the top k MLPs use the unnormalized activation
    glu_hidden: int = 0  # gated MLP's hidden width; 0: the plain MLP's parameters (activations/gated.py)
    norm: str = "layernorm"  # every ln_1, ln_2, ln_f: layernorm (GPT-2's), rmsnorm, dyt or none (NORMS)
    dyt_alpha: float = 0.5  # --norm dyt: every DyT's alpha at init (the paper's alpha_0; it tunes it for LLMs)
    param: str = "sp"  # the parametrization (model_parts/parametrization.py): sp (GPT-2's), mup or completep
    base_width: int = 0  # mup, completep: the n_embd the hyperparameters were tuned at (m_width = n_embd / base_width)
    base_depth: int = 0  # completep: the n_layer they were tuned at (m_depth = n_layer / base_depth)
    pos_emb: str = "learned"  # GPT-2's learned wpe, or rope (rotary, POSITIONS): no wpe, q and k rotated by position
    init_std: float = 0.02  # GPT-2's 0.02, every matrix and embedding; mup, completep: the base's


# SDPA kernels by name for `attention_backend`; "auto" leaves the choice to PyTorch.
ATTENTION_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                      "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def sdpa_backends(name):
    """"auto" -> None; "cudnn" or "cudnn,flash" (tried in that order) -> a list of SDPBackend."""
    if name == "auto":
        return None
    names = name.split(",")
    bad = [n for n in names if n not in ATTENTION_BACKENDS]
    if bad or not names:
        raise ConfigError(f"unknown attention_backend {name!r}; choose auto or one or more (comma-separated, "
                          f"tried in order) of {', '.join(ATTENTION_BACKENDS)}")
    return [ATTENTION_BACKENDS[n] for n in names]


class DyT(nn.Module):
    """Dynamic Tanh, weight * tanh(alpha * x) + bias, a drop-in for LayerNorm (Zhu et al. 2025, "Transformers
    without Normalization", Eq. 1): alpha one learnable scalar, init 0.5 (the paper's default alpha_0), weight and
    bias per channel at 1 and 0 like LayerNorm's. alpha is 0-D, so the optimizer never decays it."""

    def __init__(self, n_embd, bias=True, alpha=0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.bias = nn.Parameter(torch.zeros(n_embd)) if bias else None

    def forward(self, x):
        y = torch.tanh(self.alpha * x) * self.weight
        return y + self.bias if self.bias is not None else y


# The normalization of every ln_1, ln_2 and ln_f by GPTConfig.norm. RMSNorm keeps LayerNorm's eps (1e-5) and has
# no bias by definition; "none" is the normalization-free GPT-2 (docs/training.md: why its init stays GPT-2's).
NORMS = {
    "layernorm": lambda c: nn.LayerNorm(c.n_embd, bias=c.bias),
    "rmsnorm": lambda c: nn.RMSNorm(c.n_embd, eps=1e-5),
    "dyt": lambda c: DyT(c.n_embd, bias=c.bias, alpha=c.dyt_alpha),
    "none": lambda c: nn.Identity(),
}


def norm_layer(config):
    if config.norm not in NORMS:
        raise ConfigError(f"unknown norm {config.norm!r}; choose one of {', '.join(NORMS)}")
    return NORMS[config.norm](config)


POSITIONS = ("learned", "rope")
ROPE_BASE = 10000.0


def rotate(x, start):
    """RoPE (Su et al. 2021, eq. 34, GPT-NeoX's half split): each pair (x_i, x_{i + d/2}) of a head's q or k at
    position t turned by the angle t base^(-2i/d), so that q_t . k_s depends on t - s alone. x: (B, T, ..., d) at
    positions start, ..., start + T - 1 along dim 1 (c_attn's own layout); the angles in float32 at least
    (bfloat16's 8 bits would blur positions > 256)."""
    d, dtype = x.size(-1), torch.promote_types(x.dtype, torch.float32)
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, device=x.device, dtype=dtype) / d)
    angles = torch.arange(start, start + x.size(1), device=x.device, dtype=dtype)[:, None] * inv_freq
    angles = angles.view(x.size(1), *[1] * (x.dim() - 3), d // 2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, parametrization, backends=None):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.residual_scale = True
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.backends = backends
        self.scale = parametrization.attention_scale
        self.rope = config.pos_emb == "rope"

    def rotate_qk(self, qkv, start):
        """c_attn's (B, T, 3C) output with q and k rotated (rotate) and v copied beside them: one tensor,
        split as the learned-positions path splits it (faster than rotating q and k apart after the heads'
        transpose: BENCHMARKS.md, "Rotary positions")."""
        B, T, C3 = qkv.shape
        heads = qkv.view(B, T, 3, self.n_head, C3 // (3 * self.n_head))
        return torch.cat((rotate(heads[:, :, :2], start), heads[:, :, 2:]), dim=2).view(B, T, C3)

    def forward(self, x, cache=None):
        B, T, C = x.shape  # batch, sequence length, n_embd
        qkv = self.c_attn(x)  # (B, T, 3C)
        if self.rope:
            qkv = self.rotate_qk(qkv, cache[0].size(2) if cache else 0)
        q, k, v = qkv.split(C, dim=2)
        # (B, nh, T, hs): n_head heads of hs = C / n_head channels
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # generation: this layer's keys and values of the earlier tokens, then ours
            if cache:
                # (B, nh, past + T, hs)
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        # new tokens are either the whole sequence (causal mask) or one token that sees every cached one
        assert T in (1, k.size(2)), "a cached forward takes the prompt once, then one token at a time"
        # the kernel choice is a CUDA matter; on CPU it would turn PyTorch's CPU flash kernel on or off
        use = self.backends and x.is_cuda
        pick = sdpa_kernel(self.backends, set_priority=True) if use else contextlib.nullcontext()
        dropout = self.dropout if self.training else 0.0
        with pick:  # (B, nh, T, hs)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, dropout_p=dropout, scale=self.scale)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # heads side by side: (B, T, C)


def mlp_width_args(config):
    """activations/gated.py's hidden_width and width_note arguments for GPT-2's MLP."""
    return config.n_embd, 4 * config.n_embd, mlp_activation(config.act)[1], config.glu_hidden, config.bias


def mlp_width(config):
    """The MLP's hidden width: 4 n_embd, or the gated MLP's (activations/gated.py)."""
    return hidden_width(*mlp_width_args(config))


class MLP(nn.Module):
    """c_proj(act(c_fc(x))), or gated: c_proj(act(c_fc(x)) * c_up(x)), c_fc being the gate."""

    def __init__(self, config, layer):
        super().__init__()
        name, gated = mlp_activation(config.act)
        hidden = mlp_width(config)
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.act = layer_activation(name, config.act_kwargs, layer, config.n_layer, config.plain_top_k)
        self.c_up = nn.Linear(config.n_embd, hidden, bias=config.bias) if gated else None
        self.glu = GatedProduct() if gated else None
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.c_proj.residual_scale = True
        self.dropout = nn.Dropout(config.dropout)
        self.fused = False  # the matmuls with the activation in their epilogues: activations/policy.py decides

    def forward(self, x):
        if self.fused and (y := load_fused_mlp().forward(self, x)) is not None:
            return self.dropout(y)
        h = self.act(self.c_fc(x))  # (B, T, hidden)
        if self.c_up is not None:
            h = self.glu(h, self.c_up(x))
        return self.dropout(self.c_proj(h))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, config, layer, parametrization, backends=None):
        super().__init__()
        self.ln_1 = norm_layer(config)
        self.attn = CausalSelfAttention(config, parametrization, backends)
        self.ln_2 = norm_layer(config)
        self.mlp = MLP(config, layer)
        self.branch_scale = parametrization.branch_scale

    def forward(self, x, cache=None):
        # torch.add's alpha: one kernel, and x + branch itself (bit for bit) at 1
        x = torch.add(x, self.attn(self.ln_1(x), cache), alpha=self.branch_scale)
        return torch.add(x, self.mlp(self.ln_2(x)), alpha=self.branch_scale)


class GPT(nn.Module):
    """GPT-2. seed: the initial weights', every parameter drawn from its own stream of it (the trainers pass the
    run's seed + init_seed_offset). loss_chunks > 0: with targets, forward computes the LM head and the loss in
    that many row chunks (linear_cross_entropy) and returns no logits. attention_backend: the SDPA kernel(s) on
    CUDA."""

    def __init__(self, config, loss_chunks=0, attention_backend="auto", *, seed):
        super().__init__()
        self.config = config
        if loss_chunks < 0:
            raise ConfigError(f"loss_chunks={loss_chunks} must be >= 0 (0: off)")
        self.loss_chunks = loss_chunks
        self.parametrization = p = Parametrization.of(config)
        if config.pos_emb not in POSITIONS:
            raise ConfigError(f"unknown pos_emb {config.pos_emb!r}; choose one of {', '.join(POSITIONS)}")
        backends = sdpa_backends(attention_backend)
        # the modules' own draws are overwritten below; forked, they leave the global RNG (dropout's) as the
        # seed set it, whatever modules this MLP adds
        with torch.random.fork_rng(devices=[]):
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                **({"wpe": nn.Embedding(config.block_size, config.n_embd)} if config.pos_emb == "learned"
                   else {}),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(Block(config, i, p, backends) for i in range(config.n_layer)),
                ln_f=norm_layer(config),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        # one stream per parameter name, so models that differ in their MLP start equal everywhere else
        # (activations/init_streams.py)
        init_parameters(self, seed, self._init_weight)

    def _init_weight(self, name, module, parameter, generator):
        """GPT-2's init: N(0, 0.02), residual projections N(0, 0.02 (2 n_layer)^-0.5), zero biases; the
        norms keep their constructors' values (ones, zeros, DyT's alpha 0.5). init_std replaces every 0.02;
        mup and completep scale the block matrices' (the parametrization's hidden_std and residual_std)."""
        p = self.parametrization
        if isinstance(module, nn.Linear) and name.endswith(".bias"):
            nn.init.zeros_(parameter)
        elif isinstance(module, nn.Linear):  # the tied lm_head is wte, an Embedding
            std = p.residual_std if getattr(module, "residual_scale", False) else p.hidden_std
            nn.init.normal_(parameter, mean=0.0, std=std, generator=generator)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(parameter, mean=0.0, std=self.config.init_std, generator=generator)

    def optimizer_groups(self, weight_decay, eps):
        """AdamW's parameter groups under the parametrization (None under sp: training/optimizer.py's)."""
        return self.parametrization.optimizer_groups(self, weight_decay, eps)

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        return n - self.position_parameters() if non_embedding else n

    def position_parameters(self):
        return self.transformer.wpe.weight.numel() if "wpe" in self.transformer else 0

    def param_counts(self):
        """What a comparison of MLPs states: all parameters, those outside the token and position embeddings
        (the ones an MLP's form changes), and one MLP's (its activation's own included)."""
        total = self.num_params(non_embedding=False)
        embeddings = self.transformer.wte.weight.numel() + self.position_parameters()
        mlp = sum(p.numel() for p in self.transformer.h[0].mlp.parameters())
        return {"total": total, "non_embedding": total - embeddings, "mlp_per_layer": mlp}

    def forward(self, idx, targets=None, cache=None, head=True):
        """cache: None, or one list per layer (empty at first) in which attention keeps the keys and values
        of the tokens seen so far, so that generation feeds each new token alone (see generate).
        head=False: (final hidden states after ln_f and the output multiplier, None), the LM head left to the
        caller, which applies it to the few positions it needs (eval/scoring.py scores only the continuations'
        tokens)."""
        if targets is not None and not head:
            raise ValueError("a loss needs the LM head: targets with head=False")
        past = cache[0][0].size(2) if cache and cache[0] else 0
        T = idx.size(1)  # idx: (B, T) token ids
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(past, past + T, device=idx.device))  # + (T, C)
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache[i] if cache is not None else None)  # (B, T, C)
        x = self.transformer.ln_f(x)
        divisor = self.parametrization.logit_divisor
        if divisor != 1:  # muP's logits / m_width, on the head's input: for the tied head and the chunked loss
            x = x / divisor
        if not head:
            return x, None
        if targets is not None and self.loss_chunks:  # targets: (B, T), -1 where none
            return None, linear_cross_entropy(x.view(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1),
                                              self.loss_chunks)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def flops_per_token(self, seq_len):
        """Training FLOPs per token: 6N for the matmuls plus the attention scores (PaLM appendix B). N counts the
        real matrices, so a gated MLP's three (at its own width) are counted as they are."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * seq_len

    def estimate_mfu(self, tokens_per_second, seq_len, device_name):
        """Model FLOPs utilisation against the device's dense bf16 peak; None for an unknown device."""
        peak = next((flops for key, flops in PEAK_FLOPS if key in (device_name or "")), None)
        if peak is None:
            return None
        return self.flops_per_token(seq_len) * tokens_per_second / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True):
        """Sample max_new_tokens tokens after idx (B, T). With use_cache, the prompt is run once and then each
        new token alone, attending to the cached keys/values; once the text outgrows block_size, positions
        shift, so every step recomputes the last block_size tokens, as without the cache."""
        cache = [[] for _ in self.transformer.h] if use_cache else None
        for _ in range(max_new_tokens):
            if cache is not None and idx.size(1) <= self.config.block_size:
                logits, _ = self(idx[:, -1:] if cache[0] else idx, cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size:])
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits.float(), dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
        return idx

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu"):
        """The model (in eval mode) of a GPT-2 checkpoint as training/checkpoint.py's load_checkpoint(path,
        kind="gpt2") reads it (ours, build-nanogpt's or nanoGPT's; as data, never code). This file reads no
        file itself: export/ copies it, and what it imports, as transformers remote code."""
        model = cls(GPTConfig(**model_identity(ckpt["model_config"])), seed=0)  # every weight is the checkpoint's
        model.load_state_dict(ckpt["model"])
        return model.to(device).eval()

    @classmethod
    def from_pretrained(cls, name_or_dir, act="gelu", act_kwargs=None, seed=0):
        """GPT-2 weights in transformers' GPT2LMHeadModel layout (a local directory or a hub name such as
        gpt2 or openai-community/gpt2), vocabulary 50257 so that logits match transformers'. A non-GELU `act`
        keeps the weights and starts its own parameters at their init (drawn from `seed` where it is random)."""
        if mlp_activation(act)[1]:
            raise ConfigError(f"act {act!r} is a gated MLP: GPT-2's weights are a plain two-matrix MLP, so no weights "
                              "map onto its three matrices; pick a plain activation or train from scratch")
        architecture, state = pretrained_gpt2(name_or_dir)
        model = cls(GPTConfig(**architecture, act=act, act_kwargs=act_kwargs or {}), seed=seed)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if ".mlp.act." not in k]
        if missing or unexpected:
            raise CheckpointError(f"{name_or_dir} is not a GPT-2 checkpoint: missing {missing[:3]}, unexpected {unexpected[:3]}")
        return model


# Peak dense bf16 tensor throughput (FLOP/s, no sparsity) by device-name substring; first match wins.
# Unknown devices get no MFU rather than a wrong one.
PEAK_FLOPS = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("GH200", 989e12), ("B200", 2250e12),
              ("A100", 312e12), ("A10G", 70e12), ("L40S", 362e12), ("L4", 121e12), ("RTX 4090", 165e12),
              ("RTX 3090", 71e12), ("V100", 125e12)]
