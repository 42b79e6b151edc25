"""Encoder-decoder Transformer (Vaswani et al., 2017) with DeepNorm (Wang et al., 2022, "DeepNet").

DeepNorm is post-LN with an up-weighted residual, x = LN(alpha * x + f(x)), and a down-scaled init:
beta is the xavier_normal gain of the FFN weights and of the attention value/output projections
(queries and keys keep gain 1). For N encoder and M decoder layers (DeepNet, Table 1):
    encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16)
    decoder alpha = (3M)^(1/4),          beta = (12M)^(-1/4)
`norm="postln"` (alpha 1) and `norm="preln"` (x + f(LN(x)), final LNs) are the baselines, initialised as
fairseq's `transformer` is (Transformer.fairseq_init).
The FFN activation comes from the `activations` registry; ANAct's "NSwish + k Swish" keeps the plain
activation in the top `plain_top_k` FFNs of both the encoder and the decoder. A gated name (swiglu, aglu_glu ...)
makes the FFN fc2(act(fc1(x)) * fc_up(x)), as many parameters as the plain one (activations/gated.py).
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from activations import layer_activation, load_fused_mlp, mlp_activation
from activations.impl import model_identity
from activations.gated import GatedProduct, hidden_width
from errors import ConfigError
from activations.init_streams import init_parameters

NORMS = ("deepnorm", "postln", "preln")


@dataclass
class TranslationConfig:
    vocab_size: int = 0  # 0: taken from the sentencepiece model
    enc_layers: int = 6
    dec_layers: int = 6
    d_model: int = 512
    ffn_dim: int = 1024
    n_head: int = 4
    dropout: float = 0.3
    attn_dropout: float = 0.0
    act_dropout: float = 0.0
    act: str = "relu"  # a registry name (plain FFN) or a gated one: swiglu, geglu, reglu, NAME_glu
    act_kwargs: dict = field(default_factory=dict)
    glu_hidden: int = 0  # gated FFN's hidden width; 0: the plain FFN's parameters (activations/gated.py)
    plain_top_k: int = 0  # the top k FFNs of encoder and decoder use the unnormalized activation (activations.layer_activation)
    norm: str = "deepnorm"
    share_embeddings: bool = True  # one joint-vocabulary table for encoder and decoder input
    tie_output: bool = True  # output projection = decoder input table (False: own matrix, N(0, d^-1/2))
    positions: str = "sinusoidal"  # or "learned"
    max_positions: int = 1024
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3


def deepnorm_constants(n_enc, n_dec):
    """(encoder alpha, encoder beta, decoder alpha, decoder beta) of DeepNet's encoder-decoder case."""
    enc = (n_enc ** 4 * n_dec) ** (1 / 16)
    return 0.81 * enc, 0.87 / enc, (3 * n_dec) ** 0.25, (12 * n_dec) ** -0.25


def sinusoidal_table(n, d):
    """fairseq's sinusoidal positions: sin in the first half of the channels, cos in the second."""
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * freq[None]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    if d % 2:
        table = torch.cat([table, torch.zeros(n, 1, dtype=torch.float64)], dim=1)
    return table.float()


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.n_head, self.dropout = cfg.n_head, cfg.attn_dropout

    def heads(self, x):
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x, k, v, mask=None, causal=False):
        """x: queries [B,T,C]; k, v: already projected [B,H,S,C/H]; mask: bool [B,1,1,S], True = attend."""
        q = self.heads(self.q_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        B, H, T, c = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * c))

    def kv(self, x):
        return self.heads(self.k_proj(x)), self.heads(self.v_proj(x))


def ffn_width_args(cfg):
    """activations/gated.py's hidden_width and width_note arguments for the FFN (whose layers have biases)."""
    return cfg.d_model, cfg.ffn_dim, mlp_activation(cfg.act)[1], cfg.glu_hidden


