"""One seed, one starting point, whatever the activation (activations/init_streams.py): every tensor two models share (same
name, same shape) starts bit-equal at one seed, in GPT-2 and in the translation model, for plain, gated and
learned activations (fairseq's FFN output bias, whose bound is set by the hidden width: the same draw at each
width's scale); another seed, or the A/A control's init_seed_offset, starts elsewhere."""
import itertools
from types import SimpleNamespace

import pytest
import torch

from model import GPT, GPTConfig
from training import distributed
from training.config import RunConfig
from training.loop import Trainer
from translation import Transformer, TranslationConfig

ARMS = ("gelu", "swiglu", "aglu_glu", "nswish", "aglu", "relu2")


def gpt(act, seed=3):
    """(state dict, the global RNG's next draws after the build: dropout's stream)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, act=act), seed=seed)
    return model.state_dict(), torch.rand(4)


def translation(act, norm, seed=3):
    torch.manual_seed(seed)
    model = Transformer(TranslationConfig(vocab_size=20, enc_layers=2, dec_layers=2, d_model=32, ffn_dim=128,
                                          n_head=4, act=act, norm=norm, share_embeddings=False, tie_output=False,
                                          positions="learned"), seed=seed)
    return model.state_dict(), torch.rand(4)


def shared(a, b):
    return {k for k in a if k in b and a[k].shape == b[k].shape}


def width_free(state, key):
    """fairseq's FFN output bias is U(+-1/sqrt(hidden)): one draw, at the scale of the FFN's hidden width."""
    return state[key] * state[key.replace("fc2.bias", "fc1.weight")].shape[0] ** 0.5


def assert_same_start(build, mlp, rescaled=False):
    """Every pair of ARMS: their shared tensors bit-equal, every tensor outside the MLP/FFN among them (the
    gated arms' own width makes their MLP matrices another shape), and the same global RNG after the build.
    rescaled: the FFN output biases' bound depends on the width, so they are the same draw at another scale."""
    built = {act: build(act) for act in ARMS}
    for (a, (state_a, after_a)), (b, (state_b, after_b)) in itertools.combinations(built.items(), 2):
        keys = shared(state_a, state_b)
        assert {k for k in state_a if mlp not in k} <= keys, (a, b)
        scaled = {k for k in keys if rescaled and k.endswith("fc2.bias")}
        assert [k for k in sorted(keys - scaled) if not torch.equal(state_a[k], state_b[k])] == [], (a, b)
        for k in scaled:
            torch.testing.assert_close(width_free(state_a, k), width_free(state_b, k), rtol=1e-6, atol=0)
        assert torch.equal(after_a, after_b), (a, b)
    return {act: state for act, (state, _) in built.items()}


def test_gpt2_arms_share_their_start():
    states = assert_same_start(gpt, ".mlp.")
    kappas = [k for k in states["aglu"] if k.endswith(".act.kappa")]
    assert len(kappas) == 2 and set(kappas) <= shared(states["aglu"], states["aglu_glu"])  # compared above
    assert states["aglu"][kappas[0]] != states["aglu"][kappas[1]]  # each layer draws its own
    assert not torch.equal(states["gelu"]["transformer.h.0.attn.c_attn.weight"],
                           states["gelu"]["transformer.h.1.attn.c_attn.weight"])
    assert "transformer.h.0.mlp.c_proj.bias" in shared(states["gelu"], states["swiglu"])


@pytest.mark.parametrize("norm", ["deepnorm", "postln"])
def test_translation_arms_share_their_start(norm):
    states = assert_same_start(lambda act: translation(act, norm), ".ffn.", rescaled=norm == "postln")
    assert "encoder.0.ffn.act.lam" in shared(states["aglu"], states["aglu_glu"])
    relu2 = states["relu2"]
    assert not torch.equal(relu2["encoder.0.attn.v_proj.weight"], relu2["decoder.0.self_attn.v_proj.weight"])


def random_tensors(state):
    """The tensors an init draws: AGLU's 0-dim kappa and lam, and every other that is not constant (LayerNorms,
    biases set to 0, buffers)."""
    return {k: v for k, v in state.items()
            if k.endswith((".kappa", ".lam")) or (v.is_floating_point() and v.numel() > 1 and v.std() > 0)}


@pytest.mark.parametrize("build", [lambda seed: gpt("aglu_glu", seed)[0],
                                   lambda seed: translation("aglu", "deepnorm", seed)[0]], ids=["gpt2", "translation"])
def test_another_seed_draws_every_weight_again(build):
    a, b = random_tensors(build(3)), random_tensors(build(4))
    assert len(a) > 10 and a.keys() == b.keys()
    assert [k for k in a if torch.equal(a[k], b[k])] == []


def test_init_seed_offset_starts_elsewhere_and_equals_that_seed():
    """The A/A control: the trainers build their model at RunConfig.init_seed, seed + init_seed_offset, and
    Trainer.context seeds torch's RNG (dropout's) with it."""
    dist = distributed.setup("cpu")

    def weights(seed, offset):
        run = RunConfig(seed=seed, init_seed_offset=offset, device="cpu")
        Trainer(SimpleNamespace(run=run)).context(dist)
        assert torch.initial_seed() == seed + offset
        config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, act="aglu_glu")
        return random_tensors(GPT(config, seed=run.init_seed).state_dict())

    base, control, seed8 = weights(1, 0), weights(1, 7), weights(8, 0)
    assert [k for k in base if torch.equal(base[k], control[k])] == []
    assert all(torch.equal(control[k], seed8[k]) for k in base)


def gpt_at(seed):
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, act="aglu"), seed=seed)


def translation_at(seed):
    return Transformer(TranslationConfig(vocab_size=20, enc_layers=1, dec_layers=1, d_model=32, ffn_dim=64, n_head=4,
                                         act="aglu"), seed=seed)


@pytest.mark.parametrize("build", [gpt_at, translation_at])
def test_the_weights_come_from_the_seed_argument_not_torchs_global_rng(build):
    """A reader follows a run's weights to the seed its model is built with: under one global seed two explicit
    seeds start elsewhere, and one explicit seed starts equal under two global seeds."""
    torch.manual_seed(5)
    a, b = random_tensors(build(1).state_dict()), random_tensors(build(2).state_dict())
    torch.manual_seed(6)
    c = random_tensors(build(1).state_dict())
    assert [k for k in a if torch.equal(a[k], b[k])] == []
    assert all(torch.equal(a[k], c[k]) for k in a)
