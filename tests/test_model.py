"""model.py: shapes, GPT-2 init, weight decay groups, MFU, logits equal to transformers' GPT-2, and the
parametrizations (sp, mup, completep)."""
import hashlib
import math
import re

import pytest
import torch

from errors import ConfigError
from export.to_transformers import sp_equivalent
from model import GPT, GPTConfig, rotate
from model_parts.transformers_layout import nanoact_to_hf
from training.checkpoint import load_checkpoint
from training.optimizer import adamw

TINY = dict(block_size=32, vocab_size=96, n_layer=2, n_head=2, n_embd=32)


def test_shapes_loss_and_generate():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY), seed=0)
    idx = torch.randint(0, 96, (3, 17))
    logits, loss = model(idx, torch.randint(0, 96, (3, 17)))
    assert logits.shape == (3, 17, 96)
    assert abs(loss.item() - math.log(96)) < 0.3  # near-uniform at init (tied embeddings favour the input token,
    # so the targets are independent of the inputs here)
    out = model.generate(idx[:, :4], 5, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 9) and torch.equal(out[:, :4], idx[:, :4])
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=4, n_embd=256), seed=0)
    block = model.transformer.h[0]
    assert abs(block.attn.c_attn.weight.std().item() - 0.02) < 0.002
    assert abs(block.mlp.c_proj.weight.std().item() - 0.02 / 4) < 0.0005  # (2*8)^-0.5 = 1/4
    assert model.lm_head.weight is model.transformer.wte.weight


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(**TINY, act="aglu"), seed=0)
    opt = adamw(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, "cpu")
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0
    act_params = {id(p) for n, p in model.named_parameters() if ".act." in n}
    assert act_params and act_params <= {id(p) for p in plain["params"]}
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("act, digest", [
    ("gelu", "436647d456397140763fa610dd1f111f9211a353a992f486482933483e3fecd4"),
    ("swiglu", "05de9a549be3f9b724cbc65bb8b25b05ec8503e2415ad6e067f74ebc23a1f31f")])
def test_sp_is_the_default_and_its_init_is_the_one_before_parametrizations(act, digest):
    """The digests of every weight, written by the code before `param` existed: sp's init is GPT-2's, bit for bit."""
    model = GPT(GPTConfig(**TINY, act=act), seed=0)
    assert model.config.param == "sp" and model.optimizer_groups(0.1, 1e-8) is None
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    assert h.hexdigest() == digest


# 64 wide and 4 deep on a base of 16 x 2: m_width 4, m_depth 2
SCALED = dict(TINY, n_embd=64, n_layer=4, base_width=16, base_depth=2)


@pytest.mark.parametrize("param", ["mup", "completep"])
def test_hidden_matrices_of_every_mlp_follow_the_width_rule_and_the_rest_is_unscaled(param):
    """Gated MLP (c_up too) with AGLU's learned scalars: every block matrix in the hidden group at init std
    0.02 / sqrt(m_width), lr / m_width and decay * m_width; embeddings at GPT-2's; the rest vector-like."""
    model = GPT(GPTConfig(**SCALED, act="aglu_glu", param=param), seed=0)
    hidden, embeddings, vectors = model.optimizer_groups(0.1, 1e-8)
    names = {id(p): n for n, p in model.named_parameters()}
    matrices = {n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2}
    assert {names[id(p)] for p in hidden["params"]} == matrices and any(".c_up." in n for n in matrices)
    assert {names[id(p)] for p in embeddings["params"]} == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert {n for n in names.values() if ".act." in n} <= {names[id(p)] for p in vectors["params"]}
    assert sum(len(g["params"]) for g in (hidden, embeddings, vectors)) == len(names)
    assert (hidden["lr_scale"], hidden["weight_decay"]) == (0.25, pytest.approx(0.4))
    assert (embeddings["lr_scale"], embeddings["weight_decay"], vectors["lr_scale"], vectors["weight_decay"]) == (
        1.0, 0.1, 1.0, 0.0)
    assert hidden["eps"] == pytest.approx(1e-8 / (4 * (2 if param == "completep" else 1)))
    for n in matrices:  # 4096+ samples each: the sample std within ~3%
        std = model.get_parameter(n).std().item()
        assert std == pytest.approx(0.01, rel=0.06), n
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.06)
    assert model.transformer.h[0].branch_scale == (0.5 if param == "completep" else 1.0)


