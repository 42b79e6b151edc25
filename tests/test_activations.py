"""activations/: special cases, hand-written gradients vs float64 autograd, ANAct statistics,
saved-for-backward memory, torch.compile and bf16. CPU only."""
import math

import pytest
import torch
import torch.nn.functional as F

import activations
from activations.aglu import LAM_MIN, _APAFunction
from activations.anact import _NormalizedFunction

D = torch.float64


def fixed(name, kappa, lam):
    """Module with exact float64 parameters (a float init is rounded to fp32 first)."""
    m = activations.build(name, kappa_init=kappa, lam_init=lam).double()
    with torch.no_grad():
        m.kappa.fill_(kappa), m.lam.fill_(lam)
    return m


def naive_apa(z, kappa, lam):
    """The paper's Eq. 5, differentiated by autograd (float64 reference)."""
    return (lam * torch.exp(-kappa * z) + 1) ** (-1 / lam)


# ---------------------------------------------------------------- AGLU / APA: values
Z = torch.linspace(-8, 8, 1601, dtype=D)


def test_aglu_special_cases():
    torch.testing.assert_close(fixed("aglu", 1.0, 1.0)(Z), F.silu(Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fixed("aglu", 1.702, 1.0)(Z), Z * torch.sigmoid(1.702 * Z), rtol=1e-12, atol=1e-12)
    # kappa -> inf: z sigma(kappa z) - relu(z) is at most 0.28/kappa
    assert (fixed("aglu", 1e3, 1.0)(Z) - F.relu(Z)).abs().max() < 3e-4
    # lam -> inf: (1 + lam e^{-kz})^{-1/lam} -> 1, error ~ ln(lam)/lam
    torch.testing.assert_close(fixed("aglu", 1.0, 1e6)(Z[::10]), Z[::10], rtol=3e-5, atol=0)


def test_apa_special_cases():
    torch.testing.assert_close(fixed("apa", 1.0, 1.0)(Z), torch.sigmoid(Z), rtol=1e-12, atol=1e-12)
    # lam -> 0 is Gumbel exp(-exp(-kz)); the module clamps lam at 1e-4, so lam=1e-6 runs as 1e-4,
    # whose distance to Gumbel is at most lam * max(a^2 e^-a)/2 ~ 3e-5 (a = e^{-kz}).
    z = torch.linspace(-3, 10, 1301, dtype=D)
    torch.testing.assert_close(fixed("apa", 1.5, 1e-6)(z), torch.exp(-torch.exp(-1.5 * z)), rtol=0, atol=1e-4)
    # lam -> inf: identity for AGLU is eta -> 1
    torch.testing.assert_close(fixed("apa", 1.0, 1e6)(Z), torch.ones_like(Z), rtol=0, atol=3e-5)


def test_clamp_gives_lam_no_gradient_below_min():
    m = activations.build("aglu", lam_init=1e-6, kappa_init=1.0)
    m(torch.randn(100)).sum().backward()
    assert m.lam.grad == 0 and m.kappa.grad != 0
    m = activations.build("aglu", lam_init=2 * LAM_MIN, kappa_init=1.0)
    m(torch.randn(100)).sum().backward()
    assert m.lam.grad != 0
    m = activations.build("aglu", lam_init=-0.3, kappa_init=1.0)
    assert m.telemetry()["lam"] == pytest.approx(LAM_MIN)  # the lam the forward uses, not the raw parameter


@pytest.mark.parametrize("kappa,lam", [(1.0, 1e-4), (1.0, 0.5), (5.0, 100.0), (0.01, 1e-4), (-1.0, 0.3)])
@pytest.mark.parametrize("name", ["aglu", "apa"])
def test_extreme_inputs_finite(name, kappa, lam):
    m = activations.build(name, kappa_init=kappa, lam_init=lam)
    z = torch.tensor([-1e4, -100.0, -1e-3, 0.0, 1e-3, 100.0, 1e4], requires_grad=True)
    out = m(z)
    out.sum().backward()
    for t in (out, z.grad, m.kappa.grad, m.lam.grad):
        assert torch.isfinite(t).all(), (t, kappa, lam)
    if name == "aglu" and kappa > 0:
        assert out[-1] == 1e4 and abs(out[0]) < 1e-3


# ---------------------------------------------------------------- AGLU / APA: gradients
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("channels", [None, 6])
def test_gradcheck_and_gradgradcheck(gated, channels):
    g = torch.Generator().manual_seed(0)
    shape = (channels,) if channels else ()
    z = (3 * torch.randn(2, 3, 6, dtype=D, generator=g)).requires_grad_()
    kappa = (0.5 + torch.rand(shape, dtype=D, generator=g)).requires_grad_()
    lam = (0.2 + torch.rand(shape, dtype=D, generator=g)).requires_grad_()
    fn = lambda z, k, l: _APAFunction.apply(z, k, l, gated)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (z, kappa, lam))
    assert torch.autograd.gradgradcheck(fn, (z, kappa, lam))


