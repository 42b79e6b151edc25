"""Each fixed or scalar-parametric activation of the registry as one Triton-jit pointwise definition: its value and
its derivative, the one code that the fused MLP kernels (activations/fused_mlp.py) and activations/kernels.py's
elementwise kernels share, so the two cannot drift (AGLU/APA's math is kernels.py's _apa_forward/_apa_backward,
SiLU's and ReLU's its _act).

    forward(x, p0, p1, lam_min, KIND)       act(x), fp32
    backward(x, g, p0, p1, lam_min, KIND)   (act(x), g act'(x), t0, t1): the scalar parameters' gradients are
                                            finish(KIND, sum t0, sum t1, p0, p1) (fused_mlp.py sums them)

KIND numbers the registry names in KINDS; p0, p1 are the activation's 0-dim parameters (PARAMS), ignored by the
parameter-free ones. The formulas follow the PyTorch modules' autograd (activations/basic.py, expanded.py, aglu.py)
term for term, so NaN and inf come out where theirs do: e.g. xATLU's x atan'(x) at x = inf is inf * 0 = NaN there
too. NSwish/NReLU normalise with statistics over the batch: not pointwise, they keep kernels.py's passes. PolyReLU
and PolyNorm (polycom.py) are left to the compiler.
"""
import math

import torch
import triton
import triton.language as tl

from activations.kernels import BLOCK, LOG2E, NAN, _act, _apa_backward, _apa_forward, _block, _on_device, _rcp

KINDS = {"gelu": 0, "gelu_exact": 1, "relu": 2, "relu2": 3, "leaky_relu2": 4, "silu": 5, "swish": 5, "mish": 6,
         "xatlu": 7, "xgelu": 8, "xsilu": 9, "apa": 10, "aglu": 11}
PARAMS = {"xatlu": ("alpha",), "xgelu": ("alpha",), "xsilu": ("alpha",), "apa": ("kappa", "lam"),
          "aglu": ("kappa", "lam")}
GELU_C = tl.constexpr(math.sqrt(2 / math.pi))
GELU_A = tl.constexpr(0.044715)
INV_SQRT2, INV_SQRT_2PI = tl.constexpr(1 / math.sqrt(2)), tl.constexpr(1 / math.sqrt(2 * math.pi))
INV_PI, PI_2, PI_4 = tl.constexpr(1 / math.pi), tl.constexpr(math.pi / 2), tl.constexpr(math.pi / 4)
TAN_3PI_8, TAN_PI_8 = tl.constexpr(2.414213562373095), tl.constexpr(0.4142135623730950)


@triton.jit
def _tanh(u):
    """tanh(u) = 1 - 2 / (1 + e^{2u}): +-1 at +-inf, NaN at NaN (libdevice's tanh is not in the interpreter)."""
    return 1.0 - 2.0 * _rcp(1.0 + tl.exp2(u * (2.0 * LOG2E)))


@triton.jit
def _atan(x):
    """atan(x) by Cephes' atanf reduction (|x| to [0, tan(pi/8)]) and odd polynomial, ~1e-7 relative."""
    a = tl.abs(x)
    big = a > TAN_3PI_8
    mid = a > TAN_PI_8
    r = tl.where(big, -_rcp(a), tl.where(mid, (a - 1.0) * _rcp(a + 1.0), a))
    base = tl.where(big, PI_2, tl.where(mid, PI_4, 0.0))
    z = r * r
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * r + r
    out = base + p
    return tl.where(x < 0, -out, out)


@triton.jit
def _gate(x, KIND: tl.constexpr):
    """(g, g') of the expanded gates (activations/expanded.py): atan / pi + 1/2, Phi, sigmoid."""
    if KIND == 7:
        return _atan(x) * INV_PI + 0.5, _rcp(1.0 + x * x) * INV_PI
    elif KIND == 8:
        return 0.5 * (1.0 + tl.math.erf(x * INV_SQRT2)), tl.exp2(x * x * (-0.5 * LOG2E)) * INV_SQRT_2PI
    else:
        s = _rcp(1.0 + tl.exp2(x * -LOG2E))
        return s, s * (1.0 - s)


@triton.jit
def _mish_tsp(x):
    """tanh(softplus(x)) = n / (n + 2), n = e^x (e^x + 2); 1 above 20, where n overflows (F.mish: the same)."""
    ex = tl.exp2(x * LOG2E)
    n = ex * (ex + 2.0)
    return tl.where(x > 20.0, 1.0, n * _rcp(n + 2.0))


