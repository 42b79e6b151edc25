"""activations/fused_mlp.py: the MLP with its activation in the matmuls' epilogues, against float64 and the unfused
MLP, in Triton's interpreter (tests/conftest.py) on tiny shapes. The epilogues compute in fp32 whatever the dtype
(the dtype only changes loads, stores and the matmul's inputs), so every activation runs in fp32 and a few, the
learned scalars' among them, in bf16 and fp16: each interpreted launch costs ~0.1 CPU-s."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton", reason="Triton is not installed: the fused MLP cannot run")

import activations  # noqa: E402
from activations import fused_mlp, kernels, pointwise  # noqa: E402
from activations.aglu import LAM_MIN  # noqa: E402

if not kernels.INTERPRETED and not torch.cuda.is_available():
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it first)",
                allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def interpreted_on_the_cpu(monkeypatch):
    """Triton's interpreter reads TRITON_INTERPRET again at its lazy imports (gluon's, at a kernel's first launch
    with a new argument type) and asserts it is on; another test in the same worker may have left it unset."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
FUSED = sorted(set(pointwise.KINDS) - {"swish"})
# max |error| / max |float64 value| the fused MLP may add beyond the unfused one's (16-bit: one ulp of the
# hidden tensor)
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
PARAMS = {"xatlu": {"alpha": 0.3}, "xgelu": {"alpha": -0.2}, "xsilu": {"alpha": 0.4},
          "apa": {"kappa": 0.9, "lam": 0.37}, "aglu": {"kappa": 1.1, "lam": 0.6}}


class MLP(nn.Module):
    """model.py's MLP, plain: c_proj(act(c_fc(x))), the fused path where .fused is set."""

    def __init__(self, name, d=16, hidden=40):
        super().__init__()
        name, gated = activations.mlp_activation(name)
        self.c_fc, self.c_proj = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.c_up = nn.Linear(d, hidden) if gated else None
        self.act = activations.build(name)
        self.fused = False

    def forward(self, x):
        y = fused_mlp.forward(self, x) if self.fused else None
        if y is not None:
            return y
        h = self.act(self.c_fc(x))
        return self.c_proj(h if self.c_up is None else h * self.c_up(x))


def mlp(name, dtype=torch.float32):
    torch.manual_seed(0)
    m = MLP(name)
    with torch.no_grad():
        m.c_fc.weight.mul_(6)  # pre-activations over the activations' curved part, |x| up to ~15
        for key, value in PARAMS.get(activations.mlp_activation(name)[0], {}).items():
            getattr(m.act, key).fill_(value)
    return m.to(DEVICE, dtype)


def step(m, x, grad):
    """[output, grad_x, every parameter's gradient] of one forward and backward."""
    m.zero_grad()
    xg = x.clone().requires_grad_()
    out = m(xg)
    out.backward(grad)
    return [out.detach(), xg.grad, *(p.grad for p in m.parameters())]


@pytest.mark.parametrize("name", FUSED + ["swiglu", "aglu_glu"])
def test_fused_mlp_matches_float64_and_the_unfused_mlp(name):
    """Output, input gradient and every parameter's gradient (weights, biases, the activation's scalars) of the
    fused MLP within the dtype's tolerance of float64, beyond what the unfused MLP is off by; 2 x 5 tokens, 40 wide
    (the tile's edges masked); plain and gated (both projections in the forward matmul)."""
    g = torch.Generator().manual_seed(1)
    x, grad = torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    ref = mlp(name, torch.float64)
    want = step(ref, x.to(DEVICE, torch.float64), grad.to(DEVICE, torch.float64))
    sixteen = (torch.bfloat16, torch.float16) if name in ("aglu", "gelu", "swiglu") else ()
    for dtype in (torch.float32, *sixteen):
        m = mlp(name, dtype)
        unfused = step(m, x.to(DEVICE, dtype), grad.to(DEVICE, dtype))
        m.fused = True
        fused = step(m, x.to(DEVICE, dtype), grad.to(DEVICE, dtype))
        names = ["output", "input gradient", *(f"{n} gradient" for n, _ in m.named_parameters())]
        for what, f, u, w in zip(names, fused, unfused, want):
            scale = w.abs().max().item()
            err_f, err_u = ((f.double() - w).abs().max().item() / scale for f in (f, u))
            assert f.dtype == dtype and err_f <= err_u + TOL[dtype], f"{name} {dtype} {what}: {err_f:.2e} {err_u:.2e}"


