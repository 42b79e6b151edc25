"""The plain MLP c_proj(act(c_fc(x))) with the activation fused into its matmuls (Triton), for every activation of
activations/pointwise.py (the registry's pointwise ones: gelu, gelu_exact, relu, relu2, leaky_relu2, silu, mish,
xatlu, xgelu, xsilu, apa, aglu).

    forward    one tiled matmul x W_fc^T + b whose epilogue rounds the pre-activation to the input's dtype (as
               the unfused c_fc writes it), keeps it for the backward and writes act(pre) once; then c_proj
    backward   one tiled matmul grad_y W_proj (c_proj's input gradient) whose epilogue reads the saved
               pre-activation and writes grad_pre = grad_h act'(pre) and act(pre) again (for c_proj's weight
               gradient), and reduces the activation's scalar parameters' gradients per tile; the rest are
               cuBLAS matmuls on grad_pre

so the 4x-wide hidden tensor is written twice and read twice less than with an elementwise activation between the
matmuls, and only the pre-activation is saved (the unfused MLP saves it and act's output). Both epilogues take the
activation from pointwise.py, the definition activations/kernels.py's elementwise kernels use too.

NSwish/NReLU need their batch's statistics before any output (not pointwise): they keep kernels.py's passes, and
fused_kind() says so. Channelwise APA/AGLU keeps the unfused path. A gated MLP, c_proj(act(x W_gate) (x W_up)),
runs both projections in the forward matmul (two accumulators over the same x tiles) and writes act(gate) up;
its backward epilogue gives grad_gate = grad_h up act'(gate) and grad_up = grad_h act(gate).

The path is chosen per run by activations/policy.py's measured probe (mlp.fused, set by select_fused), never by a
table; forward() is what model.py's MLP calls: the fused output, or None for the unfused path.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import activations.pointwise as pointwise
from activations.aglu import APA, LAM_MIN
from activations.basic import GELU, GELUExact, LeakyReLU2, Mish, ReLU, ReLU2, SiLU
from activations.expanded import XATLU, XGELU, XSiLU
from activations.kernels import DTYPES, INTERPRETED, _on_device

CLASSES = {GELU: "gelu", GELUExact: "gelu_exact", ReLU: "relu", ReLU2: "relu2", LeakyReLU2: "leaky_relu2",
           SiLU: "silu", Mish: "mish", XATLU: "xatlu", XGELU: "xgelu", XSiLU: "xsilu"}
NOT_POINTWISE = {"NSwish": "NSwish normalises with its batch's statistics (not pointwise): kernels.py's passes",
                 "NReLU": "NReLU normalises with its batch's statistics (not pointwise): kernels.py's passes"}


# Epilogues with no exponential (pointwise.py: relu, relu2, leaky_relu2) or one (gelu, silu): light enough for the
# wider tiles, whose 32-64 accumulator values per thread leave them ~40 registers where AGLU's backward needs ~100
LIGHT = frozenset(pointwise.KINDS[n] for n in ("relu", "relu2", "leaky_relu2", "gelu", "silu"))


def _configs():
    """Tiles to autotune over on a GPU, (BLOCK_M, BLOCK_N, BLOCK_K, stages), all at 8 warps; one small tile in the
    interpreter, so the autotuner times nothing there. NARROW tiles leave 16 accumulator values per thread: every
    epilogue fits, the heaviest (AGLU's backward) spills at 32 per thread on sm_90, and at 16 with 16 warps or with
    4 warps. WIDE ones (32-64 per thread) only for the plain MLP's LIGHT epilogues (_prune). Each config the pruning leaves is
    compiled for sm_80/90/100 without spills by `python bench/kernel_instructions.py 80 90 100 --fused`
    (BENCHMARKS.md, "The activation fused into the MLP's matmuls")."""
    if INTERPRETED:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=8, num_stages=s)
            for m, n, k, s in NARROW + WIDE]


NARROW = [(64, 64, 64, 3), (64, 64, 64, 4), (64, 64, 32, 5), (64, 64, 32, 3), (32, 128, 64, 3), (128, 32, 64, 3)]
WIDE = [(128, 64, 64, 3), (64, 128, 64, 3), (128, 128, 32, 4)]
CONFIGS = _configs()


def _prune(configs, named_args, **kwargs):
    """What the autotuner may time for this launch: WIDE tiles only for a LIGHT epilogue of the plain MLP (the gated
    one's second accumulator, or its backward's second input and output per value, spill there on sm_80); the gated
    forward (two accumulators) at BLOCK_K 32: at 64 its operand fragments spill on sm_80."""
    gated, backward = kwargs.get("GATED"), kwargs.get("BACKWARD")
    wide_ok = kwargs.get("KIND") in LIGHT and not gated
    kept = [c for c in configs if wide_ok or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64]
    if gated and not backward:
        kept = [c for c in kept if c.kwargs["BLOCK_K"] <= 32]
    return kept or configs


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x (fp32) rounded to dtype to nearest even, as a GPU's conversion does; the interpreter's own truncates to bf16,
    which would bias every sum of the backward by up to an ulp."""
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        up = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return tl.where(x != x, x, up.to(tl.float32, bitcast=True)).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def _tile_matmul(a_ptr, b_ptr, b2_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, offs_m, offs_n,
                 GATED: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """(a b, a b2) over K for this [BLOCK_M, BLOCK_N] tile, fp32 (a b2 only when GATED: zeros otherwise)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_offs = offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < left), other=0.0)
        b_mask = (offs_k[:, None] < left) & (offs_n[None, :] < N)
        b = tl.load(b_ptr + b_offs, mask=b_mask, other=0.0)
        if INTERPRETED:  # its dot multiplies bf16's raw bits (numpy has no bf16)
            a, b = a.to(tl.float32), b.to(tl.float32)
        if IEEE:  # fp32 as torch's fp32 matmul (no TF32)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if GATED:
            b2 = tl.load(b2_ptr + b_offs, mask=b_mask, other=0.0)
            if INTERPRETED:
                b2 = b2.to(tl.float32)
            if IEEE:
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(a, b2, acc2)
        a_ptrs += BLOCK_K * stride_ak
        b_offs += BLOCK_K * stride_bk
    return acc, acc2


@triton.autotune(CONFIGS, key=["M", "N", "K", "KIND", "BACKWARD", "GATED", "SAVE_PRE"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _matmul_act_kernel(a_ptr, b_ptr, b2_ptr, bias_ptr, bias2_ptr, pre_ptr, up_ptr, out_ptr, out2_ptr, h_ptr,
                       partial_ptr, p0_ptr, p1_ptr, lam_min, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       KIND: tl.constexpr, BACKWARD: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr,
                       SAVE_PRE: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """acc = a b ([M, K] x [K, N], fp32; GATED also acc2 = a b2), then per element of the [M, N] tile, every
    intermediate rounded to out's dtype where the unfused MLP writes it:
    forward   pre = acc + bias (and up = acc2 + bias2), stored when SAVE_PRE; out = act(pre) (GATED: act(pre) up)
    backward  grad_h = acc (c_proj's input gradient), pre (and up) read: out = g act'(pre) with g = grad_h (GATED:
              grad_h up, and out2 = grad_h act(pre)), h = act(pre) (GATED: act(pre) up) for c_proj's weight
              gradient, partial[tile] = (sum t0, sum t1) over the tile (pointwise.backward)."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n  # grouped order: GROUP_M row tiles share the b tiles in L2
    first_m = (pid // group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % rows
    pid_n = (pid % group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc, acc2 = _tile_matmul(a_ptr, b_ptr, b2_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, offs_m,
                             offs_n, GATED and not BACKWARD, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    dtype = out_ptr.dtype.element_ty
    p0 = tl.load(p0_ptr).to(tl.float32)
    p1 = tl.load(p1_ptr).to(tl.float32)
    if not BACKWARD:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            if GATED:
                acc2 += tl.load(bias2_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        pre = _round(acc, dtype)
        if SAVE_PRE:
            tl.store(pre_ptr + idx, pre, mask=mask)
        y = _round(pointwise.forward(pre.to(tl.float32), p0, p1, lam_min, KIND), dtype)
        if GATED:
            up = _round(acc2, dtype)
            if SAVE_PRE:
                tl.store(up_ptr + idx, up, mask=mask)
            y = _round(y.to(tl.float32) * up.to(tl.float32), dtype)
        tl.store(out_ptr + idx, y, mask=mask)
    else:
        x = tl.load(pre_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        g = _round(acc, dtype).to(tl.float32)
        if GATED:
            up = tl.load(up_ptr + idx, mask=mask, other=0.0).to(tl.float32)
            y, grad_x, t0, t1 = pointwise.backward(x, _round(g * up, dtype).to(tl.float32), p0, p1, lam_min, KIND)
            y = _round(y, dtype).to(tl.float32)
            tl.store(out2_ptr + idx, _round(g * y, dtype), mask=mask)
            y = y * up
        else:
            y, grad_x, t0, t1 = pointwise.backward(x, g, p0, p1, lam_min, KIND)
        tl.store(out_ptr + idx, _round(grad_x, dtype), mask=mask)
        tl.store(h_ptr + idx, _round(y, dtype), mask=mask)
        tile = pid_m * num_n + pid_n  # lanes off the edge add exactly 0, whatever t0, t1 are there
        tl.store(partial_ptr + 2 * tile, tl.sum(tl.sum(tl.where(mask, t0, 0.0), axis=1), axis=0))
        tl.store(partial_ptr + 2 * tile + 1, tl.sum(tl.sum(tl.where(mask, t1, 0.0), axis=1), axis=0))


def _grid(M, N):
    return lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)


# ---------------------------------------------------------------- the two epilogue matmuls, as custom ops
@torch.library.custom_op("nanoact::fc_act", mutates_args=())
def fc_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_up: torch.Tensor | None,
           bias_up: torch.Tensor | None, p0: torch.Tensor, p1: torch.Tensor, kind: int, lam_min: float,
           save_pre: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(act(x weight^T + bias), or act(...) (x weight_up^T + bias_up) with weight_up; the pre-activation and the up
    projection, or empty tensors) for x [M, K], weights [N, K]."""
    M, K = x.shape
    N = weight.shape[0]
    gated = weight_up is not None
    out = x.new_empty(M, N)
    pre = x.new_empty(M, N) if save_pre else x.new_empty(0)
    up = x.new_empty(M, N) if save_pre and gated else x.new_empty(0)
    with _on_device(x):
        _matmul_act_kernel[_grid(M, N)](x, weight, weight_up if gated else weight, bias if bias is not None else x,
                                        bias_up if bias_up is not None else x, pre, up, out, out, out, out, p0, p1,
                                        lam_min, M, N, K, x.stride(0), x.stride(1), weight.stride(1),
                                        weight.stride(0), KIND=kind, BACKWARD=False, GATED=gated,
                                        HAS_BIAS=bias is not None, SAVE_PRE=save_pre, IEEE=x.dtype == torch.float32)
    return out, pre, up


@fc_act.register_fake
def _(x, weight, bias, weight_up, bias_up, p0, p1, kind, lam_min, save_pre):
    shape = (x.shape[0], weight.shape[0])
    return (x.new_empty(shape), x.new_empty(shape if save_pre else 0),
            x.new_empty(shape if save_pre and weight_up is not None else 0))


@torch.library.custom_op("nanoact::act_grad", mutates_args=())
def act_grad(grad_y: torch.Tensor, weight: torch.Tensor, pre: torch.Tensor, up: torch.Tensor | None,
             p0: torch.Tensor, p1: torch.Tensor, kind: int,
             lam_min: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_pre, grad_up (empty unless gated), the MLP's hidden h, fp32 sums of t0 and t1) from grad_y [M, C] and
    c_proj's weight [C, N]."""
    M, C = grad_y.shape
    N = weight.shape[1]
    gated = up is not None
    grad_pre, h = torch.empty_like(pre), torch.empty_like(pre)
    grad_up = torch.empty_like(pre) if gated else pre.new_empty(0)
    tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)  # at least as many as any config's tiles
    partial = torch.zeros(tiles, 2, device=pre.device, dtype=torch.float32)
    with _on_device(pre):
        _matmul_act_kernel[_grid(M, N)](grad_y, weight, weight, grad_y, grad_y, pre, up if gated else pre, grad_pre,
                                        grad_up, h, partial, p0, p1, lam_min, M, N, C, grad_y.stride(0),
                                        grad_y.stride(1), weight.stride(0), weight.stride(1), KIND=kind,
                                        BACKWARD=True, GATED=gated, HAS_BIAS=False, SAVE_PRE=False,
                                        IEEE=pre.dtype == torch.float32)
    return grad_pre, grad_up, h, partial.sum(0)


@act_grad.register_fake
def _(grad_y, weight, pre, up, p0, p1, kind, lam_min):
    return (torch.empty_like(pre), torch.empty_like(pre) if up is not None else pre.new_empty(0),
            torch.empty_like(pre), pre.new_empty(2, dtype=torch.float32))


def finish(name, sums, p0, p1):
    """The activation's parameters' gradients from the tiles' sums of t0, t1 (pointwise.backward): xATLU & co.
    d alpha = sum t0; AGLU/APA d kappa = sum t0 / lam, d lam = sum t1 / lam^2, none below lam's clamp."""
    params = pointwise.PARAMS.get(name, ())
    if not params:
        return None, None
    if len(params) == 1:
        return sums[0].to(p0.dtype), None
    lam = p1.float().clamp_min(LAM_MIN)
    grad_lam = torch.where(p1.float() >= LAM_MIN, sums[1] / lam.square(), 0.0)
    return (sums[0] / lam).to(p0.dtype), grad_lam.to(p1.dtype)


class FusedMLPFunction(torch.autograd.Function):
    """c_proj(act(c_fc(x))), or gated c_proj(act(c_fc(x)) c_up(x)), for x [M, K]; saves x, the weights and the
    pre-activations only."""

    @staticmethod
    def forward(ctx, x, w_fc, b_fc, w_up, b_up, w_proj, b_proj, p0, p1, name):
        h, pre, up = fc_act(x, w_fc, b_fc, w_up, b_up, p0, p1, pointwise.KINDS[name], LAM_MIN, True)
        ctx.name, ctx.biases = name, (b_fc is not None, b_up is not None, b_proj is not None)
        ctx.save_for_backward(x, w_fc, w_up, w_proj, pre, up if w_up is not None else None, p0, p1)
        return F.linear(h, w_proj, b_proj)

    @staticmethod
    def backward(ctx, grad_y):
        x, w_fc, w_up, w_proj, pre, up, p0, p1 = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        grad_pre, grad_up, h, sums = act_grad(grad_y, w_proj, pre, up, p0, p1, pointwise.KINDS[ctx.name], LAM_MIN)
        grad_p0, grad_p1 = finish(ctx.name, sums, p0, p1)
        grad_x = grad_pre @ w_fc
        gated = None, None
        if w_up is not None:
            grad_x = torch.addmm(grad_x, grad_up, w_up)
            gated = grad_up.t() @ x, grad_up.sum(0) if ctx.biases[1] else None
        return (grad_x, grad_pre.t() @ x, grad_pre.sum(0) if ctx.biases[0] else None, *gated,
                grad_y.t() @ h, grad_y.sum(0) if ctx.biases[2] else None, grad_p0, grad_p1, None)


# ---------------------------------------------------------------- what model.py's MLP calls
def fused_kind(act):
    """(registry name of `act` for the fused path, None) or (None, why it keeps the unfused path)."""
    if type(act) in CLASSES:
        return CLASSES[type(act)], None
    if isinstance(act, APA):
        if act.kappa.dim():
            return None, "channelwise APA/AGLU parameters take the PyTorch path"
        return ("aglu" if act.gated else "apa"), None
    name = type(act).__name__
    return None, NOT_POINTWISE.get(name, f"{name} has no pointwise definition in activations/pointwise.py")


def _params(act, name, like):
    params = [getattr(act, p) for p in pointwise.PARAMS.get(name, ())]
    if not params:
        zero = like.new_zeros((), dtype=torch.float32)
        return zero, zero
    return params[0], params[-1]


def forward(mlp, x):
    """c_proj(act(c_fc(x))) (gated: c_proj(act(c_fc(x)) c_up(x))) of model.py's MLP `mlp` through the fused kernels
    when the run chose them (mlp.fused, activations/policy.py) and they apply here; else None (the caller runs the unfused MLP). Not under telemetry's
    hooks on the activation, which must see its output. Under torch.compile, one graph once this module is loaded
    (activations.load_fused_mlp(), which policy.select_fused calls before the trainers compile)."""
    glu = getattr(mlp, "glu", None)
    if not getattr(mlp, "fused", False) or mlp.act._forward_hooks or glu is not None and glu._forward_hooks:
        return None
    name, _ = fused_kind(mlp.act)
    if name is None or x.numel() == 0:
        return None
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    if dtype not in DTYPES:
        return None
    up = getattr(mlp, "c_up", None)
    up_params = (up.weight, up.bias) if up is not None else (None, None)
    cast = [t if t is None else t.to(dtype) for t in (x, mlp.c_fc.weight, mlp.c_fc.bias, *up_params,
                                                        mlp.c_proj.weight, mlp.c_proj.bias)]
    x2 = cast[0].reshape(-1, x.shape[-1])
    p0, p1 = _params(mlp.act, name, x)
    with torch.autocast(x.device.type, enabled=False):
        if torch.is_grad_enabled():
            y = FusedMLPFunction.apply(x2, *cast[1:], p0, p1, name)
        else:
            h, _, _ = fc_act(x2, *cast[1:5], p0, p1, pointwise.KINDS[name], LAM_MIN, False)
            y = F.linear(h, cast[5], cast[6])
    return y.reshape(*x.shape[:-1], y.shape[-1])