@triton.jit
def forward(x, p0, p1, lam_min, KIND: tl.constexpr):
    """act(x) in fp32 for the registry activation KIND (KINDS), parameters p0, p1 (PARAMS)."""
    if KIND == 0:
        return 0.5 * x * (1.0 + _tanh((x + x * x * x * GELU_A) * GELU_C))
    elif KIND == 1:
        return 0.5 * x * (1.0 + tl.math.erf(x * INV_SQRT2))
    elif KIND == 2:
        return tl.maximum(x, 0.0, propagate_nan=NAN)
    elif KIND == 3:
        r = tl.maximum(x, 0.0, propagate_nan=NAN)
        return r * r
    elif KIND == 4:
        r = tl.where(x > 0, x, 0.5 * x)
        return r * r
    elif KIND == 5:
        y, _ = _act(x, True)
        return y
    elif KIND == 6:
        return x * _mish_tsp(x)
    elif KIND <= 9:
        g, _ = _gate(x, KIND)
        return x * ((1.0 + 2.0 * p0) * g - p0)
    else:
        lam = tl.maximum(p1, lam_min, propagate_nan=NAN)
        return _apa_forward(x, p0, lam, _rcp(lam), KIND == 11)


@triton.jit
def backward(x, g, p0, p1, lam_min, KIND: tl.constexpr):
    """(act(x), g act'(x), t0, t1) in fp32: the parameters' gradients are finish() of the sums of t0 and t1."""
    zero = tl.zeros_like(x)
    if KIND == 0:
        u = (x + x * x * x * GELU_A) * GELU_C
        th = _tanh(u)
        du = (1.0 + x * x * (3.0 * GELU_A)) * GELU_C
        return 0.5 * x * (1.0 + th), g * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du), zero, zero
    elif KIND == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(x * INV_SQRT2))
        pdf = tl.exp2(x * x * (-0.5 * LOG2E)) * INV_SQRT_2PI
        return x * cdf, g * (cdf + x * pdf), zero, zero
    elif KIND == 2:  # F.relu's gradient is where(relu(x) <= 0, 0, g): 0 there even for a NaN or inf g
        y = tl.maximum(x, 0.0, propagate_nan=NAN)
        return y, tl.where(y <= 0, 0.0, g), zero, zero
    elif KIND == 3:
        r = tl.maximum(x, 0.0, propagate_nan=NAN)
        return r * r, tl.where(r <= 0, 0.0, g * (2.0 * r)), zero, zero
    elif KIND == 4:
        r = tl.where(x > 0, x, 0.5 * x)
        return r * r, g * (2.0 * r) * tl.where(x > 0, 1.0, 0.5), zero, zero
    elif KIND == 5:
        y, d = _act(x, True)
        return y, g * d, zero, zero
    elif KIND == 6:
        tsp = _mish_tsp(x)
        s = _rcp(1.0 + tl.exp2(x * -LOG2E))
        return x * tsp, g * (tsp + x * s * (1.0 - tsp * tsp)), zero, zero
    elif KIND <= 9:
        gate, dgate = _gate(x, KIND)
        scale = 1.0 + 2.0 * p0
        expanded = scale * gate - p0
        return x * expanded, g * expanded + g * x * scale * dgate, g * x * (2.0 * gate - 1.0), zero
    else:
        lam = tl.maximum(p1, lam_min, propagate_nan=NAN)
        return _apa_backward(x, g, p0, lam, _rcp(lam), KIND == 11)


@triton.jit
def _elementwise_kernel(x_ptr, grad_ptr, out_ptr, partial_ptr, p0_ptr, p1_ptr, n, lam_min,
                        KIND: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """The elementwise kernel of KIND: out = act(x), or out = grad act'(x) and partial[pid] = (sum t0, sum t1)."""
    pid = tl.program_id(0)
    start, mask = _block(n, BLOCK)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
    p0 = tl.load(p0_ptr).to(tl.float32)
    p1 = tl.load(p1_ptr).to(tl.float32)
    if not BACKWARD:
        tl.store(out_ptr + start + offs, forward(x, p0, p1, lam_min, KIND).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        g = tl.load(grad_ptr + start + offs, mask=mask, other=0.0).to(tl.float32)
        _, grad_x, t0, t1 = backward(x, g, p0, p1, lam_min, KIND)
        tl.store(out_ptr + start + offs, grad_x.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_ptr + 2 * pid, tl.sum(tl.where(mask, t0, 0.0), axis=0))
        tl.store(partial_ptr + 2 * pid + 1, tl.sum(tl.where(mask, t1, 0.0), axis=0))


def elementwise(x, grad, name, p0, p1, lam_min):
    """(act(x), grad_x, fp32 sums of t0 and t1) of registry activation `name` through the elementwise kernel, the
    same pointwise definition as the fused MLP's epilogues (fused_mlp.finish turns the sums into the parameters'
    gradients)."""
    x, grad = x.contiguous(), grad.contiguous()
    out, grad_x = torch.empty_like(x), torch.empty_like(x)
    blocks = triton.cdiv(x.numel(), BLOCK)
    partial = torch.empty(blocks, 2, device=x.device, dtype=torch.float32)
    with _on_device(x):
        for backward_pass, result in ((False, out), (True, grad_x)):
            _elementwise_kernel[(blocks,)](x, grad, result, partial, p0, p1, x.numel(), lam_min, KIND=KINDS[name],
                                           BACKWARD=backward_pass, BLOCK=BLOCK)
    return out, grad_x, partial.sum(0)