EDGES = [0.0, -0.0, 1e-40, -1e-40, 1e-3, -1e-3, 0.5, -0.5, 3.0, -3.0, 19.9, 20.1, -20.0, 30.0, -30.0, 88.0, -88.0,
         -89.0, -104.0, -200.0, 1e4, -1e4, 1e30, -1e30, 3e38, -3e38, math.nan, math.inf, -math.inf]


def test_pointwise_edges_as_the_pytorch_path():
    """The one pointwise definition (the elementwise kernel; the fused epilogues run the same code) on kernels.py's
    edge inputs (0, subnormals, exp2 overflowing, +-20 and 30 where softplus and mish switch, 1e30, fp32's largest,
    NaN, +-inf) and a NaN and an inf incoming gradient: NaN and inf exactly where the modules' autograd has them,
    finite values within fp32's tolerance, the scalars' gradients too. AGLU/APA also at lam below its clamp."""
    x = torch.tensor(EDGES)
    grad = torch.linspace(-2, 3, len(EDGES))
    grad[3], grad[5] = math.nan, math.inf
    cases = [(n, PARAMS.get(n, {})) for n in FUSED] + [("aglu", {"kappa": 1.0, "lam": 1e-6})]
    for name, params in cases:
        m = activations.build(name, **({"impl": "torch"} if name in ("aglu", "apa") else {}))
        with torch.no_grad():
            for key, value in params.items():
                getattr(m, key).fill_(value)
        xg = x.clone().requires_grad_()
        out = m(xg)
        out.backward(grad)
        p0, p1 = fused_mlp._params(m, name, x)
        got, gx, sums = pointwise.elementwise(x.to(DEVICE), grad.to(DEVICE), name, p0.detach().to(DEVICE),
                                              p1.detach().to(DEVICE), LAM_MIN)
        grads = fused_mlp.finish(name, sums.cpu(), p0.detach(), p1.detach())
        for what, a, b in [("output", got, out), ("input gradient", gx, xg.grad),
                           *((f"{n} gradient", grads[i], getattr(m, n).grad)
                             for i, n in enumerate(pointwise.PARAMS.get(name, ())))]:
            a, b = a.cpu(), b.detach()
            if name == "gelu_exact":  # torch's CPU GELU (erf) is inf at 3e38 (ours x exactly) and NaN at inf
                a = torch.where(b.isfinite(), a, b)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, equal_nan=True,
                                       msg=lambda s: f"{name} {params} {what}: {s}")


def sgd_step(model, loss_of):
    """(the loss, every parameter after one SGD step at lr 0.5 on it)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = loss_of()
    loss.backward()
    optimizer.step()
    return loss.detach(), {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_step(unfused, fused, what):
    """The fused step's loss and parameters equal the unfused one's within fp32's tolerance."""
    (loss, params), (loss_fused, params_fused) = unfused, fused
    torch.testing.assert_close(loss_fused, loss, rtol=1e-5, atol=1e-6)
    for name, p in params.items():
        torch.testing.assert_close(params_fused[name], p, rtol=1e-4, atol=1e-6, msg=f"{what} {name}")


def test_a_training_step_with_the_fused_mlp_equals_one_without(monkeypatch):
    """GPT-2 (tiny; AGLU, then SwiGLU) through one SGD step with every MLP fused and without: the loss and every
    parameter after the step, kappa and lam included, within fp32's tolerance (SGD: Adam's first step, lr sign(grad),
    would turn a gradient's rounding near 0 into a whole step); the fused backward ran, in the fused runs only."""
    from model import GPT, GPTConfig

    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, 96, (2, 8), generator=g), torch.randint(0, 96, (2, 8), generator=g)
    calls = []
    real = fused_mlp.act_grad
    monkeypatch.setattr(fused_mlp, "act_grad", lambda *a: calls.append(1) or real(*a))
    for act in ("aglu", "swiglu"):
        results = []
        for fused in (False, True):
            model = GPT(GPTConfig(block_size=8, vocab_size=96, n_layer=1, n_head=2, n_embd=16, act=act), seed=0)
            model.to(DEVICE)
            for block in model.transformer.h:
                block.mlp.fused = fused
            results.append(sgd_step(model, lambda: model(idx.to(DEVICE), targets.to(DEVICE))[1]))
        assert_same_step(*results, act)
    assert calls == [1, 1]  # one fused layer's backward per activation, in the fused runs only


