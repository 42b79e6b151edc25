"""Fused Triton kernels for AGLU/APA and NSwish/NReLU, registered as torch custom ops
(speed: BENCHMARKS.md, "Fused Triton kernels vs the PyTorch path").

Same math as the PyTorch path (activations/aglu.py, activations/anact.py): fp32 inside, bf16/fp16/fp32
in and out, lam clamped at lam_min, ln eta = -softplus(ln lam - kappa z) / lam. Memory passes:

    apa            forward reads z, writes out; backward reads z and grad, writes grad_z and reduces
                   the kappa, lam gradients per block (one pass, then a sum over the block partials)
    anact_stats    one read of x: per-block (mean, M2) of act(x) and x and sum act'(x)^2, merged in
                   float64 (Chan et al.), so no E[y^2] - E[y]^2 cancellation
    anact          forward reads x, writes out; backward as apa (grad_x, and the scale gradient)
    anact_rows     per_instance: one program per row, the row's statistics in registers, so the forward
                   is one pass and the backward one pass (it recomputes the row statistics)

lam's gradient takes softplus(v) - sigmoid(v) from a series where the two cancel, so it stays accurate
near the clamp (aglu.py's fp32 path is about 0.5% off there). Only the input is saved for backward.

NaN and inf come out where the PyTorch path gives them (tests/test_kernel_edges.py): clamps and ReLU take the
NaN-propagating max, lanes past the end add exactly 0 to a sum whatever the parameters, and the statistics sum
about a block's or row's first element, so a constant one has variance exactly 0 as torch.var gives.

The kernels are bound by instructions issued, not by memory, above ~28 per element forward and ~42 backward on an
H200 (bench/kernel_instructions.py counts them, without a GPU): so each exp is one MUFU.EX2 in base 2 and
each reciprocal one MUFU.RCP (documented errors 2 and 1 ulp), a division is one reciprocal shared where it can
be, log1p is an atanh series on one reciprocal, and per-program constants (1/lam, kappa/lam) multiply block sums
rather than elements. libdevice's precise exp, log, log1p and division cost 10-30 instructions each. In fp32,
against float64, the approximations keep AGLU within 0.49 of the fp32 tolerance (rtol 1e-4, atol 1e-6; the
probe's, in activations/selfcheck.py) even with every error at its bound one way: bench/kernel_fast_math.py replays
the arithmetic with each approximate result off by up to its documented error (BENCHMARKS.md has NSwish's, where
outputs near 0 next to a large act(x) take a few ulps of act(x) against atol). The interpreter computes them
exactly (numpy), so tests/test_kernels.py checks the algebra and the series, the GPU's self-check (selfcheck.py)
its approximations.

Each op is a torch.library custom op with a fake (shape) kernel, so torch.compile keeps it in its graph;
its autograd formula is the matching backward op. Double backward is not supported (a clear error; the
PyTorch path, impl="torch", has it). torch.library.triton_op would let inductor see the kernels, but
under TRITON_INTERPRET its wrap_triton cannot be traced, and the compile tests run in the interpreter.

On a CPU tensor the kernels run in Triton's interpreter, which needs TRITON_INTERPRET=1 set before
triton is first imported: triton decorates its own tl.sum, tl.sigmoid, ... at import (tests/conftest.py).
"""
import contextlib

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# anact_rows holds a whole row in registers (8 warps, 32 values per thread at 8192); longer rows take the PyTorch
# path. 16384 spilled registers to local memory on sm_80 and sm_90 with 8 or 16 warps (tests/test_kernels.py).
MAX_ROW = 8192
# Elements per program of the pointwise kernels: 16 per thread (4 warps), so a program's fixed work (its parameters,
# the block sums of the backward) spreads over twice the elements it did at 1024; 4096 took 143 registers on sm_90
# (bench/kernel_instructions.py). Not tuned on a GPU yet.
BLOCK = 2048
STATS_BLOCK = 4096  # fewer, larger blocks: fewer partials for the float64 merge
STATS_WARPS = 8  # 16 per thread: its five block sums cost ~30% less per element than at 16 warps, 60 registers
TINY = tl.constexpr(1.1754943508222875e-38)  # torch.finfo(torch.float32).tiny, anact.py's floor for Var[x]
# max.f32 (tl.maximum's default) returns the non-NaN operand: a NaN lam, rho or ReLU input would come out finite
# where torch.clamp_min and F.relu give NaN. max.NaN.f32 is one instruction too (sm_80 on).
NAN = tl.constexpr(tl.PropagateNan.ALL)
# True when TRITON_INTERPRET=1 was set before triton's first import (tl.sum & co. are then interpreted
# too); a compile-time constant for the kernels.
INTERPRETED = tl.constexpr(isinstance(tl.sum, InterpretedFunction))
LOG2E, LN2 = tl.constexpr(1.4426950408889634), tl.constexpr(0.6931471805599453)
# Q(t) = 2 (atanh(s)/s - 1) / t, t = s^2 <= 1/9: a cubic fitted for relative error (4e-7 of Q at most; t Q is at
# most 4% of log1p(e) / s, so < 2e-8 of log1p), where the Taylor series 2/3 + 2t/5 + ... needs seven terms
Q0, Q1 = tl.constexpr(0.6666663994135407), tl.constexpr(0.400076258368243)
Q2, Q3 = tl.constexpr(0.2823504097984134), tl.constexpr(0.2686102275126062)


