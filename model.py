"""GPT-2 in one file: pre-LN Transformer decoder with a swappable MLP activation.

Architecture and init follow OpenAI's GPT-2 (and karpathy/build-nanogpt): learned positions,
tied input/output embeddings, init std 0.02 with residual projections scaled by (2*n_layer)^-0.5.
Only the MLP changes between runs: its activation comes from the `activations` registry, and a gated name
(swiglu, aglu_glu ...) makes it the gated MLP down(act(x W_gate) * (x W_up)) of activations/gated.py.
Two speed options are constructor arguments, not config fields: they change how fast the same model
runs, so checkpoints do not record them and a resumed run may change them (tests/test_speed.py).
"""
import contextlib
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from activations import layer_activation, load_fused_mlp, mlp_activation
from activations.impl import model_identity
from activations.gated import GatedProduct, hidden_width
from errors import CheckpointError, CheckpointNotFound, ConfigError
from activations.init_streams import init_parameters

# Peak dense bf16 tensor throughput (FLOP/s, no sparsity) by device-name substring; first match wins.
# Unknown devices get no MFU rather than a wrong one.
PEAK_FLOPS = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),
]


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
    param: str = "sp"  # the parametrization (model.py PARAMETRIZATIONS): sp (GPT-2's), mup or completep
    base_width: int = 0  # mup, completep: the n_embd the hyperparameters were tuned at (m_width = n_embd / base_width)
    base_depth: int = 0  # completep: the n_layer they were tuned at (m_depth = n_layer / base_depth)
    pos_emb: str = "learned"  # GPT-2's learned wpe, or rope (rotary, POSITIONS): no wpe, q and k rotated by position
    init_std: float = 0.02  # GPT-2's 0.02, every matrix and embedding; mup, completep: the base's (PARAMETRIZATIONS)


# How init, forward and AdamW scale with the model's size under GPTConfig.param, against the base model (base_width,
# base_depth) whose lr, init and weight decay were tuned: m_width = n_embd / base_width, m_depth = n_layer / base_depth.
# sp is GPT-2 as build-nanogpt trains it; mup is Tensor Programs V (Yang et al. 2022: Table 3's muP for Adam in its
# form with an output multiplier, and the 1/d attention of its Sec. 4) as EleutherAI/nanoGPT-mup implements it;
# completep is Dey et al. 2025 (arXiv 2505.01618) Table 1 at alpha = 1 as nanoGPT-mup's completep branch implements
# it: residual branches h + m_depth^-alpha F(h), every lr factor m_depth^(alpha-1) then equal to 1.
#                                    sp                      mup                   completep
#   hidden matrices' init std        s; c_proj's             s / sqrt(m_width)     s / sqrt(m_width)
#     (c_attn, c_proj, c_fc, c_up)     s / sqrt(2 n_layer)     (c_proj's too)        (c_proj's too)
#     s = init_std, GPT-2's 0.02 by default
#   hidden matrices' lr              lr                      lr / m_width          lr / m_width
#   hidden matrices' weight decay    wd                      wd * m_width          wd * m_width
#     (AdamW decays lr * wd per step: the base's decay at every width, independent of the width's lr scaling)
#   embeddings (wte = lm_head, wpe)  s, lr, wd               unchanged             unchanged
#   norms, biases, activation        lr, no decay            unchanged             unchanged
#     scalars (AGLU/APA, NSwish ...)
#   attention logits                 q.k / sqrt(d_head)      q.k / d_head          q.k / d_head
#   residual branches                x + F(x)                x + F(x)              x + F(x) / m_depth
#   logits                           lm_head(h)              lm_head(h) / m_width  lm_head(h) / m_width
#   Adam eps                         eps                     eps / m_width         eps / (m_width m_depth)
# Every MLP follows the hidden rule: plain or gated (whose width is the plain one's parameters, so it grows with
# n_embd), whatever its activation; an activation's own parameters are vector-like. The optimizer's part is
# GPT.optimizer_groups; docs/training.md says when to use which.
PARAMETRIZATIONS = ("sp", "mup", "completep")