@pytest.mark.parametrize("name", ["aglu", "apa"])
@pytest.mark.parametrize("channelwise", [False, True])
def test_custom_backward_matches_float64_autograd(name, channelwise):
    torch.manual_seed(1)
    C = 16
    m = activations.build(name, channelwise=channelwise, num_channels=C)
    z = (2 * torch.randn(4, 8, C)).requires_grad_()
    grad = torch.randn(4, 8, C)
    out = m(z)
    out.backward(grad)

    z64 = z.detach().double().requires_grad_()
    k64, l64 = (p.detach().double().requires_grad_() for p in (m.kappa, m.lam))
    ref = naive_apa(z64, k64, l64) * (z64 if name == "aglu" else 1)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z.grad.double(), z64.grad, rtol=1e-4, atol=1e-5)
    assert m.kappa.shape == m.lam.shape == ((C,) if channelwise else ())
    for p, p64 in ((m.kappa, k64), (m.lam, l64)):
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-4, atol=1e-4)


def test_paper_dlam_is_incomplete():
    """Eq. 8 of the paper lacks + z eta ln(1 + lam e^{-kz}) / lam^2; ours matches autograd."""
    z, k = torch.tensor([-1.5, 0.3, 2.0], dtype=D), torch.tensor(1.1, dtype=D)
    lam = torch.tensor(0.4, dtype=D, requires_grad=True)
    (z * naive_apa(z, k, lam)).sum().backward()
    eta = naive_apa(z, k, lam.detach())
    paper = (-z / lam * eta / (lam + torch.exp(k * z))).sum()
    missing = (z * eta * torch.log1p(lam * torch.exp(-k * z)) / lam**2).sum()
    assert not torch.isclose(paper, lam.grad)
    torch.testing.assert_close(paper + missing, lam.grad)
    lam2 = lam.detach().clone().requires_grad_()
    _APAFunction.apply(z, k, lam2, True).sum().backward()
    torch.testing.assert_close(lam2.grad, lam.grad)


