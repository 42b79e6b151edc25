"""The fp32 error the GPU's approximate instructions add to the AGLU/APA kernel (activations/kernels.py), against
float64 autograd, in units of the fp32 tolerance (activations/selfcheck.py's: rtol 1e-4, atol 1e-6; 1.0 fails).

    python bench/kernel_fast_math.py                 # every MUFU result off by up to its documented worst error
    python bench/kernel_fast_math.py --lg2-ulps 2    # what a fast log2 of lam (MUFU.LG2) would add

Triton's interpreter, where tests/test_kernels.py runs the kernels, computes exp2 and the reciprocal exactly
(numpy). On a GPU each is one MUFU instruction: ex2.approx.ftz 2 ulp, rcp.approx.ftz 1 ulp (PTX ISA). This replays
the kernel's fp32 arithmetic step by step in torch, each approximate result multiplied by 1 + u, u uniform within
its bound, over the self-check's inputs (|z| up to 30 and 3 N(0, 1)) at 200,000 points and its (kappa, lam).
"""
import argparse

import torch

from activations.aglu import LAM_MIN
from activations.selfcheck import APA_PROBES, PARAM_TOLERANCE, TOLERANCE, _probe_input

F32, F64 = torch.float32, torch.float64
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453
Q = (0.6666663994135407, 0.400076258368243, 0.2823504097984134, 0.2686102275126062)  # kernels.py's Q0..Q3


def off(x, ulps, generator):
    """x times 1 + u, |u| <= ulps fp32 ulps (2^-23 relative), rounded back to fp32."""
    u = (torch.rand(x.shape, generator=generator, dtype=F64) * 2 - 1) * ulps * 2.0 ** -23
    return (x.double() * (1 + u)).float()


def kernel(z, g, kappa, lam_in, ex2, rcp, lg2):
    """_apa_kernel's arithmetic (gated), forward and backward, in fp32, and kernels.apa_backward's sums:
    (out, grad_z, d kappa, d lam)."""
    lam = torch.tensor(max(lam_in, LAM_MIN), dtype=F32)  # lam_min as kernels.apa gets it (a Python float)
    kappa = torch.tensor(kappa, dtype=F32)
    inv_lam = rcp(1 / lam)
    v2 = lg2(torch.log2(lam)) - (kappa * LOG2E) * z
    e = ex2(torch.exp2(-v2.abs()))
    s = e * rcp(1 / (2 + e))
    t = s * s
    q = Q[0] + t * (Q[1] + t * (Q[2] + t * Q[3]))
    softplus = v2.clamp_min(0) * LN2 + s * (2 + t * q)
    eta = ex2(torch.exp2(softplus * (-LOG2E * inv_lam)))
    ge = g * eta
    w = ge * z
    sigmoid = torch.where(v2 >= 0, 1.0, e) * rcp(1 / (1 + e))
    ws = w * sigmoid
    d = torch.where(v2 >= 0, softplus - sigmoid, s * (sigmoid + t * q))
    grad_lam = (w * d).double().sum() / lam.double() ** 2 if lam_in >= LAM_MIN else torch.zeros((), dtype=F64)
    return z * eta, ge + ws * (kappa * inv_lam), (ws * z).double().sum() * inv_lam, grad_lam


def reference(z, g, kappa, lam):
    """tests/test_kernels.py's float64 autograd of the stable form."""
    z = z.double().requires_grad_()
    k, lam = (torch.tensor(p, dtype=F64, requires_grad=True) for p in (kappa, lam))
    v = torch.log(lam.clamp_min(LAM_MIN)) - k * z
    out = z * torch.exp(-torch.logaddexp(v, torch.zeros_like(v)) / lam.clamp_min(LAM_MIN))
    out.backward(g.double())
    return out.detach(), z.grad, k.grad, lam.grad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ex2-ulps", type=float, default=2.0)
    p.add_argument("--rcp-ulps", type=float, default=1.0)
    p.add_argument("--lg2-ulps", type=float, default=0.0, help="error of log2(lam), all of it (one value per "
                   "program); the kernel's is precise")
    p.add_argument("--points", type=int, default=200_000)
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    ex2, rcp = (lambda x, u=u: off(x, u, gen) for u in (args.ex2_ulps, args.rcp_ulps))
    lg2 = lambda x: (x.double() * (1 + args.lg2_ulps * 2.0 ** -23)).float()  # noqa: E731 - one scalar: all of it
    z, g = (t.flatten() for t in _probe_input((args.points,), F32, "cpu", seed=0))
    rtol, atol = TOLERANCE[F32]
    print(f"worst |error| / (atol + rtol |float64|), fp32, ex2 {args.ex2_ulps:g} ulp, rcp {args.rcp_ulps:g} ulp, "
          f"log2 lam {args.lg2_ulps:g} ulp, {args.points} points")
    for kappa, lam in APA_PROBES:
        got, want = kernel(z, g, kappa, lam, ex2, rcp, lg2), reference(z, g, kappa, lam)
        tolerances = [(rtol, atol)] * 2 + [PARAM_TOLERANCE] * 2
        cells = [f"{name} {((a.double() - b).abs() / (at + rt * b.abs())).max().item():.3f}"
                 for name, a, b, (rt, at) in zip(("out", "grad_z", "d kappa", "d lam"), got, want, tolerances)]
        print(f"kappa {kappa:g}, lam {lam:.6g}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