class FFN(nn.Module):
    """fc2(act(fc1(x))), or gated: fc2(act(fc1(x)) * fc_up(x)), fc1 being the gate. With .fused set
    (activations/policy.py's measured choice, as for model.py's MLP) the activation runs in the matmuls' epilogues
    (activations/fused_mlp.py), which read the layers as c_fc, c_up, c_proj; never with dropout on the hidden
    tensor in training, which would sit between the activation and fc2."""

    def __init__(self, cfg, layer, n_layers):
        super().__init__()
        name, gated = mlp_activation(cfg.act)
        hidden = hidden_width(*ffn_width_args(cfg))
        self.fc1 = nn.Linear(cfg.d_model, hidden)
        self.act = layer_activation(name, cfg.act_kwargs, layer, n_layers, cfg.plain_top_k)
        self.fc_up = nn.Linear(cfg.d_model, hidden) if gated else None
        self.glu = GatedProduct() if gated else None
        self.fc2 = nn.Linear(hidden, cfg.d_model)
        self.act_dropout = nn.Dropout(cfg.act_dropout)
        self.fused = False

    # model.py's MLP names, which the fused MLP and the policy's probe read (the checkpoints keep fc1, fc_up, fc2)
    c_fc = property(lambda self: self.fc1)
    c_up = property(lambda self: self.fc_up)
    c_proj = property(lambda self: self.fc2)

    @property
    def fusable(self):
        """Whether the fused MLP computes this FFN: no dropout between the activation and fc2."""
        return self.act_dropout.p == 0 or not self.training

    def forward(self, x):
        if self.fused and self.fusable and (y := load_fused_mlp().forward(self, x)) is not None:
            return y
        h = self.act(self.fc1(x))
        if self.fc_up is not None:
            h = self.glu(h, self.fc_up(x))
        return self.fc2(self.act_dropout(h))