# ---------------------------------------------------------------- memory saved for backward
def saved_bytes(module, x):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x.requires_grad_())
    return total[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aglu_saves_no_more_than_gelu(dtype):
    x = torch.randn(64, 3072, dtype=dtype)
    gelu = saved_bytes(activations.build("gelu"), x.clone())
    assert gelu == x.numel() * x.element_size()
    for name in ("aglu", "nswish", "nrelu"):
        # beyond GELU's input, only 0-dim tensors: AGLU's kappa and lam, ANAct's scale, mu, tanh(alpha)
        assert saved_bytes(activations.build(name), x.clone()) <= gelu + 16, name


# ---------------------------------------------------------------- ANAct
N01 = {  # numerical integration, x ~ N(0, 1): mu, rho, rho', lam_n
    "nswish": (0.206621, 0.313083, 0.379482, 1.707221),
    "nrelu": (0.398942, 0.340845, 0.5, 1.570653),
}


def batch_stats64(name, x, dim=None):
    """Float64 hand computation of (mu, rho, rho') of act(x)."""
    x = x.double()
    if name == "nswish":
        y, s = F.silu(x), torch.sigmoid(x)
        d = s + x * s * (1 - s)
    else:
        y, d = F.relu(x), (x > 0).double()
    kw = dict(dim=dim, keepdim=dim is not None, correction=0)
    return y.mean(dim=dim, keepdim=dim is not None), y.var(**kw) / x.var(**kw), (d * d).mean(dim=dim, keepdim=dim is not None)


def lam_n(rho, rho_p):
    return ((rho + rho_p) / (2 * rho * rho_p)).sqrt()


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_statistics_at_init(name):
    torch.manual_seed(0)
    m = activations.build(name)
    out = m(torch.randn(2_000_000))
    activations.step_statistics(m)
    t = m.telemetry()
    mu, rho, rho_p, lam = N01[name]
    assert abs(t["mu"] - mu) < 2e-3  # sample sd of the mean ~ 4e-4
    assert t["rho"] == pytest.approx(rho, rel=5e-3)
    assert t["rho_prime"] == pytest.approx(rho_p, rel=5e-3)
    assert t["scale"] == pytest.approx(lam, rel=5e-3)  # alpha = 0 at init
    assert t["alpha"] == 0.0
    assert abs(out.mean().item()) < 1e-5  # first batch: mu is this batch's mean


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_running_update_rule(name):
    torch.manual_seed(0)
    m = activations.build(name, momentum=0.1, lower=0.5, upper=2.0)
    x1, x2 = torch.randn(4096, 64), 1.3 * torch.randn(4096, 64) + 0.2
    x3 = torch.randn(4096, 64) - 4.0  # rho' (and rho) collapse far below 0.5 * previous

    m(x1)  # first step (one batch) initialises all three
    activations.step_statistics(m)
    mu1, rho1, rp1 = batch_stats64(name, x1)
    bufs = lambda: [b.double() for b in (m.running_mu, m.running_rho, m.running_rho_prime)]  # noqa: E731
    for got, want in zip(bufs(), (mu1, rho1, rp1)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    out2 = m(x2)  # in bounds: momentum update, and the output uses the updated values
    activations.step_statistics(m)
    mu2, rho2, rp2 = batch_stats64(name, x2)
    want = [0.9 * a + 0.1 * b for a, b in zip((mu1, rho1, rp1), (mu2, rho2, rp2))]
    for got, w in zip(bufs(), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
    act = F.silu if name == "nswish" else F.relu
    expect = lam_n(want[1], want[2]) * (act(x2.double()) - want[0])
    torch.testing.assert_close(out2.double(), expect, rtol=1e-4, atol=1e-5)

    mu3, rho3, rp3 = batch_stats64(name, x3)
    assert rp3 < 0.5 * want[2] and rho3 < 0.5 * want[1]
    before = bufs()
    m(x3)  # out of bounds: rho, rho' kept exactly, mu still updated
    activations.step_statistics(m)
    got = bufs()
    torch.testing.assert_close(got[0], 0.9 * before[0] + 0.1 * mu3, rtol=1e-5, atol=1e-6)
    assert got[1:] == before[1:]
    assert m.num_batches_tracked == 3


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_statistics_are_the_steps_whatever_its_split(name):
    """The batch of Eq. 16-18 is the optimizer step's. Each micro-batch normalises with the running values of the
    step's start and its own statistics: the output is the same whichever module (rank) runs it, after whichever
    other micro-batch; the step's update is Eq. 16-18 on the whole batch's statistics (float64); a module restored
    from a state_dict between steps continues bit for bit."""
    torch.manual_seed(0)
    halves = [(torch.randn(256, 32), 1.3 * torch.randn(256, 32) + 0.2),  # each step's batch, in two micro-batches
              (1.2 * torch.randn(256, 32) + 0.1, 0.9 * torch.randn(256, 32) - 0.1)]
    accumulating = activations.build(name)
    running = None
    for step, micro in enumerate(halves):
        ranks = [activations.build(name) for _ in micro]  # a rank each, or the run resumed from a checkpoint
        for rank in ranks:
            rank.load_state_dict(accumulating.state_dict())
        outputs = [accumulating(x) for x in micro]
        for rank, x, out in zip(ranks, micro, outputs):
            assert torch.equal(rank(x), out)
        activations.step_statistics(accumulating)
        batch = batch_stats64(name, torch.cat(micro))
        running = batch if step == 0 else [0.9 * a + 0.1 * b for a, b in zip(running, batch)]  # in bounds here
        for got, want in zip((accumulating.running_mu, accumulating.running_rho, accumulating.running_rho_prime),
                             running):
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-7)
        assert accumulating.num_batches_tracked == step + 1 and not accumulating.pending.any()


def test_anact_outputs_depend_on_the_micro_batch_size_and_the_start_line_says_so():
    """A step's rows normalised as one micro-batch or as two differ (each micro-batch takes its own statistics),
    so a run with several micro-batches a step says so in its start line; per-token statistics never depend on it."""
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    x = torch.cat([torch.randn(64, 8), 2 * torch.randn(64, 8) + 1])
    assert not torch.allclose(activations.build("nswish")(x)[:64], activations.build("nswish")(x[:64]))
    tiny = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16, act="nswish")
    model = GPT(GPTConfig(**tiny), seed=0)
    assert "each of the step's 2 micro-batches with its own statistics" in activations.micro_batch_note(model, 2)
    assert activations.micro_batch_note(model, 1) == ""
    per_token = GPT(GPTConfig(**tiny, act_kwargs={"per_instance": True}), seed=0)
    assert activations.micro_batch_note(per_token, 8) == ""


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_eval_uses_running_values_and_state_dict_round_trips(name):
    torch.manual_seed(0)
    m = activations.build(name)
    for _ in range(3):
        m(torch.randn(512, 32) * 2)
        activations.step_statistics(m)
    with torch.no_grad():
        m.alpha.fill_(0.5)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    m.eval()
    x = torch.randn(64, 32) + 1.0  # different statistics: must not be used
    act = F.silu if name == "nswish" else F.relu
    scale = lam_n(m.running_rho, m.running_rho_prime) + 0.3 * math.tanh(0.5)
    torch.testing.assert_close(m(x), scale * (act(x) - m.running_mu))
    for k, v in m.state_dict().items():
        assert torch.equal(v, state[k]), k  # eval does not touch the buffers

    m2 = activations.build(name)
    m2.load_state_dict(m.state_dict())
    m2.eval()
    torch.testing.assert_close(m2(x), m(x))
    assert m2.telemetry() == m.telemetry()
    m.train(), m2.train()
    xb = torch.randn(512, 32)
    torch.testing.assert_close(m2(xb), m(xb))  # the restored module is past its first batch too
    activations.step_statistics(m2)
    assert m2.num_batches_tracked == 4


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_per_instance_matches_float64(name):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 64) * torch.rand(3, 5, 1) * 3 + torch.randn(3, 5, 1)
    m = activations.build(name, per_instance=True)
    assert not list(m.buffers())
    with torch.no_grad():
        m.alpha.fill_(-0.4)
    xg = x.clone().requires_grad_()
    out = m(xg)
    grad = torch.randn_like(out)
    out.backward(grad)

    x64 = x.double().requires_grad_()
    alpha = torch.tensor(-0.4, dtype=D, requires_grad=True)
    mu, rho, rp = (s.detach() for s in batch_stats64(name, x64, dim=-1))  # no gradient through stats
    act = F.silu if name == "nswish" else F.relu
    ref = (lam_n(rho, rp) + 0.3 * torch.tanh(alpha)) * (act(x64) - mu)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xg.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.alpha.grad.double(), alpha.grad, rtol=1e-4, atol=1e-4)
    m.eval()
    torch.testing.assert_close(m(x), out.detach())  # same math in evaluation
    assert set(m.telemetry()) == {"alpha"}