@pytest.mark.parametrize("param", ["sp", "completep"])
def test_init_std_sets_every_matrix_and_embedding(param):
    """sp: every block matrix at init_std, c_proj's / sqrt(2 n_layer); completep: / sqrt(m_width) (4); the
    embeddings at init_std under both."""
    model = GPT(GPTConfig(**SCALED, act="swiglu", param=param, init_std=0.06), seed=0)
    matrices = [(n, p) for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2]
    for n, p in matrices:
        expected = 0.03 if param == "completep" else 0.06 * (8 ** -0.5 if ".c_proj." in n else 1)
        assert p.std().item() == pytest.approx(expected, rel=0.06), n
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.06, rel=0.06)
    assert model.transformer.wpe.weight.std().item() == pytest.approx(0.06, rel=0.06)


@pytest.mark.parametrize("act, param, norm", [("aglu_glu", "completep", "layernorm"), ("gelu", "mup", "rmsnorm")])
def test_sp_equivalent_folds_the_multipliers_into_weights(act, param, norm):
    """Attention 1/d_head, branch 1/m_depth and logits 1/m_width folded into q, c_proj and ln_f (biases included)
    give the model's logits in sp; the same weights read as sp give others (the multipliers are in the forward)."""
    model = GPT(GPTConfig(**SCALED, act=act, param=param, norm=norm), seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    idx = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(0))
    sp = sp_equivalent(model)
    assert sp.config.param == "sp"
    torch.testing.assert_close(sp(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)
    unfolded = GPT(GPTConfig(**{**SCALED, "act": act, "norm": norm}), seed=0)
    unfolded.load_state_dict(model.state_dict())
    assert (unfolded(idx)[0] - model(idx)[0]).abs().max() > 0.1


@pytest.mark.parametrize("param", ["sp", "mup", "completep"])
def test_every_multiplier_of_the_table_is_applied_once_in_the_forward(param):
    """docs/training.md's table written out as a float64 forward (attention q.k / sqrt(d_head) or / d_head, branches
    / m_depth, logits / m_width, m_width 4 and m_depth 2 here): the model's logits equal it, so a rule applied twice
    or not at all (a factor 2 or 4 somewhere) fails."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SCALED, param=param), seed=0).double()
    with torch.no_grad():  # biases and norms off their init, so that every term counts
        for p in model.parameters():
            p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.3)
    m_width, m_depth = {"sp": (1, 1), "mup": (4, 1), "completep": (4, 2)}[param]
    C, n_head, T = SCALED["n_embd"], 2, 9
    d_head = C // n_head
    idx = torch.randint(0, 96, (2, T))
    x = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[:T]
    for block in model.transformer.h:
        qkv = block.attn.c_attn(block.ln_1(x)).split(C, -1)
        q, k, v = (t.unflatten(-1, (n_head, d_head)).transpose(1, 2) for t in qkv)
        scores = q @ k.transpose(-1, -2) / (math.sqrt(d_head) if param == "sp" else d_head)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        attention = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        x = x + block.attn.c_proj(attention) / m_depth
        mlp = block.mlp
        x = x + mlp.c_proj(mlp.act(mlp.c_fc(block.ln_2(x)))) / m_depth
    logits = model.transformer.ln_f(x) / m_width @ model.transformer.wte.weight.t()
    torch.testing.assert_close(model(idx)[0], logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("overrides, message", [
    (dict(param="umup"), "unknown param 'umup'; choose one of sp, mup, completep"),
    (dict(param="mup"), "param mup needs base_width > 0"),
    (dict(param="completep", base_width=16), "param completep needs base_depth > 0"),
    (dict(pos_emb="alibi"), "unknown pos_emb 'alibi'; choose one of learned, rope")])
def test_parametrization_errors_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GPT(GPTConfig(**TINY, **overrides), seed=0)


def test_plain_top_k_uses_the_unnormalized_activation():
    model = GPT(GPTConfig(**{**TINY, "n_layer": 3}, act="nswish", plain_top_k=1), seed=0)
    names = [type(b.mlp.act).__name__ for b in model.transformer.h]
    assert names[0] == names[1] != names[2]
    with pytest.raises(ValueError, match="plain_top_k"):
        GPT(GPTConfig(**TINY, plain_top_k=3), seed=0)


def test_plain_top_k_combines_with_activation_options():
    """The top-k plain layers take none of the normalized activation's options; the others keep them."""
    cfg = dict(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
    model = GPT(GPTConfig(**cfg, act="nswish", act_kwargs={"per_instance": True}, plain_top_k=1), seed=0)
    bottom, top = (block.mlp.act for block in model.transformer.h)
    assert type(bottom).__name__ == "NSwish" and bottom.per_instance
    assert type(top).__name__ == "SiLU"
    model = GPT(GPTConfig(**cfg, act="aglu", act_kwargs={"kappa_init": 1.5}, plain_top_k=1), seed=0)  # no plain form
    assert all(block.mlp.act.kappa.item() == 1.5 for block in model.transformer.h)


def test_mfu_is_none_for_unknown_devices():
    model = GPT(GPTConfig(**TINY), seed=0)
    assert model.estimate_mfu(1e6, 32, None) is None
    assert model.estimate_mfu(1e6, 32, "Some Unknown Accelerator") is None
    h100 = model.estimate_mfu(1e6, 32, "NVIDIA H100 80GB HBM3")
    assert h100 == pytest.approx(model.flops_per_token(32) * 1e6 / 989e12)


def _hf_gpt2(tmp_path, vocab=1000):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm parameters, so a transposition mistake shows
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    return hf


def test_logits_equal_transformers_gpt2(tmp_path):
    hf = _hf_gpt2(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path)).eval()
    idx = torch.randint(0, 1000, (2, 40))
    with torch.no_grad():
        ref = hf(idx).logits
        got, _ = ours(idx)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_pretrained_weights_with_another_activation_load(tmp_path):
    _hf_gpt2(tmp_path)
    model = GPT.from_pretrained(str(tmp_path), act="aglu")
    assert any(".act." in n for n, _ in model.named_parameters())


def test_export_mapping_inverts_import(tmp_path):
    hf = _hf_gpt2(tmp_path)
    ours = GPT.from_pretrained(str(tmp_path))
    back = nanoact_to_hf(ours.state_dict(), vocab_size=1000)
    ref = hf.state_dict()
    for key, value in back.items():
        torch.testing.assert_close(value, ref[key])


def test_load_checkpoint_refuses_other_files_for_gpt2(tmp_path):
    from training.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope.pt", kind="gpt2")
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a nanoact checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt", kind="gpt2")
    torch.save({"kind": "translation", "model": {}}, tmp_path / "t.pt")
    with pytest.raises(CheckpointError, match="'translation' checkpoint"):
        load_checkpoint(tmp_path / "t.pt", kind="gpt2")


def test_reference_gpt2_has_our_init_and_our_loss():
    """bench/reference_gpt2.py is the yardstick of bench/train_step.py: its init follows GPT's rule (it draws
    from the global RNG in build order, GPT from a stream per parameter: other values, the same distribution),
    and GPT's weights loaded into it give the same logits, loss and gradients."""
    from bench.reference_gpt2 import ReferenceConfig, ReferenceGPT

    torch.manual_seed(0)
    ref = ReferenceGPT(ReferenceConfig(**TINY))
    ours = GPT(GPTConfig(**TINY, dropout=0.0), seed=0)
    ref_state = ref.state_dict()
    assert ref_state.keys() == ours.state_dict().keys()
    for k, v in ours.state_dict().items():
        if v.dim() == 1:  # zero biases, LayerNorms' ones and zeros
            assert torch.equal(ref_state[k], v), k
        else:  # 1024+ samples: sample stds within ~3% of each other; the residual projections' is half the others'
            assert ref_state[k].std().item() == pytest.approx(v.std().item(), rel=0.15), k
    ref.load_state_dict(ours.state_dict())
    idx, targets = torch.randint(0, 96, (3, 17)), torch.randint(0, 96, (3, 17))
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        ref, ours = ref.to(dtype), ours.to(dtype)
        ref_logits, ref_loss = ref(idx, targets)
        logits, loss = ours(idx, targets)
        torch.testing.assert_close(logits, ref_logits, rtol=tol, atol=tol)
        # ours takes the cross-entropy in fp32 (`.float()`), so float64 agrees to fp32 precision
        torch.testing.assert_close(loss.to(dtype), ref_loss, rtol=1e-6, atol=1e-6)
        ref_grads = torch.autograd.grad(ref_loss, list(ref.parameters()))
        grads = torch.autograd.grad(loss, list(ours.parameters()))
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g.to(dtype), r, rtol=1e-5, atol=1e-7)