def size_multipliers(config):
    """(m_width, m_depth) of config's parametrization: (1, 1) under sp, m_depth 1 under mup."""
    if config.param not in PARAMETRIZATIONS:
        raise ConfigError(f"unknown param {config.param!r}; choose one of {', '.join(PARAMETRIZATIONS)}")
    if config.param == "sp":
        return 1.0, 1.0
    if config.base_width <= 0:
        raise ConfigError(f"param {config.param} needs base_width > 0: the n_embd its lr was tuned at "
                          "(--base-width; the tuned model's own n_embd for that model itself)")
    if config.param == "mup":
        return config.n_embd / config.base_width, 1.0
    if config.base_depth <= 0:
        raise ConfigError("param completep needs base_depth > 0: the n_layer its lr was tuned at (--base-depth; the "
                          "tuned model's own n_layer for that model itself)")
    return config.n_embd / config.base_width, config.n_layer / config.base_depth


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
    def __init__(self, config, backends=None):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.residual_scale = True
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.backends = backends
        # muP's q.k / d_head keeps the logits' scale as d_head grows, q and k being correlated once trained;
        # None: SDPA's own 1 / sqrt(d_head)
        self.scale = None if config.param == "sp" else config.n_head / config.n_embd
        self.rope = config.pos_emb == "rope"

    def rotate_qk(self, qkv, start):
        """c_attn's (B, T, 3C) output with q and k rotated (rotate) and v copied beside them: one tensor, split as
        the learned-positions path splits it (q and k rotated apart after the heads' transpose: a 124M step 88.1 ms
        on an H200, this way 79.0, learned positions 66.2; BENCHMARKS.md)."""
        B, T, C3 = qkv.shape
        heads = qkv.view(B, T, 3, self.n_head, C3 // (3 * self.n_head))
        return torch.cat((rotate(heads[:, :, :2], start), heads[:, :, 2:]), dim=2).view(B, T, C3)

    def forward(self, x, cache=None):
        B, T, C = x.shape
        qkv = self.c_attn(x)
        if self.rope:
            qkv = self.rotate_qk(qkv, cache[0].size(2) if cache else 0)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # generation: this layer's keys and values of the earlier tokens, then ours
            if cache:
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        # new tokens are either the whole sequence (causal mask) or one token that sees every cached one
        assert T in (1, k.size(2)), "a cached forward takes the prompt once, then one token at a time"
        # the kernel choice is a CUDA matter; on CPU it would turn PyTorch's CPU flash kernel on or off
        use = self.backends and x.is_cuda
        pick = sdpa_kernel(self.backends, set_priority=True) if use else contextlib.nullcontext()
        dropout = self.dropout if self.training else 0.0
        with pick:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, dropout_p=dropout, scale=self.scale)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


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

    def forward(self, x):
        if getattr(self, "fused", False) and (y := load_fused_mlp().forward(self, x)) is not None:
            return self.dropout(y)
        h = self.act(self.c_fc(x))
        if self.c_up is not None:
            h = self.glu(h, self.c_up(x))
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config, layer, backends=None):
        super().__init__()
        self.ln_1 = norm_layer(config)
        self.attn = CausalSelfAttention(config, backends)
        self.ln_2 = norm_layer(config)
        self.mlp = MLP(config, layer)
        self.branch_scale = 1 / size_multipliers(config)[1]  # CompleteP's 1 / m_depth; 1 otherwise

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
        self.m_width, self.m_depth = size_multipliers(config)
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
                h=nn.ModuleList(Block(config, i, backends) for i in range(config.n_layer)),
                ln_f=norm_layer(config),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        # one stream per parameter name, so models that differ in their MLP start equal everywhere else
        # (activations/init_streams.py)
        init_parameters(self, seed, self._init_weight)

    def _init_weight(self, name, module, parameter, generator):
        """GPT-2's init: N(0, 0.02), residual projections N(0, 0.02 (2 n_layer)^-0.5), zero biases; the
        norms keep their constructors' values (ones, zeros, DyT's alpha 0.5). mup and completep: every hidden
        matrix N(0, 0.02 / sqrt(m_width)), the residual projections' depth factor replaced (PARAMETRIZATIONS).
        init_std replaces every 0.02."""
        std = self.config.init_std
        if isinstance(module, nn.Linear) and name.endswith(".bias"):
            nn.init.zeros_(parameter)
        elif isinstance(module, nn.Linear) and self.config.param != "sp":  # the tied lm_head is wte, an Embedding
            nn.init.normal_(parameter, mean=0.0, std=std / math.sqrt(self.m_width), generator=generator)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            residual = getattr(module, "residual_scale", False)
            nn.init.normal_(parameter, mean=0.0, std=std * (2 * self.config.n_layer) ** -0.5 if residual else std,
                            generator=generator)

    def optimizer_groups(self, weight_decay, eps):
        """AdamW's parameter groups under mup and completep (PARAMETRIZATIONS), each with its weight decay, eps and
        lr_scale, the multiple of the schedule's lr it steps at (training/optimizer.py's set_lr); None under sp,
        whose groups are training/optimizer.py's decay split."""
        if self.config.param == "sp":
            return None
        hidden, embeddings, vectors = [], [], []
        for name, parameter in self.named_parameters():
            module = self.get_submodule(name.rpartition(".")[0])
            if not parameter.requires_grad:
                continue
            if name.startswith("transformer.h.") and isinstance(module, nn.Linear) and name.endswith(".weight"):
                hidden.append(parameter)
            elif isinstance(module, nn.Embedding):
                embeddings.append(parameter)
            else:
                vectors.append(parameter)
        eps = eps / (self.m_width * self.m_depth)
        return [{"params": hidden, "weight_decay": weight_decay * self.m_width, "lr_scale": 1 / self.m_width,
                 "eps": eps},
                {"params": embeddings, "weight_decay": weight_decay, "lr_scale": 1.0, "eps": eps},
                {"params": vectors, "weight_decay": 0.0, "lr_scale": 1.0, "eps": eps}]

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
        T = idx.size(1)
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(past, past + T, device=idx.device))
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache[i] if cache is not None else None)
        x = self.transformer.ln_f(x)
        if self.m_width != 1:  # muP's logits / m_width, on the head's input: the tied head and the chunked loss alike
            x = x / self.m_width
        if not head:
            return x, None
        if targets is not None and self.loss_chunks:
            return None, linear_cross_entropy(x.view(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1),
                                              self.loss_chunks)
        logits = self.lm_head(x)
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
        file itself: it stays the single GPT-2 file that export/ copies as transformers remote code."""
        model = cls(GPTConfig(**model_identity(ckpt["model_config"])), seed=0)  # every weight is the checkpoint's
        model.load_state_dict(ckpt["model"])
        return model.to(device).eval()

    @classmethod
    def from_pretrained(cls, name_or_dir, act="gelu", act_kwargs=None, seed=0):
        """Load GPT-2 weights in transformers' GPT2LMHeadModel layout (a local directory or a hub name such as
        gpt2, gpt2-medium or openai-community/gpt2).

        The vocabulary stays 50257 so logits match transformers' exactly. A non-GELU `act` keeps the
        pretrained weights and adds the activation's own parameters at their init values (drawn from `seed`
        where the activation's init is random, as AGLU's).
        """
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


class _LinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(hidden_i @ weight.T, target_i) over targets != -1, a chunk of rows at a time.

    The gradients are computed in the forward, chunk by chunk, so neither pass ever holds more than one
    chunk of logits (the plain path keeps the (N, V) logits and their fp32 gradient: 13 GB each at
    64 x 1024 x 50304), and no logit is computed twice. Under autocast the matmuls run in its dtype and
    the softmax in fp32, as in the plain path; the weight gradient is summed over chunks in fp32.

    The logit gradient enters the half-precision matmuls before the upstream gradient (a GradScaler's scale)
    is known, so it brings its own: fp16 flushes values under 6e-8 to zero, and softmax / n_valid would put
    every probability under n_valid * 6e-8 there (at 16,384 rows and 50,304 tokens: 6% error on the LM head's
    gradient, 10% on the hidden states', against 0.03% for the plain path and for this cast). It is
    cast as softmax - onehot, within [-1, 1], times the largest power of two (at most 2^14) that keeps each
    product's largest possible entry finite, and the fp32 product is divided back (a power of two: no rounding).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, n_chunks, with_grad):
        device = hidden.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        high = torch.promote_types(low, torch.float32)  # fp32 softmax (float64 stays float64)
        w = weight.to(low)
        n_valid = (targets != -1).sum()
        loss = torch.zeros((), dtype=high, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if with_grad else None
        grad_weight = torch.zeros_like(weight, dtype=high) if with_grad else None
        # a row of softmax - onehot sums to at most 2 in absolute value: |(d_logits @ w)_ij| <= 2 max|w|
        hidden_scale = matmul_scale(2 * w.abs().max().to(high), low) if with_grad else None
        size = -(-hidden.size(0) // n_chunks)
        for start in range(0, hidden.size(0), size):
            h, t = hidden[start:start + size].to(low), targets[start:start + size]
            logits = (h @ w.t()).to(high)  # the plain path's logits: the matmul in `low`, then upcast
            lse = logits.logsumexp(-1)
            valid = t != -1
            index = t.clamp_min(0)[:, None]
            loss = loss + torch.where(valid, lse - logits.gather(1, index)[:, 0], 0.0).sum()
            if with_grad:  # d mean CE / d logits = (softmax - onehot) / n_valid on the valid rows
                d_logits = torch.exp(logits - lse[:, None]).scatter_add_(1, index, -torch.ones_like(logits[:, :1]))
                keep = valid.to(high)[:, None]
                # each entry of d_logits.T @ h sums at most `rows` terms of |d| <= 1 times max|h|
                weight_scale = matmul_scale(h.size(0) * h.abs().max().to(high), low)
                grad_hidden[start:start + size] = (((d_logits * (keep * hidden_scale)).to(low) @ w).to(high)
                                                   / (hidden_scale * n_valid)).to(hidden.dtype)
                grad_weight += ((d_logits * (keep * weight_scale)).to(low).t() @ h).to(high) / (weight_scale * n_valid)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss / n_valid

    @staticmethod
    def backward(ctx, grad):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad, (grad_weight * grad).to(ctx.weight_dtype), None, None, None


def matmul_scale(bound, dtype):
    """The largest power of two, at most 2^14 (which lifts fp16's smallest normal, 6e-5, to 4e-9), by which a
    matmul in `dtype` whose entries are at most `bound` can be scaled with no entry over half dtype's maximum.
    A tensor, not a Python number: no GPU sync."""
    return torch.exp2(torch.floor(torch.log2(torch.finfo(dtype).max / 2 / bound)).clamp(max=14))


def linear_cross_entropy(hidden, weight, targets, n_chunks):
    """F.cross_entropy(hidden @ weight.T, targets, ignore_index=-1) without the full (N, V) logits."""
    with_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(hidden, weight, targets, n_chunks, with_grad)


@torch.no_grad()
def sp_equivalent(model):
    """A GPT in sp computing `model`'s function (a mup or completep one): its multipliers folded into weights, so
    that SP-only readers (transformers' GPT2LMHeadModel) run it. The attention's 1 / d_head is SP's 1 / sqrt(d_head)
    on queries scaled by 1 / sqrt(d_head); the branch scale scales each branch's last layer, c_proj; the logits'
    1 / m_width scales ln_f's output (the head is the token embedding, which the input keeps unscaled)."""
    c = model.config
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
                    state[key] *= model.transformer.h[i].branch_scale
    for key in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
        if key in state:
            state[key] /= model.m_width
    sp = GPT(replace(c, param="sp", base_width=0, base_depth=0), seed=0)  # every weight is model's
    sp.load_state_dict(state)
    return sp.to(next(model.parameters()).device).train(model.training)


# transformers' GPT-2 uses Conv1D layers whose weights are stored transposed relative to nn.Linear.
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