def row_warps(block):
    """Warps of anact_rows for a row of `block` (a power of two): 16 values per thread up to 8 warps (32 at
    MAX_ROW), so its six row sums spread over as many elements as a pointwise program's."""
    return min(max(block // 512, 1), 8)


@triton.jit
def _rcp(x):
    """1/x in one MUFU.RCP (rcp.approx.ftz: 1 ulp) where Triton's division adds range checks (~10 instructions)."""
    if INTERPRETED:  # no inline PTX in the interpreter
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _mul_rn(a, b):
    """a b rounded to fp32 (mul.rn), never fused into a following add: ptxas leaves an explicitly rounded multiply
    alone, and LLVM cannot see into inline PTX."""
    if INTERPRETED:
        return a * b
    else:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _block(n, BLOCK: tl.constexpr):
    """(first element of this program, in int64; in-range mask of its BLOCK, compared in int32)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    return start, tl.arange(0, BLOCK) < tl.minimum(n - start, BLOCK).to(tl.int32)


@triton.jit
def _apa_eta(z, kappa, lam, inv_lam):
    """(v log2 e, e, s, t, Q(t), softplus(v), eta) of APA at z, lam already clamped (_apa_kernel's docstring)."""
    # precise log2 (~30 instructions per thread, 2 per element): MUFU.LG2's 2 ulp of log2(1e-4) = -13.3 shift v by
    # 2e-6, which q = sigmoid(v) / lam amplifies to ~1e-4 of grad_z at lam's clamp, the fp32 tolerance
    # (bench/kernel_fast_math.py --lg2-ulps 2)
    v2 = tl.log2(lam) - (kappa * LOG2E) * z  # v log2(e)
    e = tl.exp2(-tl.abs(v2))
    s = e * _rcp(2.0 + e)
    t = s * s
    q = Q0 + t * (Q1 + t * (Q2 + t * Q3))
    softplus = tl.maximum(v2, 0.0) * LN2 + s * (2.0 + t * q)
    eta = tl.exp2(softplus * (-LOG2E * inv_lam))
    return v2, e, s, t, q, softplus, eta


@triton.jit
def _apa_forward(z, kappa, lam, inv_lam, GATED: tl.constexpr):
    """AGLU (GATED: z eta) or APA (eta) at z; the one definition the elementwise and the fused MLP kernels share."""
    _, _, _, _, _, _, eta = _apa_eta(z, kappa, lam, inv_lam)
    return z * eta if GATED else eta


@triton.jit
def _apa_backward(z, g, kappa, lam, inv_lam, GATED: tl.constexpr):
    """(out, grad_z, ws z, w D) at z for incoming gradient g: d kappa = sum(ws z) / lam, d lam = sum(w D) / lam^2
    (_apa_kernel's docstring); shared with the fused MLP kernels."""
    v2, e, s, t, q, softplus, eta = _apa_eta(z, kappa, lam, inv_lam)
    ge = g * eta
    w = ge * z if GATED else ge
    sigmoid = tl.where(v2 >= 0, 1.0, e) * _rcp(1.0 + e)
    ws = w * sigmoid  # t lam: 1 / lam is applied to the block's sum and to kappa, once per program
    kappa_lam = kappa * inv_lam
    grad_z = ge + ws * kappa_lam if GATED else ws * kappa_lam
    # For v << 0 softplus and sigmoid are both ~e^v and D ~ e^{2v}/2: their fp32 difference loses about 0.5%
    # of lam's gradient at lam_min (aglu.py's fp32 path does, against float64). There D = log1p(e) - 2s/(1 + s)
    # = s (2s / (1 + s) + t Q(t)), with 2s / (1 + s) = e / (1 + e) = sigmoid: all terms positive.
    d = tl.where(v2 >= 0, softplus - sigmoid, s * (sigmoid + t * q))
    return z * eta if GATED else eta, grad_z, ws * z, w * d


@triton.jit
def _apa_kernel(z_ptr, grad_ptr, out_ptr, partial_ptr, kappa_ptr, lam_ptr, n, lam_min,
                GATED: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """Forward: out = z eta (GATED) or eta. Backward: out = grad_z and, per block, the sums
    partial[pid] = (sum t z, sum w D), from which d kappa = sum t z and d lam = sum w D / lam^2.
    aglu.py's docstring: w = grad d out / d ln eta, t = w q, q = sigmoid(v) / lam, v = ln lam - kappa z;
    D = softplus(v) - sigmoid(v) = -lam (q + ln eta).

    The exponentials in base 2 (one MUFU.EX2 each), with e = e^-|v|: softplus(v) = max(v, 0) + log1p(e),
    log1p(e) = 2 atanh(s) = s (2 + t Q(t)) with s = e / (2 + e), t = s^2 <= 1/9: one reciprocal and a cubic,
    accurate to an ulp relative even where e is below fp32's resolution of 1 + e (where log1p(e) / lam is
    all of ln eta at lam's clamp, so its relative error, not its absolute one, must be an ulp's)."""
    pid = tl.program_id(0)
    start, mask = _block(n, BLOCK)
    offs = tl.arange(0, BLOCK)
    kappa = tl.load(kappa_ptr).to(tl.float32)
    # Off the end z = sign(kappa), so v = ln lam - |kappa| is finite, or -inf at kappa = +-inf (z = 0 would make it
    # NaN there), and those lanes add exactly 0 to the block sums, as in the PyTorch path, which has no such lanes
    z = tl.load(z_ptr + start + offs, mask=mask, other=tl.where(kappa < 0, -1.0, 1.0)).to(tl.float32)
    lam = tl.maximum(tl.load(lam_ptr).to(tl.float32), lam_min, propagate_nan=NAN)
    inv_lam = _rcp(lam)
    if not BACKWARD:
        out = _apa_forward(z, kappa, lam, inv_lam, GATED)
        tl.store(out_ptr + start + offs, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        g = tl.load(grad_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)  # 0 off the end: no partials
        _, grad_z, ws_z, wd = _apa_backward(z, g, kappa, lam, inv_lam, GATED)
        tl.store(out_ptr + start + offs, grad_z.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_ptr + 2 * pid, tl.sum(ws_z, axis=0) * inv_lam)
        tl.store(partial_ptr + 2 * pid + 1, tl.sum(wd, axis=0))


@triton.jit
def _act(x, SWISH: tl.constexpr, SHIFTED: tl.constexpr = False):
    """act(x) and act'(x) (anact.py): SiLU and sigma(x)(1 + x(1 - sigma(x))), or ReLU and 1[x > 0].
    SHIFTED: for y - act(x0), SiLU's x sigma(x) rounded as the scalar act(x0) is, so that it is 0 where x = x0
    (fused into the subtraction, an FMA, it would leave x0 sigma(x0)'s rounding error, and a constant block or row
    a variance of ~1e-30 against Var[x] = 0); otherwise y - mu may fuse, one instruction and one rounding fewer."""
    if SWISH:
        s = _rcp(1.0 + tl.exp2(x * -LOG2E))  # exp2 -> inf for x << 0: rcp(inf) = 0, y = -0
        y = _mul_rn(x, s) if SHIFTED else x * s
        return y, s + y * (1.0 - s)
    else:
        return tl.maximum(x, 0.0, propagate_nan=NAN), tl.where(x > 0, 1.0, 0.0)


@triton.jit
def _anact_stats_kernel(x_ptr, partial_ptr, n, SWISH: tl.constexpr, BLOCK: tl.constexpr):
    """partial[pid] = (mean y, mean x, M2 y, M2 x, sum act'^2) over this block, y = act(x);
    M2 about the block's own mean, taken from registers (a two-pass variance at one memory pass).
    Sums of x - x0 and y - act(x0), x0 the block's first element: a constant block has mean exactly x0 and M2
    exactly 0, as torch.var gives (a sum of x times 1/count rounds off x0, and rho would be a ratio of two
    roundings), and a block far from 0 keeps the precision of its spread. An x0 of +-inf makes the mean NaN, as
    torch.var_mean's Welford pass makes that of [inf, 1]."""
    pid = tl.program_id(0)
    start, mask = _block(n, BLOCK)
    x0 = tl.load(x_ptr + start).to(tl.float32)
    x = tl.load(x_ptr + start + tl.arange(0, BLOCK), mask=mask, other=x0).to(tl.float32)
    y, d = _act(x, SWISH, SHIFTED=True)
    y0, _ = _act(x0, SWISH, SHIFTED=True)
    xs, ys = x - x0, y - y0  # 0 off the end
    inv_count = 1.0 / tl.minimum(n - start, BLOCK).to(tl.float32)
    mean_ys = tl.sum(ys, axis=0) * inv_count
    mean_xs = tl.sum(xs, axis=0) * inv_count
    dy = tl.where(mask, ys - mean_ys, 0.0)
    dx = tl.where(mask, xs - mean_xs, 0.0)
    d = tl.where(mask, d, 0.0)
    p = partial_ptr + 5 * pid
    tl.store(p, y0 + mean_ys)
    tl.store(p + 1, x0 + mean_xs)
    tl.store(p + 2, tl.sum(dy * dy, axis=0))
    tl.store(p + 3, tl.sum(dx * dx, axis=0))
    tl.store(p + 4, tl.sum(d * d, axis=0))


@triton.jit
def _anact_kernel(x_ptr, grad_ptr, out_ptr, partial_ptr, scale_ptr, mu_ptr, n,
                  SWISH: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """Forward: out = scale (act(x) - mu), not scale act(x) - scale mu, which cancels when mu is large (one FMA
    either way: act(x) - mu contracts with SiLU's x sigma(x)). Backward: out = grad scale act'(x),
    partial[pid] = sum grad (act(x) - mu) (the scale gradient, anact.py), lanes off the end left out: grad 0
    times act(0) - mu is NaN at mu = +-inf."""
    pid = tl.program_id(0)
    start, mask = _block(n, BLOCK)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr).to(tl.float32)
    mu = tl.load(mu_ptr).to(tl.float32)
    y, d = _act(x, SWISH)
    if not BACKWARD:
        tl.store(out_ptr + start + offs, (scale * (y - mu)).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        g = tl.load(grad_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + start + offs, ((g * scale) * d).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_ptr + pid, tl.sum(tl.where(mask, g * (y - mu), 0.0), axis=0))


@triton.jit
def _anact_rows_kernel(x_ptr, grad_ptr, out_ptr, partial_ptr, adj_ptr, n_cols, eps,
                       SWISH: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """per_instance: mu, rho, rho' over this row (anact.py's _stats, _rho), scale = lam_n + adj with
    adj = beta tanh(alpha). Forward: out = scale (y - mu). Backward: out = grad scale act'(x),
    partial[row] = sum grad (y - mu) (the adj gradient). Sums of x - x0 and y - act(x0), x0 the row's first
    element, as in _anact_stats_kernel: a constant row has Var = 0 exactly, so rho = eps as in the PyTorch path."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row.to(tl.int64) * n_cols + cols
    x0 = tl.load(x_ptr + row.to(tl.int64) * n_cols).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=x0).to(tl.float32)
    y, d = _act(x, SWISH, SHIFTED=True)
    y0, _ = _act(x0, SWISH, SHIFTED=True)
    xs, ys = x - x0, y - y0  # 0 off the end
    inv_cols = 1.0 / n_cols  # a division per program; n_cols may be specialized to a constexpr 1
    dy = tl.where(mask, ys - tl.sum(ys, axis=0) * inv_cols, 0.0)
    dx = tl.where(mask, xs - tl.sum(xs, axis=0) * inv_cols, 0.0)
    d = tl.where(mask, d, 0.0)
    var_y = tl.sum(dy * dy, axis=0) * inv_cols
    var_x = tl.maximum(tl.sum(dx * dx, axis=0) * inv_cols, TINY, propagate_nan=NAN)
    rho = tl.maximum(var_y / var_x, eps, propagate_nan=NAN)
    rho_prime = tl.maximum(tl.sum(d * d, axis=0) * inv_cols, eps, propagate_nan=NAN)
    scale = tl.sqrt((rho + rho_prime) / (2.0 * rho * rho_prime)) + tl.load(adj_ptr).to(tl.float32)
    if not BACKWARD:
        tl.store(out_ptr + offs, (scale * dy).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, ((g * scale) * d).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_ptr + row, tl.sum(g * dy, axis=0))


# ---------------------------------------------------------------- launching
def _on_device(t):
    """Triton launches on the current CUDA device: make it t's (a no-op for CPU tensors)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _dense(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _no_double_backward(*tensors):
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError("double backward (create_graph=True) through the Triton activation kernels is not "
                           "supported; build the activation with impl='torch'")


# ---------------------------------------------------------------- AGLU / APA
@torch.library.custom_op("nanoact::apa", mutates_args=())
def apa(z: torch.Tensor, kappa: torch.Tensor, lam: torch.Tensor, lam_min: float, gated: bool) -> torch.Tensor:
    """AGLU (gated) or APA of z with 0-dim kappa, lam."""
    z = z.contiguous()
    out = torch.empty_like(z)
    with _on_device(z):
        _apa_kernel[(triton.cdiv(z.numel(), BLOCK),)](z, z, out, out, kappa, lam, z.numel(), lam_min,
                                                      GATED=gated, BACKWARD=False, BLOCK=BLOCK)
    return out


@apa.register_fake
def _(z, kappa, lam, lam_min, gated):
    return _dense(z)


@torch.library.custom_op("nanoact::apa_backward", mutates_args=())
def apa_backward(grad: torch.Tensor, z: torch.Tensor, kappa: torch.Tensor, lam: torch.Tensor, lam_min: float,
                 gated: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_z, grad_kappa, grad_lam); lam below lam_min gets no gradient (the clamp's)."""
    z, grad = z.contiguous(), grad.contiguous()
    grad_z = torch.empty_like(z)
    blocks = triton.cdiv(z.numel(), BLOCK)
    partial = torch.empty(blocks, 2, device=z.device, dtype=torch.float32)
    with _on_device(z):
        _apa_kernel[(blocks,)](z, grad, grad_z, partial, kappa, lam, z.numel(), lam_min,
                               GATED=gated, BACKWARD=True, BLOCK=BLOCK)
    sums = partial.sum(0)
    lam32 = lam.float()
    grad_lam = torch.where(lam32 >= lam_min, sums[1] / lam32.clamp_min(lam_min).square(), 0.0)
    return grad_z, sums[0].to(kappa.dtype, copy=True), grad_lam.to(lam.dtype)


@apa_backward.register_fake
def _(grad, z, kappa, lam, lam_min, gated):
    return _dense(z), torch.empty_like(kappa), torch.empty_like(lam)


def _apa_setup(ctx, inputs, output):
    z, kappa, lam, ctx.lam_min, ctx.gated = inputs
    ctx.save_for_backward(z, kappa, lam)


def _apa_grad(ctx, grad):
    z, kappa, lam = ctx.saved_tensors
    _no_double_backward(grad, z, kappa, lam)
    return *apa_backward(grad, z, kappa, lam, ctx.lam_min, ctx.gated), None, None


apa.register_autograd(_apa_grad, setup_context=_apa_setup)


# ---------------------------------------------------------------- NSwish / NReLU, batch statistics
@torch.library.custom_op("nanoact::anact_stats", mutates_args=())
def anact_stats(x: torch.Tensor, swish: bool) -> torch.Tensor:
    """float64 (E[y], Var[y], E[x], Var[x], E[act'(x)^2]) over all of x, y = act(x), population variances
    (float64: anact.py pools them over a step's micro-batches)."""
    x = x.contiguous()
    n = x.numel()
    blocks = triton.cdiv(n, STATS_BLOCK)
    partial = torch.empty(blocks, 5, device=x.device, dtype=torch.float32)
    with _on_device(x):
        _anact_stats_kernel[(blocks,)](x, partial, n, SWISH=swish, BLOCK=STATS_BLOCK, num_warps=STATS_WARPS)
    # Chan et al.'s merge: mean = sum n_b mean_b / n, M2 = sum M2_b + sum n_b (mean_b - mean)^2
    p = partial.double()
    counts = (n - STATS_BLOCK * torch.arange(blocks, device=x.device, dtype=torch.float64)).clamp_max(STATS_BLOCK)
    means = counts @ p[:, :2] / n
    m2 = p[:, 2:4].sum(0) + counts @ (p[:, :2] - means).square()
    return torch.stack([means[0], m2[0] / n, means[1], m2[1] / n, p[:, 4].sum() / n])


@anact_stats.register_fake
def _(x, swish):
    return x.new_empty(5, dtype=torch.float64)


@torch.library.custom_op("nanoact::anact", mutates_args=())
def anact(x: torch.Tensor, scale: torch.Tensor, mu: torch.Tensor, swish: bool) -> torch.Tensor:
    """scale (act(x) - mu) with 0-dim scale, mu."""
    x = x.contiguous()
    out = torch.empty_like(x)
    with _on_device(x):
        _anact_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, x, out, out, scale, mu, x.numel(),
                                                        SWISH=swish, BACKWARD=False, BLOCK=BLOCK)
    return out


@anact.register_fake
def _(x, scale, mu, swish):
    return _dense(x)


@torch.library.custom_op("nanoact::anact_backward", mutates_args=())
def anact_backward(grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, mu: torch.Tensor,
                   swish: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_scale); mu carries no gradient (ANAct treats the statistics as constants)."""
    x, grad = x.contiguous(), grad.contiguous()
    grad_x = torch.empty_like(x)
    blocks = triton.cdiv(x.numel(), BLOCK)
    partial = torch.empty(blocks, device=x.device, dtype=torch.float32)
    with _on_device(x):
        _anact_kernel[(blocks,)](x, grad, grad_x, partial, scale, mu, x.numel(),
                                 SWISH=swish, BACKWARD=True, BLOCK=BLOCK)
    return grad_x, partial.sum().to(scale.dtype)


@anact_backward.register_fake
def _(grad, x, scale, mu, swish):
    return _dense(x), torch.empty_like(scale)


def _anact_setup(ctx, inputs, output):
    x, scale, mu, ctx.swish = inputs
    ctx.save_for_backward(x, scale, mu)


def _anact_grad(ctx, grad):
    x, scale, mu = ctx.saved_tensors
    _no_double_backward(grad, x, scale)
    return *anact_backward(grad, x, scale, mu, ctx.swish), None, None


anact.register_autograd(_anact_grad, setup_context=_anact_setup)


# ---------------------------------------------------------------- NSwish / NReLU, per_instance
def _row_launch(x, grad, out, partial, adj, eps, swish, backward):
    n_cols = x.shape[-1]
    block = triton.next_power_of_2(n_cols)
    with _on_device(x):
        _anact_rows_kernel[(x.numel() // n_cols,)](x, grad, out, partial, adj, n_cols, eps, SWISH=swish,
                                                   BACKWARD=backward, BLOCK=block,
                                                   num_warps=row_warps(block))


@torch.library.custom_op("nanoact::anact_rows", mutates_args=())
def anact_rows(x: torch.Tensor, adj: torch.Tensor, eps: float, swish: bool) -> torch.Tensor:
    """(lam_n + adj) (act(x) - mu) with mu, lam_n per row (last dim); 0-dim adj = beta tanh(alpha)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _row_launch(x, x, out, out, adj, eps, swish, backward=False)
    return out


@anact_rows.register_fake
def _(x, adj, eps, swish):
    return _dense(x)


@torch.library.custom_op("nanoact::anact_rows_backward", mutates_args=())
def anact_rows_backward(grad: torch.Tensor, x: torch.Tensor, adj: torch.Tensor, eps: float,
                        swish: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_adj); the row statistics carry no gradient."""
    x, grad = x.contiguous(), grad.contiguous()
    grad_x = torch.empty_like(x)
    partial = torch.empty(x.numel() // x.shape[-1], device=x.device, dtype=torch.float32)
    _row_launch(x, grad, grad_x, partial, adj, eps, swish, backward=True)
    return grad_x, partial.sum().to(adj.dtype)


@anact_rows_backward.register_fake
def _(grad, x, adj, eps, swish):
    return _dense(x), torch.empty_like(adj)


def _rows_setup(ctx, inputs, output):
    x, adj, ctx.eps, ctx.swish = inputs
    ctx.save_for_backward(x, adj)


def _rows_grad(ctx, grad):
    x, adj = ctx.saved_tensors
    _no_double_backward(grad, x, adj)
    return *anact_rows_backward(grad, x, adj, ctx.eps, ctx.swish), None, None


anact_rows.register_autograd(_rows_grad, setup_context=_rows_setup)