class Sublayer(nn.Module):
    """One residual branch with its LayerNorm: post-LN LN(alpha*x + f(x)) or pre-LN x + f(LN(x))."""

    def __init__(self, cfg, alpha):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.pre = cfg.norm == "preln"
        self.alpha = alpha
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, f):
        if self.pre:
            return x + self.dropout(f(self.ln(x)))
        return self.ln(self.alpha * x + self.dropout(f(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg, alpha, layer):
        super().__init__()
        self.attn, self.ffn = Attention(cfg), FFN(cfg, layer, cfg.enc_layers)
        self.res_attn, self.res_ffn = Sublayer(cfg, alpha), Sublayer(cfg, alpha)

    def forward(self, x, mask):
        x = self.res_attn(x, lambda h: self.attn(h, *self.attn.kv(h), mask=mask))
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, alpha, layer):
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = Attention(cfg), Attention(cfg), FFN(cfg, layer, cfg.dec_layers)
        self.res_self, self.res_cross, self.res_ffn = Sublayer(cfg, alpha), Sublayer(cfg, alpha), Sublayer(cfg, alpha)

    def forward(self, x, memory, mask, cache=None):
        """cache (incremental decoding): dict holding this layer's past self-attention keys/values and the
        cross-attention keys/values of `memory`; x then holds only the new positions."""
        def self_attn(h):
            k, v = self.self_attn.kv(h)
            if cache is None:
                return self.self_attn(h, k, v, causal=True)
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
            # the new positions are the last ones: causal among themselves, full view of the past
            T, S = h.size(1), k.size(2)
            causal = torch.ones(T, S, dtype=torch.bool, device=h.device).tril(S - T)
            return self.self_attn(h, k, v, mask=causal)

        def cross_attn(h):
            if cache is None:
                return self.cross_attn(h, *self.cross_attn.kv(memory), mask=mask)
            if "mem_k" not in cache:
                cache["mem_k"], cache["mem_v"] = self.cross_attn.kv(memory)
            return self.cross_attn(h, cache["mem_k"], cache["mem_v"], mask=mask)

        x = self.res_self(x, self_attn)
        x = self.res_cross(x, cross_attn)
        return self.res_ffn(x, self.ffn)


class Transformer(nn.Module):
    """The translation Transformer. seed: the initial weights', every parameter drawn from its own stream of it
    (the trainer passes the run's seed + init_seed_offset)."""

    def __init__(self, cfg, *, seed):
        super().__init__()
        self.check_config(cfg)
        if cfg.vocab_size <= 0:
            raise ConfigError("vocab_size must be set (the trainer takes it from the sentencepiece model)")
        self.cfg = cfg
        if cfg.norm == "deepnorm":
            enc_alpha, self.enc_beta, dec_alpha, self.dec_beta = deepnorm_constants(cfg.enc_layers, cfg.dec_layers)
        else:
            enc_alpha, self.enc_beta, dec_alpha, self.dec_beta = 1.0, 1.0, 1.0, 1.0
        # the modules' own draws are overwritten below; forked, they leave the global RNG (dropout's) as the
        # seed set it, whatever modules this FFN adds
        with torch.random.fork_rng(devices=[]):
            self.embed_tgt = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
            self.embed_src = self.embed_tgt if cfg.share_embeddings else nn.Embedding(cfg.vocab_size, cfg.d_model,
                                                                                      padding_idx=cfg.pad_id)
            if cfg.positions == "learned":
                self.pos = nn.Embedding(cfg.max_positions, cfg.d_model)
            else:
                self.register_buffer("pos_table", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
            self.encoder = nn.ModuleList(EncoderLayer(cfg, enc_alpha, i)
                                         for i in range(cfg.enc_layers))
            self.decoder = nn.ModuleList(DecoderLayer(cfg, dec_alpha, i)
                                         for i in range(cfg.dec_layers))
            self.output = None if cfg.tie_output else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.enc_ln = nn.LayerNorm(cfg.d_model) if cfg.norm == "preln" else nn.Identity()
            self.dec_ln = nn.LayerNorm(cfg.d_model) if cfg.norm == "preln" else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.reset_parameters(seed)

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu"):
        """The model (in eval mode) of a translation checkpoint as training/checkpoint.py's
        load_checkpoint(path, kind="translation") reads it; its tokenizer is ckpt["spm"]."""
        model = cls(TranslationConfig(**model_identity(ckpt["model_config"])), seed=0)  # the checkpoint's weights
        model.load_state_dict(ckpt["model"])
        return model.to(device).eval()

    @staticmethod
    def check_config(cfg):
        """Everything but the vocabulary (which comes from the tokenizer): usable before any data is read."""
        if cfg.norm not in NORMS:
            raise ConfigError(f"unknown norm {cfg.norm!r}; choose one of {', '.join(NORMS)}")
        if cfg.positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"unknown positions {cfg.positions!r}; choose sinusoidal or learned")
        if cfg.d_model % cfg.n_head:
            raise ConfigError(f"d_model {cfg.d_model} is not divisible by n_head {cfg.n_head}")
        with torch.random.fork_rng(devices=[]):  # a trial build: the global RNG (dropout's) stays as it was
            name = mlp_activation(cfg.act)[0]
            hidden_width(*ffn_width_args(cfg))
            for n in (cfg.enc_layers, cfg.dec_layers):
                layer_activation(name, cfg.act_kwargs, 0, n, cfg.plain_top_k)
                layer_activation(name, cfg.act_kwargs, n - 1, n, cfg.plain_top_k)

    def reset_parameters(self, seed):
        """Every parameter from its own stream of `seed`, so models that differ in their FFN start equal everywhere
        else (activations/init_streams.py)."""
        init_parameters(self, seed, self.init_weight)

    def init_weight(self, name, module, p, generator):
        """Tables (fairseq: N(0, d^-1/2), scaled by sqrt(d) on input), the untied output (torchscale's: logits
        start N(0, 1)) and learned positions N(0, d^-1/2); the layers' linears by the norm's init; LayerNorms
        keep their ones and zeros."""
        if isinstance(module, nn.Embedding) or module is self.output:
            nn.init.normal_(p, std=self.cfg.d_model ** -0.5, generator=generator)
            if getattr(module, "padding_idx", None) is not None:
                nn.init.zeros_(p[module.padding_idx])
        elif isinstance(module, nn.Linear):
            (self.deepnet_init if self.cfg.norm == "deepnorm" else self.fairseq_init)(name, module, p, generator)

    def deepnet_init(self, name, module, p, generator):
        if name.endswith(".bias"):
            nn.init.zeros_(p)
            return
        beta = self.enc_beta if name.startswith("encoder.") else self.dec_beta
        gain = 1.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else beta  # DeepNet: only q and k keep 1
        nn.init.xavier_normal_(p, gain=gain, generator=generator)

    def fairseq_init(self, name, module, p, generator):
        """fairseq 0.12's `transformer` (MultiheadAttention.reset_parameters; the FFN's nn.Linear is left alone).
        Gain 1/sqrt(2) on q, k and v gives each the xavier bound of the packed [3d, d] in-projection
        (sqrt(6 / 4d)) that tensor2tensor and nn.MultiheadAttention use. With xavier_normal on every matrix
        instead, post-LN trailed fairseq's by 0.33 nats at 500 updates
        (BENCHMARKS.md, "Translation baselines beside fairseq")."""
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            nn.init.xavier_uniform_(p, gain=2 ** -0.5, generator=generator)
        elif name.endswith("out_proj.weight"):
            nn.init.xavier_uniform_(p, generator=generator)
        elif name.endswith("out_proj.bias"):
            nn.init.zeros_(p)
        elif name.endswith(".weight"):  # nn.Linear.reset_parameters: U(+-1/sqrt(fan_in)) weight and bias
            nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=generator)
        else:
            bound = module.in_features ** -0.5
            nn.init.uniform_(p, -bound, bound, generator=generator)

    def embed(self, table, tokens, offset=0):
        T = tokens.size(1)
        if offset + T > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + T} tokens exceeds max_positions={self.cfg.max_positions}")
        positions = (self.pos.weight if self.cfg.positions == "learned" else self.pos_table)[offset:offset + T]
        return self.dropout(table(tokens) * self.cfg.d_model ** 0.5 + positions)

    def encode(self, src, layers=None):
        """src [B,S] right-padded -> (memory [B,S,C], mask [B,1,1,S] True at real tokens); `layers` run in
        place of the encoder's (training/regional_compile.py: the same layers, compiled)."""
        mask = (src != self.cfg.pad_id)[:, None, None, :]
        x = self.embed(self.embed_src, src)
        for layer in layers or self.encoder:
            x = layer(x, mask)
        return self.enc_ln(x), mask

    def decode(self, tgt, memory, mask, cache=None, layers=None):
        """Logits for every position of tgt; with a cache (list of per-layer dicts) tgt holds the new tokens;
        `layers` as in encode."""
        offset = cache[0]["k"].size(2) if cache and "k" in cache[0] else 0
        x = self.embed(self.embed_tgt, tgt, offset)
        for i, layer in enumerate(layers or self.decoder):
            x = layer(x, memory, mask, None if cache is None else cache[i])
        return F.linear(self.dec_ln(x), self.embed_tgt.weight if self.output is None else self.output.weight)

    def new_cache(self):
        return [{} for _ in self.decoder]

    @staticmethod
    def reorder_cache(cache, index):
        """Beam search: keep the hypotheses at `index` (rows of the batch dimension)."""
        for layer in cache:
            for key in layer:
                layer[key] = layer[key].index_select(0, index)

    def forward(self, src, tgt_in):
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)

    def loss(self, logits, tgt_out, label_smoothing=0.0):
        """Mean token cross-entropy over non-pad targets (label smoothing as in Szegedy et al.)."""
        logits = logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, fp64 kept
        return F.cross_entropy(logits, tgt_out.flatten(), ignore_index=self.cfg.pad_id,
                               label_smoothing=label_smoothing)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def param_counts(self):
        """All parameters, those outside the embedding tables and the output matrix (the ones an FFN's form
        changes), and one FFN's (its activation's own included); as GPT.param_counts."""
        total = self.num_params()
        tables = {id(m.weight): m.weight.numel() for m in (self.embed_src, self.embed_tgt, self.output) if m is not None}
        ffn = sum(p.numel() for p in self.encoder[0].ffn.parameters())
        return {"total": total, "non_embedding": total - sum(tables.values()), "mlp_per_layer": ffn}