@pytest.mark.parametrize("kind", ["swish", "relu"])
def test_anact_function_gradcheck(kind):
    torch.manual_seed(0)
    act = F.silu if kind == "swish" else F.relu
    x = torch.randn(4, 6, dtype=D)
    x = (x + 0.1 * x.sign()).requires_grad_()  # keep ReLU's kink away from the finite differences
    scale = torch.tensor(1.3, dtype=D, requires_grad=True)
    mu = torch.tensor(0.2, dtype=D)
    fn = lambda x, s: _NormalizedFunction.apply(x, act(x).detach(), s, mu, kind)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, scale))
    assert torch.autograd.gradgradcheck(fn, (x, scale))


# ---------------------------------------------------------------- compile, bf16
COMPILED = ("aglu", "nswish", "polynorm")


@pytest.fixture(scope="module")
def compiled_and_eager_steps():
    """Two training steps of each of COMPILED, eager and under inductor, from the same weights: {name: (eager,
    compiled, [(eager output, compiled output, eager input grad, compiled input grad) per step])}.

    The three run in one compiled function, each on its own input: inductor compiles one forward and one backward
    graph for all of them, and its C++ wrapper puts each graph's kernels in one source file (one compiler run per
    graph, each run's cost mostly loading torch's precompiled header, not one per kernel). Every inductor test runs
    on one pytest-xdist worker (--dist loadgroup): that worker pays inductor's set-up (the CPU-ISA probes: compiles
    and child processes) once, and its kernel cache serves kernels two tests share."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = torch.nn.ModuleDict({name: activations.build(name) for name in COMPILED})
    compiled = torch.nn.ModuleDict({name: activations.build(name) for name in COMPILED})
    compiled.load_state_dict(eager.state_dict())
    fn = torch.compile(lambda xs: [compiled[name](x) for name, x in zip(COMPILED, xs)], backend="inductor",
                       fullgraph=True)
    steps = {name: [] for name in COMPILED}
    try:
        with torch._inductor.config.patch(cpp_wrapper=True):
            for step in range(2):  # the second step takes the running-statistics branch of NSwish
                x = [torch.randn(4, 8, 32) for _ in COMPILED]
                xe = [t.clone().requires_grad_() for t in x]
                xc = [t.clone().requires_grad_() for t in x]
                g = [torch.randn(4, 8, 32) for _ in COMPILED]
                oe, oc = [eager[name](t) for name, t in zip(COMPILED, xe)], fn(xc)
                torch.autograd.backward(oe, g), torch.autograd.backward(oc, g)
                activations.step_statistics(eager), activations.step_statistics(compiled)
                for name, out_e, out_c, in_e, in_c in zip(COMPILED, oe, oc, xe, xc):
                    steps[name].append((out_e.detach(), out_c.detach(), in_e.grad, in_c.grad))
    finally:
        torch._dynamo.reset()  # leave no compiled graphs behind for later tests
    return {name: (eager[name], compiled[name], steps[name]) for name in COMPILED}


@pytest.mark.long
@pytest.mark.xdist_group("inductor")
@pytest.mark.parametrize("name", COMPILED)
def test_compile_matches_eager(name, compiled_and_eager_steps):
    eager, compiled, steps = compiled_and_eager_steps[name]
    for oe, oc, ge, gc in steps:
        torch.testing.assert_close(oc, oe, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gc, ge, rtol=1e-5, atol=1e-5)
    for (n, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-4, msg=n)
    for be, bc in zip(eager.buffers(), compiled.buffers()):
        torch.testing.assert_close(bc, be)


@pytest.mark.parametrize("name", ["aglu", "apa", "nswish", "nrelu", "xgelu", "polyrelu", "polynorm"])
def test_bf16_autocast(name):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 128)
    act = activations.build(name)
    ref_act = activations.build(name)
    ref_act.load_state_dict(act.state_dict())
    x = torch.randn(32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x)
        assert h.dtype == torch.bfloat16
        out = act(h)
    assert out.dtype == torch.bfloat16
    ref = ref_act(h.float())  # same bf16-rounded input, fp32 all the way
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    for p in act.parameters():
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
    hb = h.detach().requires_grad_()
    act(hb).sum().backward()
    assert hb.grad.dtype == torch.bfloat16


# ---------------------------------------------------------------- registry
def test_registry_errors_list_choices():
    with pytest.raises(ValueError, match="aglu.*nswish"):
        activations.build("agelu")
    with pytest.raises(ValueError, match="kappa_init"):
        activations.build("aglu", kapa_init=(0.8, 1.2))
    with pytest.raises(ValueError, match="options: none"):
        activations.build("gelu", approximate="tanh")
    with pytest.raises(ValueError, match="num_channels"):
        activations.build("aglu", channelwise=True)


def test_every_registered_activation_builds_and_runs():
    assert {"gelu", "gelu_exact", "relu", "relu2", "silu", "swish", "aglu", "apa", "nswish", "nrelu"} <= set(activations.available())
    for name in activations.available():
        m = activations.build(name)
        x = torch.randn(2, 5, 12, requires_grad=True)
        out = m(x)
        out.sum().backward()
        assert out.shape == x.shape and torch.isfinite(out).all() and torch.isfinite(x.grad).all(), name
        if list(m.parameters()):
            m.eval()
            tel = m.telemetry()
            assert tel and all(isinstance(v, float) for v in tel.values()), name


def test_impl_option(monkeypatch):
    """impl picks the code path (activations/impl.py); tests/test_kernels.py checks the kernels themselves."""
    import activations.impl

    for name in ("aglu", "apa", "nswish", "nrelu"):
        with pytest.raises(ValueError, match="auto, triton, torch"):
            activations.build(name, impl="cuda")
        torch.manual_seed(0)
        auto, plain = activations.build(name), activations.build(name, impl="torch")
        plain.load_state_dict(auto.state_dict())
        x = torch.randn(4, 9)
        assert torch.equal(auto(x), plain(x))  # a CPU tensor takes the PyTorch path
    monkeypatch.setattr(activations.impl, "kernels", None)  # as without Triton installed
    torch.testing.assert_close(activations.build("aglu", kappa_init=1.0, lam_init=1.0)(x), F.silu(x))
    with pytest.raises(RuntimeError, match="needs Triton.*impl='auto' or 'torch'"):
        activations.build("nswish", impl="triton")(x)


def test_plain_name():
    assert activations.plain_name("nswish") == "silu"
    assert activations.plain_name("nrelu") == "relu"
    for name in ("gelu", "aglu", "silu", "relu2"):
        assert activations.plain_name(name) == name
