"""Mish, xATLU/xGELU/xSiLU and PolyReLU/PolyNorm (activations/basic.py, expanded.py, polycom.py): each paper's
formula against a float64 numpy/scipy reference, the papers' initialisations, gradcheck over inputs and
parameters, and the learned parameters inside GPT-2's MLP and the translation FFN, plain and gated: kept out of
weight decay, reported by telemetry, restored by load_state_dict and by an exact resume."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import special

import activations
from activations.telemetry import collect
from model import GPT, GPTConfig
from test_train_gpt2 import VOCAB, args, final_weights, train_in_process, train_losses, write_corpus
from training.optimizer import adamw
from translation.model import Transformer, TranslationConfig

D = torch.float64
LEARNED = ["xatlu", "xgelu", "xsilu", "polyrelu", "polynorm"]
TRAINED = {"alpha": 0.37, "coeffs": (0.1, -0.5, 0.8, 0.3)}  # away from the inits, so every term shows


def set_params(module, values=TRAINED):
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.tensor(values[name], dtype=D))
    return module


def reference(name, x, alpha=TRAINED["alpha"], a=TRAINED["coeffs"]):
    """The formulas as the papers print them, in numpy/scipy float64."""
    if name == "mish":
        return x * np.tanh(np.logaddexp(0, x))
    gate = {"xatlu": lambda: np.arctan(x) / np.pi + 0.5, "xgelu": lambda: special.ndtr(x),
            "xsilu": lambda: special.expit(x)}
    if name in gate:
        return x * ((1 + 2 * alpha) * gate[name]() - alpha)
    if name == "polyrelu":
        return sum(a_i * np.maximum(x, 0) ** i for i, a_i in enumerate(a))
    powers = [x ** i for i in range(1, len(a))]  # polynorm: RMS over the last dim, eps 1e-6
    return a[0] + sum(a_i * u / np.sqrt((u ** 2).mean(-1, keepdims=True) + 1e-6) for a_i, u in zip(a[1:], powers))


@pytest.mark.parametrize("name", ["mish"] + LEARNED)
def test_formula_against_float64_reference(name):
    x = np.concatenate([np.linspace(-6, 6, 61), [-40.0, -1e-3, 0.0, 1e-3, 40.0]]).reshape(6, 11)
    module = activations.build(name).double()
    if name != "mish":
        set_params(module)
    np.testing.assert_allclose(module(torch.tensor(x)).detach().numpy(), reference(name, x), rtol=1e-12, atol=1e-12)


def test_initialisations_are_the_papers():
    x = torch.linspace(-5, 5, 101, dtype=D)
    torch.testing.assert_close(activations.build("xsilu").double()(x), F.silu(x), rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(activations.build("xgelu").double()(x), F.gelu(x), rtol=1e-15, atol=1e-15)  # erf form
    torch.testing.assert_close(activations.build("xatlu").double()(x), x * (torch.atan(x) / torch.pi + 0.5))
    for name in ("polyrelu", "polynorm"):
        m = activations.build(name)
        assert m.coeffs.tolist() == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3], abs=1e-7)  # a_0 = 0, a_i = 1/3
        assert m.telemetry() == pytest.approx({"a0": 0.0, "a1": 1 / 3, "a2": 1 / 3, "a3": 1 / 3})
    # the expanded gate's range is [-alpha, 1 + alpha]: out / x at the two ends
    m = activations.build("xsilu", alpha_init=0.5).double()
    torch.testing.assert_close(m(torch.tensor([-1e3, 1e3], dtype=D)) / 1e3, torch.tensor([0.5, 1.5], dtype=D))
    with pytest.raises(ValueError, match="order >= 1"):
        activations.build("polynorm", coeffs_init=[0.0])


@pytest.mark.parametrize("name", ["mish"] + LEARNED)
def test_gradcheck_inputs_and_parameters(name):
    module = activations.build(name).double()
    if name != "mish":
        set_params(module)
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    g = torch.Generator().manual_seed(0)
    x = 2 * torch.randn(2, 5, dtype=D, generator=g)
    x = (x + 0.1 * x.sign()).requires_grad_()  # ReLU's kink away from the finite differences

    def f(x, *ps):
        return torch.func.functional_call(module, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def tiny_models(act):
    """(model, a function of it that runs one batch) for GPT-2 and the translation Transformer."""
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    gpt = GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, act=act), seed=0)
    translation = Transformer(TranslationConfig(vocab_size=VOCAB, enc_layers=1, dec_layers=1, d_model=32, ffn_dim=64,
                                                n_head=2, act=act), seed=0)
    return [(gpt, x, lambda m: m(x)[0]), (translation, (x, x), lambda m: m(x, x))]


@pytest.mark.parametrize("act", LEARNED + [f"{name}_glu" for name in LEARNED])
def test_parameters_in_both_models_skip_decay_report_and_reload(act):
    torch.manual_seed(0)
    kind = type(activations.build(activations.mlp_activation(act)[0]))
    for model, batch, run in tiny_models(act):
        acts = [m for m in model.modules() if type(m) is kind]
        learned = {id(p) for m in acts for p in m.parameters()}
        assert len(acts) == 2 and len(learned) == 2  # one parameter per MLP (2 layers; 1 encoder + 1 decoder)
        decayed, plain = adamw(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, "cpu").param_groups
        assert learned <= {id(p) for p in plain["params"]} and not learned & {id(p) for p in decayed["params"]}
        for m in acts:
            set_params(m)
        record = collect(model, batch)
        want = {"alpha": 0.37} if hasattr(acts[0], "alpha") else {"a0": 0.1, "a1": -0.5, "a2": 0.8, "a3": 0.3}
        assert [layer["kind"] for layer in record["layers"]] == [kind.__name__] * len(acts)
        assert all(layer["params"] == pytest.approx(want) for layer in record["layers"])
        fresh = type(model)(model.config if isinstance(model, GPT) else model.cfg, seed=0)
        assert not torch.equal(run(fresh.eval()), run(model.eval()))
        fresh.load_state_dict(model.state_dict())
        assert torch.equal(run(fresh), run(model))


@pytest.mark.long
@pytest.mark.parametrize("act", ["xatlu", "polynorm_glu"])
def test_trains_and_resumes_exactly(tmp_path, act):
    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "straight", act=act))  # checkpoints at steps 4 and 8
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "model_00004.pt").write_bytes((tmp_path / "straight" / "model_00004.pt").read_bytes())
    train_in_process(args(data, tmp_path / "split", act=act, resume="true"))
    assert train_losses(tmp_path / "split")[0] == train_losses(tmp_path / "straight")[0][4:]
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    learned = [v for k, v in a.items() if ".act." in k]
    initial = torch.zeros(()) if act == "xatlu" else torch.tensor([0, 1 / 3, 1 / 3, 1 / 3])
    assert learned and all(not torch.equal(v, initial) for v in learned)  # they trained