def test_a_translation_step_with_the_fused_ffn_equals_one_without(monkeypatch):
    """The translation Transformer (tiny, relu, its trainer's default) through one SGD step with its FFNs fused and
    without: loss and every parameter within fp32's tolerance, the fused backward run once per FFN; the policy finds
    its FFNs as it finds GPT-2's MLPs, except where dropout on the hidden tensor sits between act and fc2."""
    from activations import policy
    from translation.model import Transformer, TranslationConfig

    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 40, (2, 5), generator=g), torch.randint(4, 40, (2, 7), generator=g)
    calls = []
    real = fused_mlp.act_grad
    monkeypatch.setattr(fused_mlp, "act_grad", lambda *a: calls.append(1) or real(*a))
    cfg = dict(vocab_size=40, enc_layers=1, dec_layers=1, d_model=16, ffn_dim=24, n_head=2, dropout=0.0)
    results = []
    for fused in (False, True):
        model = Transformer(TranslationConfig(**cfg), seed=0).to(DEVICE)
        assert sorted(policy.fused_groups(model)) == ["mlp/relu"] and len(policy.fused_groups(model)["mlp/relu"]) == 2
        for ffn in policy.fused_groups(model)["mlp/relu"]:
            ffn.fused = fused
        results.append(sgd_step(model, lambda: model.loss(model(src.to(DEVICE), tgt[:, :-1].to(DEVICE)),
                                                          tgt[:, 1:].to(DEVICE))))
    assert_same_step(*results, "translation")
    assert calls == [1, 1]  # encoder's and decoder's FFN, in the fused run only
    assert policy.fused_groups(Transformer(TranslationConfig(**cfg, act_dropout=0.1), seed=0)) == {}


def test_autotune_candidates_wide_only_where_they_fit_and_one_in_the_interpreter():
    """The tiles the autotuner may time per launch (fused_mlp._prune, on the GPU's candidate list): the wide ones
    (32-64 accumulator values per thread) only for the plain MLP's light epilogues, which compile without spills at
    them on sm_80/90/100 where AGLU's backward and a gated MLP's spill (BENCHMARKS.md); the gated forward at
    BLOCK_K 32. In the interpreter one config: the autotuner times nothing, the tests' launches run once."""
    import itertools
    import triton

    assert len(fused_mlp.CONFIGS) == 1
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=8, num_stages=st)
               for m, n, k, st in fused_mlp.NARROW + fused_mlp.WIDE]
    light = {"relu", "relu2", "leaky_relu2", "gelu", "silu", "swish"}
    for (name, kind), gated, backward in itertools.product(pointwise.KINDS.items(), (False, True), (False, True)):
        kept = fused_mlp._prune(configs, {}, KIND=kind, GATED=gated, BACKWARD=backward)
        wide = [c for c in kept if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 64 * 64]
        assert bool(wide) == (name in light and not gated), (name, gated, backward)
        assert kept and all(c.kwargs["BLOCK_K"] <= 32 for c in kept if gated and not backward)


@pytest.mark.long
@pytest.mark.skipif(not os.environ.get("NANOACT_FUSED_COMPILE"), reason="~15 CPU-s: NANOACT_FUSED_COMPILE=1")
def test_the_heaviest_fused_epilogue_compiles_without_spills(tmp_path):
    """AGLU's backward epilogue (the most registers of every activation's, bench/kernel_instructions.py --fused:
    BENCHMARKS.md) at the largest autotune tile it may get, and GELU's backward at the widest (a light epilogue's),
    compiled for sm_90 with no GPU: no register spilled to the stack or local memory. Off by default: the suite's
    time budget has no room for a matmul compile; the bench script compiles every config for sm_80/90/100."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path))
    code = ("import json; from bench import kernel_instructions as K\n"
            "for kind in ('aglu', 'gelu'):\n"
            "    fn, sc, ce, op = next(v for v in K.fused_variants(True, [kind]) if v[2]['BACKWARD'])\n"
            "    print(json.dumps(K.usage(K.compile_one(fn, sc, ce, op, 'bf16', 90), fn.__name__)))")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                            timeout=600)
    if "bundles no" in result.stderr or result.returncode and "ptxas" in result.stderr:
        pytest.skip(result.stderr[-300:])
    assert result.returncode == 0, result.stderr[-3000:]
    usages = [json.loads(line) for line in result.stdout.splitlines()[-2:]]
    assert all(u["STACK"] == 0 and u["LOCAL"] == 0 for u in usages), usages
