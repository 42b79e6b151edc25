"""activations/kernels.py: the fused Triton kernels against float64 references and the PyTorch path.

Without a GPU they run in Triton's interpreter (numpy), which tests/conftest.py switches on before triton
is first imported. Tiny odd shapes (not multiples of the block sizes) keep the interpreter fast. One
interpreter difference: it truncates fp32 -> bf16 where a GPU rounds to nearest, so bf16 outputs are
within one bf16 ulp (2^-7 relative) of the fp32 result here, half that on a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed: the kernels cannot run (impl='auto' uses PyTorch)")

import activations  # noqa: E402
from activations import impl, kernels  # noqa: E402
from activations.aglu import LAM_MIN  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not kernels.INTERPRETED:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it first)",
                allow_module_level=True)

D = torch.float64
LAM_MIN32 = float(torch.tensor(LAM_MIN, dtype=torch.float32))  # the clamp as the fp32 paths apply it
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-6), torch.bfloat16: dict(rtol=1e-2, atol=1e-5)}


def inputs(shape, dtype, spread=30.0, seed=0):
    """Inputs with |z| up to `spread` (a linspace) plus 3 N(0,1), and a gradient; exact in float64."""
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel()
    z = torch.cat([torch.linspace(-spread, spread, n // 4, dtype=D), 3 * torch.randn(n - n // 4, generator=g, dtype=D)])
    grad = torch.randn(n, generator=g, dtype=D)
    return z.reshape(shape).to(dtype).to(DEVICE), grad.reshape(shape).to(dtype).to(DEVICE)


# ---------------------------------------------------------------- AGLU / APA
def apa64(z, kappa, lam, gated):
    """Float64 autograd of the stable form (itself checked against Eq. 5 in test_activations.py). lam at its clamp
    keeps its gradient, as in the kernel and the PyTorch path: torch.clamp's own gradient there is 1 up to torch
    2.13 and 0 from 2.14, so the clamp is spelled out."""
    lam = torch.where(lam >= LAM_MIN32, lam, LAM_MIN32)
    v = torch.log(lam) - kappa * z
    eta = torch.exp(-torch.logaddexp(v, torch.zeros_like(v)) / lam)
    return z * eta if gated else eta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kappa,lam", [(1.0, LAM_MIN32), (1.2, 1e-6), (0.9, 0.37), (-0.6, 3.0)])
@pytest.mark.parametrize("name", ["aglu", "apa"])
def test_apa_matches_float64(name, kappa, lam, dtype):
    """Forward, grad_input, kappa and lam gradients; lam at its clamp and below it (no gradient)."""
    m = activations.build(name, kappa_init=kappa, lam_init=lam, impl="triton").to(DEVICE)
    z, grad = inputs((5, 517), dtype)
    zk = z.clone().requires_grad_()
    out = m(zk)
    out.backward(grad)

    z64 = z.double().requires_grad_()
    k64, l64 = (p.detach().double().requires_grad_() for p in (m.kappa, m.lam))
    ref = apa64(z64, k64, l64, name == "aglu")
    ref.backward(grad.double())
    assert out.dtype == zk.grad.dtype == dtype
    torch.testing.assert_close(out.double(), ref.detach(), **TOL[dtype])
    torch.testing.assert_close(zk.grad.double(), z64.grad, **TOL[dtype])
    # fp32 sums over exact inputs: tight for bf16 too (the PyTorch path's lam gradient is 0.5% off at
    # the clamp, fp32 cancellation the kernel avoids)
    torch.testing.assert_close(m.kappa.grad.double(), k64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.lam.grad.double(), l64.grad, rtol=1e-5, atol=1e-5)
    assert (m.lam.grad == 0) == (lam < LAM_MIN32)


def test_apa_extreme_inputs_finite():
    m = activations.build("aglu", kappa_init=1.0, lam_init=1e-4, impl="triton").to(DEVICE)
    z = torch.tensor([-1e4, -100.0, -1e-3, 0.0, 1e-3, 100.0, 1e4], device=DEVICE, requires_grad=True)
    out = m(z)
    out.sum().backward()
    for t in (out, z.grad, m.kappa.grad, m.lam.grad):
        assert torch.isfinite(t).all(), t
    assert out[-1] == 1e4 and abs(out[0]) < 1e-3


def test_channelwise_falls_back_to_torch():
    torch.manual_seed(0)
    m = activations.build("aglu", channelwise=True, num_channels=7, impl="triton").to(DEVICE)
    ref = activations.build("aglu", channelwise=True, num_channels=7, impl="torch").to(DEVICE)
    ref.load_state_dict(m.state_dict())
    z = torch.randn(3, 7, device=DEVICE)
    torch.testing.assert_close(m(z), ref(z), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["aglu", "apa", "nswish", "nrelu"])
def test_fp16_and_non_contiguous_input(name):
    torch.manual_seed(0)
    kern = activations.build(name, impl="triton").to(DEVICE)
    ref = activations.build(name, impl="torch").to(DEVICE)
    ref.load_state_dict(kern.state_dict())
    x, grad = (3 * torch.randn(37, 9, device=DEVICE, dtype=torch.float16).t() for _ in range(2))
    assert not x.is_contiguous()
    out, gx = step(kern, x, grad)
    out_ref, gx_ref = step(ref, x, grad)
    assert out.dtype == gx.dtype == torch.float16 and out.shape == gx.shape == x.shape
    torch.testing.assert_close(out, out_ref, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(gx, gx_ref, rtol=2e-3, atol=1e-4)
    for (n, p), p_ref in zip(kern.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-4, msg=n)


# ---------------------------------------------------------------- NSwish / NReLU
def test_anact_stats_merge_without_cancellation():
    """Mean 5, sd 0.1: E[x^2] - E[x]^2 in fp32 would lose ~2500 ulps; the per-block (mean, M2) merge does not."""
    g = torch.Generator().manual_seed(0)
    x = (5 + 0.1 * torch.randn(3, 4099, generator=g, dtype=D)).float()  # 3 blocks of 4096, the last partial
    for swish, (act, act_grad) in {True: (F.silu, "swish"), False: (F.relu, "relu")}.items():
        got = kernels.anact_stats(x.to(DEVICE), swish).cpu()
        x64 = x.double()
        d = torch.sigmoid(x64) * (1 + x64 * (1 - torch.sigmoid(x64))) if swish else (x64 > 0).double()
        y = act(x64)
        want = torch.stack([y.mean(), y.var(correction=0), x64.mean(), x64.var(correction=0), d.square().mean()])
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0)


def anact_pair(name, dtype, **kwargs):
    """(kernel module in fp32, float64 PyTorch-path module) with equal state, alpha != 0."""
    kern = activations.build(name, impl="triton", **kwargs).to(DEVICE)
    ref = activations.build(name, impl="torch", **kwargs).to(DEVICE).double()
    with torch.no_grad():
        kern.alpha.fill_(0.4), ref.alpha.fill_(0.4)
    return kern, ref


def step(m, x, grad):
    xg = x.clone().requires_grad_()
    out = m(xg)
    out.backward(grad)
    return out, xg.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_training_steps_match_float64_torch_path(name, dtype):
    """Three training steps (the first initialises the buffers, the second is a momentum update, the
    third a batch whose rho, rho' are out of bounds and are ignored), then evaluation: outputs,
    grad_input, alpha's gradient and the running buffers against the float64 PyTorch path."""
    kern, ref = anact_pair(name, dtype)
    shifts = [(1.0, 0.0), (1.3, 0.2), (1.0, -4.0)]
    for i, (scale, shift) in enumerate(shifts):
        z, grad = inputs((7, 601), dtype, spread=3.0, seed=i)
        x = (scale * z.double() + shift).to(dtype)
        out, gx = step(kern, x, grad)
        out64, gx64 = step(ref, x.double(), grad.double())
        activations.step_statistics(kern), activations.step_statistics(ref)
        torch.testing.assert_close(out.double(), out64, **TOL[dtype])
        torch.testing.assert_close(gx.double(), gx64, **TOL[dtype])
        for (n, b), b64 in zip(kern.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b.double(), b64.double(), rtol=1e-5, atol=1e-6, msg=n)
    torch.testing.assert_close(kern.alpha.grad.double(), ref.alpha.grad, rtol=1e-5, atol=1e-5)
    assert kern.num_batches_tracked == 3
    kern.eval(), ref.eval()
    x, grad = inputs((3, 601), dtype, spread=3.0, seed=7)
    out, gx = step(kern, x, grad)
    out64, gx64 = step(ref, x.double(), grad.double())
    torch.testing.assert_close(out.double(), out64, **TOL[dtype])
    torch.testing.assert_close(gx.double(), gx64, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_per_instance_matches_float64_torch_path(name, dtype):
    """Rows of different scale and shift, one all negative (NReLU: rho = rho' = 0, floored at eps) and one
    constant: Var[x] = Var[y] = 0 exactly, so rho = eps on both paths."""
    kern, ref = anact_pair(name, dtype, per_instance=True)
    z, grad = inputs((4, 3, 301), dtype, spread=3.0)
    rows = torch.linspace(0.1, 4, 12, dtype=D).reshape(4, 3, 1)
    x = z.double() * rows + rows - 1
    x[1, 2] = -x[1, 2].abs() - 0.5
    x[0, 0] = 0.7
    x = x.to(dtype)
    out, gx = step(kern, x, grad)
    out64, gx64 = step(ref, x.double(), grad.double())
    torch.testing.assert_close(out.double(), out64, **TOL[dtype])
    torch.testing.assert_close(gx.double(), gx64, **TOL[dtype])
    torch.testing.assert_close(kern.alpha.grad.double(), ref.alpha.grad, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- dispatch, autograd, compile, DDP
def test_dispatch_and_clear_errors(monkeypatch):
    calls = []
    apa = kernels.apa
    monkeypatch.setattr(kernels, "apa", lambda *a: calls.append(1) or apa(*a))
    z = torch.randn(3, 5, device=DEVICE)
    activations.build("aglu", impl="torch").to(DEVICE)(z)
    assert not calls
    activations.build("aglu", impl="auto").to(DEVICE)(z)
    assert not calls  # "auto" takes a kernel only where a decision says so (activations/policy.py fills TRUSTED)
    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(impl, "TRUSTED", {("aglu", str(z.device), z.dtype): True})
    activations.build("aglu", impl="auto").to(DEVICE)(z)
    assert len(calls) == 1
    activations.build("aglu", impl="triton").to(DEVICE)(z)
    assert len(calls) == 2
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16.*impl='torch'"):
        activations.build("nswish", impl="triton").to(DEVICE)(z.double())
    if DEVICE == "cpu":
        monkeypatch.setattr(kernels, "INTERPRETED", False)
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            activations.build("aglu", impl="triton")(z)


def test_saves_only_the_input():
    x = torch.randn(8, 300, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    for name, kwargs in [("aglu", {}), ("apa", {}), ("nswish", {}), ("nrelu", {"per_instance": True})]:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            activations.build(name, impl="triton", **kwargs).to(DEVICE)(x)
        tensors = [t for t in saved if t.dim() > 0]  # besides 0-dim parameters, statistics, tanh(alpha)
        assert len(tensors) == 1 and tensors[0] is x, name


@pytest.mark.parametrize("name", ["aglu", "nswish"])
def test_double_backward_is_a_clear_error(name):
    m = activations.build(name, impl="triton").to(DEVICE)
    z = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    torch.autograd.grad(m(z).sum(), z)  # a plain backward is fine
    with pytest.raises(RuntimeError, match="double backward.*impl='torch'"):
        torch.autograd.grad(m(z).sum(), z, create_graph=True)


def test_custom_ops_pass_opcheck():
    """Schema, fake (shape) kernels and autograd registration, as torch.compile relies on them."""
    x = torch.randn(3, 37, device=DEVICE, requires_grad=True)
    p = torch.tensor(0.7, device=DEVICE, requires_grad=True)
    mu = torch.tensor(0.2, device=DEVICE)
    g = torch.randn(3, 37, device=DEVICE)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in [(kernels.apa, (x, p, p, LAM_MIN, True)), (kernels.anact, (x, p, mu, True)),
                     (kernels.anact_rows, (x, p, 1e-5, False)), (kernels.anact_stats, (x.detach(), True)),
                     (kernels.apa_backward, (g, x.detach(), p.detach(), p.detach(), LAM_MIN, False))]:
        torch.library.opcheck(op, args, test_utils=tests)


@pytest.mark.parametrize("name,kwargs", [("aglu", {}), ("nswish", {}), ("nrelu", {"per_instance": True})])
def test_compile_one_graph_and_same_results(name, kwargs):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = activations.build(name, impl="triton", **kwargs).to(DEVICE)
    compiled = activations.build(name, impl="triton", **kwargs).to(DEVICE)
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(4, 6, 33, device=DEVICE)
    explain = torch._dynamo.explain(activations.build(name, impl="triton", **kwargs).to(DEVICE))(x)
    assert explain.graph_count == 1 and explain.graph_break_count == 0, explain.break_reasons
    # aot_eager traces forward and backward through the fake kernels, then runs the real ones
    fn = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    for _ in range(2):  # the second step takes the running-statistics branch of NSwish
        g = torch.randn_like(x)
        oe, ge = step(eager, x, g)
        oc, gc = step(fn, x, g)
        activations.step_statistics(eager), activations.step_statistics(compiled)
        torch.testing.assert_close(oc, oe, rtol=0, atol=0)
        torch.testing.assert_close(gc, ge, rtol=0, atol=0)
    for (n, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=0, atol=0, msg=n)
    for be, bc in zip(eager.buffers(), compiled.buffers()):
        torch.testing.assert_close(bc, be, rtol=0, atol=0)


def test_ddp_gradients(tmp_path):
    """Parameter gradients are ordinary autograd gradients: DDP's reducer sees and averages them."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = "nccl" if DEVICE == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Linear(8, 16), activations.build("aglu", impl="triton")).to(DEVICE)
        wrapped = torch.nn.Sequential(torch.nn.Linear(8, 16), activations.build("aglu", impl="triton")).to(DEVICE)
        wrapped.load_state_dict(plain.state_dict())
        ddp = DDP(wrapped)
        x = torch.randn(5, 8, device=DEVICE)
        plain(x).square().sum().backward()
        ddp(x).square().sum().backward()
        for (n, p), q in zip(plain.named_parameters(), wrapped.parameters()):
            assert q.grad is not None, n
            torch.testing.assert_close(q.grad, p.grad, msg=n)
        # the Reducer holds the group: freed after destroy_process_group, the group's destructor joined its
        # worker threads under the GIL and once hung the suite (pytorch/pytorch#154976), so DDP goes first
        del ddp
    finally:
        dist.destroy_process_group()


# H100/H200, where the project's speed is measured, and the worst case of the archs counted: its cubins take the
# most registers (154 at most, sm_80's 150) and as many instructions per element (within 0.7). A100 and Blackwell
# (sm_80, sm_100, sm_120) are counted by `python bench/kernel_instructions.py 80 90 100 120` (BENCHMARKS.md: no
# spills there either), not here: each arch is 36 more compiles (~6 CPU-s)
REQUIRED_ARCHS = (90,)
# SASS instructions per element (bench/kernel_instructions.py) of each kernel, (forward, backward), any variant,
# on sm_80 and sm_90 in bf16 and fp32. a84bf53's issued 52-55 and 101-106 for AGLU/APA (precise log1p and log,
# exp with denormal guards, four divisions per element), up to 19 and 30 for NSwish, 47 for its statistics pass,
# 40 and 46 per row; now 23 and 43, 10 and 20, 33, 35 and 42 (BENCHMARKS.md, "The learned"; the statistics
# and rows, summing about their first element, +3 since), with 5-15% of room for another Triton's code
# generation. Above ~28 forward and ~42 backward an H200 waits on issue, not on memory.
MAX_PER_ELEMENT = {"_apa_kernel": (27, 49), "_anact_kernel": (12, 23), "_anact_stats_kernel": (35, 35),
                   "_anact_rows_kernel": (37, 44)}


@pytest.fixture(scope="module")
def compiled_variants(tmp_path_factory):
    """bench/kernel_instructions.py --json: every kernel variant (each constexpr combination, bf16 and fp32)
    compiled to cubin with no GPU for REQUIRED_ARCHS, with each cubin's
    resource usage and SASS count; a skip when this Triton bundles no ptxas or cuobjdump."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton_cache")))
    result = subprocess.run([sys.executable, "bench/kernel_instructions.py", "--json",
                             *map(str, REQUIRED_ARCHS)], cwd=root, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    if rows and "unavailable" in rows[0]:
        pytest.skip(f"cannot compile the kernels for a GPU here: {rows[0]['unavailable']}")
    assert not [r for r in rows if "unsupported" in r], rows
    return rows


@pytest.mark.long
@pytest.mark.xdist_group("kernel_compile")  # one compile of every variant for both tests
def test_every_kernel_variant_compiles_without_spills(compiled_variants):
    """The interpreter runs Python, so it misses what only the compiler rejects (a non-constexpr global, branch
    types) and what only ptxas sees: every kernel variant compiles, and no cubin spills a register (stack or
    local memory), as that would cost bandwidth on every call."""
    compiled = compiled_variants
    assert {r["arch"] for r in compiled} == set(REQUIRED_ARCHS)
    per_arch = 2 * (4 + 2 + 4 + 4 * 2)  # (apa, anact_stats, anact, anact_rows x 2 blocks) x (bf16, fp32)
    assert len(compiled) == per_arch * len(REQUIRED_ARCHS)
    errors = [r for r in compiled if "error" in r]
    assert not errors, errors[:3]
    spills = [r for r in compiled if r["STACK"] or r["LOCAL"]]
    assert not spills, spills


@pytest.mark.long
@pytest.mark.xdist_group("kernel_compile")
def test_instructions_per_element_within_bounds(compiled_variants):
    """Each kernel issues no more SASS instructions per element than its bound, forward and backward, for the
    H100/H200 (the kernels' speed on a GPU comes from this count: bench/kernel_instructions.py)."""
    compiled = compiled_variants
    over = [(r["arch"], r["kernel"], r["dtype"], {k: r[k] for k in ("GATED", "SWISH", "BACKWARD", "BLOCK") if k in r},
             r["per_element"], MAX_PER_ELEMENT[r["kernel"]][bool(r.get("BACKWARD"))])
            for r in compiled if r["per_element"] > MAX_PER_ELEMENT[r["kernel"]][bool(r.get("BACKWARD"))]]
    assert not over, over
    assert {(r["arch"], r["kernel"]) for r in compiled} == {(a, k) for a in REQUIRED_ARCHS for k in MAX_PER_ELEMENT}