def test_rope_turns_each_pair_by_its_angle_and_scores_depend_on_the_offset_alone():
    """rotate against RoPE in complex form, (x_i + i x_{i+d/2}) e^{i t base^(-2i/d)}, in float64, on (B, T, heads,
    d), and q_t . k_s unchanged when both positions move by the same amount (what a prefix in the KV cache relies
    on)."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 7, 2, 16, dtype=torch.float64, generator=gen)
    t = torch.arange(4, 11, dtype=torch.float64)[:, None, None]
    turned = torch.complex(q[..., :8], q[..., 8:]) * torch.exp(
        1j * t * 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    torch.testing.assert_close(rotate(q, 4), torch.cat((turned.real, turned.imag), -1), rtol=0, atol=1e-12)

    def scores(qs, ks):  # (B, heads, T, T)
        return qs.transpose(1, 2) @ ks.transpose(1, 2).transpose(-1, -2)
    reference = scores(rotate(q, 0), rotate(k, 0))
    torch.testing.assert_close(scores(rotate(q, 37), rotate(k, 37)), reference, rtol=0, atol=1e-10)
    assert (scores(rotate(q, 0), rotate(k, 1)) - reference).abs().max() > 0.1


def test_rope_model_has_no_position_table_and_the_same_non_embedding_count():
    learned, rope = (GPT(GPTConfig(**TINY, pos_emb=pos), seed=0) for pos in ("learned", "rope"))
    assert "transformer.wpe.weight" not in rope.state_dict()
    counts = rope.param_counts()
    assert counts == {**learned.param_counts(), "total": learned.param_counts()["total"] - 32 * 32}
    assert rope.num_params() == learned.num_params() == counts["non_embedding"] + 96 * 32  # wte, the tied head


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_kv_cache_gives_the_logits_and_tokens_of_the_full_forward(pos_emb):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, "block_size": 16}, act="aglu", pos_emb=pos_emb), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)  # confident logits: greedy choices not decided by rounding
        idx = torch.randint(0, 96, (2, 16))
        cache = [[] for _ in model.transformer.h]
        steps = [model(idx[:, :5], cache=cache)[0][:, -1]] + [model(idx[:, t:t + 1], cache=cache)[0][:, -1]
                                                             for t in range(5, 16)]
        full = model(idx)[0][:, 4:]
        torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
            model(idx[:, :1], cache=cache)
    prompt = idx[:, :5]
    # 30 new tokens: past block_size 16, where the window slides and the cache is left behind
    cached = model.generate(prompt, 30, top_k=1)
    assert torch.equal(cached, model.generate(prompt, 30, top_k=1, use_cache=False))
    gen = [torch.Generator().manual_seed(3) for _ in range(2)]
    assert torch.equal(model.generate(prompt, 8, generator=gen[0]), model.generate(prompt, 8, generator=gen[1],
                                                                                  use_cache=False))


@pytest.mark.parametrize("act", ["gelu", "swiglu"])  # a plain and a gated MLP
def test_head_on_the_scored_rows_equals_the_full_forwards_logits(act):
    """eval/scoring.py: the forward without the LM head, then the head on the scored positions only, gives the
    full forward's logits at those positions (and a loss cannot be asked of a head-less forward)."""
    from eval.scoring import score_batch

    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, act=act), seed=0).eval()
    idx = torch.randint(0, 90, (3, 20))  # targets among the n_vocab=90 real tokens; 6 padding logits
    tgt = torch.full_like(idx, -1)
    tgt[0, 3:9], tgt[1, 15:20], tgt[2, 0] = idx[0, 4:10], idx[1, :5], 7  # rows of different lengths and places
    scored = tgt >= 0
    with torch.no_grad():
        full, _ = model(idx)
        hidden, nothing = model(idx, head=False)
        assert hidden.shape == (3, 20, 32) and nothing is None
        torch.testing.assert_close(model.lm_head(hidden[scored]), full[scored], rtol=1e-6, atol=1e-6)
        sums, counts, greedy = score_batch(model, idx, tgt, n_vocab=90)
    logp = torch.log_softmax(full[:, :, :90].double(), -1)
    expected = torch.zeros(3, dtype=torch.float64).index_put_(
        (scored.nonzero()[:, 0],), logp[scored].gather(1, tgt[scored][:, None])[:, 0], accumulate=True)
    torch.testing.assert_close(sums, expected, rtol=1e-5, atol=1e-5)
    assert counts.tolist() == [6, 5, 1]
    assert greedy.tolist() == [bool((full[r, scored[r], :90].argmax(-1) == tgt[r, scored[r]]).all()) for r in range(3)]
    with pytest.raises(ValueError, match="head=False"):
        model(idx, idx, head=False)
