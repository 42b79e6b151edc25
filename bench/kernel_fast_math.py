"""The fp32 error the GPU's approximate instructions add to the AGLU/APA and NSwish kernels (activations/kernels.py),
against float64, in units of the fp32 tolerance (activations/selfcheck.py's: rtol 1e-4, atol 1e-6; parameter
gradients 1e-4, 1e-5; 1.0 fails).

    python bench/kernel_fast_math.py                 # exact, random and worst-case approximate results
    python bench/kernel_fast_math.py --lg2-ulps 2    # what a fast log2 of lam (MUFU.LG2) would add to AGLU

Triton's interpreter, where tests/test_kernels.py runs the kernels, rounds exp2, reciprocals, divisions and square
roots correctly (numpy). On a GPU they are approximate: ex2.approx.ftz 2 ulp, rcp.approx.ftz 1 ulp, div.full.f32
2 ulp (PTX ISA), sqrt.approx.ftz 3 ulp (the OpenCL bound NVIDIA gives for it), subnormal results flushed to 0.
This replays each kernel's fp32 arithmetic step by step in torch (FMAs where the compiled code has them), each
approximate result times 1 + u, in three columns:

    exact    u = 0: fp32's own rounding, what the interpreter tests see
    random   u uniform within the instruction's bound, a function of its input (as the hardware's error is)
    worst    u at + or - the bound, one sign per instruction in the code for all elements: the largest error over
             every combination of signs (all errors one way, and every mix)

on the self-check's inputs (AGLU: |z| up to 30 and 3 N(0, 1), 200,000 points, at its (kappa, lam); NSwish: its rows
and batches) and on edge inputs: z where v = ln lam - kappa z is 0 (the kernel's branch), +-1e-6 and +-20 about it
(F.softplus's switch), e^-v subnormal and eta underflowing; x at 0, subnormal and where SiLU's exp2 overflows;
constant rows, rows far from 0, a batch of mean 100 (tests/test_kernel_edges.py's inputs).
"""
import argparse
import itertools
import math
import zlib

import torch

from activations.aglu import LAM_MIN
from activations.selfcheck import APA_PROBES, PARAM_TOLERANCE, TOLERANCE, _probe_input

F32, F64 = torch.float32, torch.float64
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453
Q = (0.6666663994135407, 0.400076258368243, 0.2823504097984134, 0.2686102275126062)  # kernels.py's Q0..Q3
TINY, EPS = torch.finfo(F32).tiny, 1e-5  # anact.py's floor for Var[x], the modules' default eps
FTZ = ("ex2", "rcp", "sqrt")  # the .ftz instructions: subnormal results become 0


class Approx:
    """approx(site, exact fp32 result, kind): the result as the GPU's instruction `kind` may return it, in `mode`
    (the columns above). `signs` maps each site (one instruction in the code) to the sign of its worst-case error;
    `sites` collects the sites a replay used."""

    def __init__(self, ulps, mode, signs=None):
        self.ulps, self.mode, self.signs, self.sites = ulps, mode, signs or {}, []

    def __call__(self, site, x, kind):
        bound = self.ulps[kind] * 2.0 ** -23
        if bound and site not in self.sites:
            self.sites.append(site)
        if self.mode == "exact" or bound == 0:
            u = 0.0
        elif self.mode == "random":  # a hash of x's bits: equal inputs get equal errors, as on the hardware
            bits = x.view(torch.int32).to(torch.int64)
            u = (((bits * 2654435761 + zlib.crc32(site.encode())) % 2**32).double() / 2**31 - 1) * bound
        else:
            u = self.signs.get(site, 1) * bound
        out = (x.double() * (1 + u)).float()
        return torch.where(out.abs() < TINY, 0.0, out) if kind in FTZ else out


def fma(a, b, c):
    """a b + c as the GPU's FFMA rounds it: the product exact in float64, the sum rounded to float64 and then fp32
    (a double rounding, rarely an ulp apart from one)."""
    return (a.double() * b.double() + c.double()).float()


def worst_over_signs(replay, errors, ulps):
    """The largest of errors(replay(approx)) over every combination of error signs of the replay's sites."""
    probe = Approx(ulps, "worst")
    replay(probe)
    worst = None
    for signs in itertools.product((1, -1), repeat=len(probe.sites)):
        e = errors(replay(Approx(ulps, "worst", dict(zip(probe.sites, signs)))))
        worst = e if worst is None else [max(a, b) for a, b in zip(worst, e)]
    return worst


def columns(replay, errors, ulps):
    """[(exact, random, worst)] per quantity."""
    exact = errors(replay(Approx(ulps, "exact")))
    random = errors(replay(Approx(ulps, "random")))
    return list(zip(exact, random, worst_over_signs(replay, errors, ulps)))


def ratio(got, want, rtol, atol):
    """Worst |got - want| / (atol + rtol |want|) over the finite values of want."""
    got, want = got.double(), want.double()
    finite = want.isfinite()
    return ((got - want).abs() / (atol + rtol * want.abs()))[finite].max().item()


# ---------------------------------------------------------------- AGLU
def apa_replay(z, g, kappa, lam_in):
    """_apa_kernel's arithmetic (gated), forward and backward, in fp32, and kernels.apa_backward's sums:
    approx -> (out, grad_z, d kappa, d lam)."""
    def replay(approx):
        lam = torch.tensor(max(lam_in, LAM_MIN), dtype=F32)  # lam_min as kernels.apa gets it (a Python float)
        k = torch.tensor(kappa, dtype=F32)
        inv_lam = approx("rcp 1/lam", 1 / lam, "rcp")
        v2 = approx("lg2 lam", torch.log2(lam), "lg2") - (k * LOG2E) * z
        e = approx("ex2 e", torch.exp2(-v2.abs()), "ex2")
        s = e * approx("rcp s", 1 / (2 + e), "rcp")
        t = s * s
        q = Q[0] + t * (Q[1] + t * (Q[2] + t * Q[3]))
        softplus = v2.clamp_min(0) * LN2 + s * (2 + t * q)
        eta = approx("ex2 eta", torch.exp2(softplus * (-LOG2E * inv_lam)), "ex2")
        ge = g * eta
        w = ge * z
        sigmoid = torch.where(v2 >= 0, 1.0, e) * approx("rcp sigmoid", 1 / (1 + e), "rcp")
        ws = w * sigmoid
        d = torch.where(v2 >= 0, softplus - sigmoid, s * (sigmoid + t * q))
        grad_lam = (w * d).double().sum() / lam.double() ** 2 if lam_in >= LAM_MIN else torch.zeros((), dtype=F64)
        return z * eta, fma(ws, k * inv_lam, ge), (ws * z).double().sum() * inv_lam, grad_lam
    return replay


def apa_reference(z, g, kappa, lam):
    """tests/test_kernels.py's float64 autograd of the stable form."""
    z = z.double().requires_grad_()
    k, lam = (torch.tensor(p, dtype=F64, requires_grad=True) for p in (kappa, lam))
    v = torch.log(lam.clamp_min(LAM_MIN)) - k * z
    out = z * torch.exp(-torch.logaddexp(v, torch.zeros_like(v)) / lam.clamp_min(LAM_MIN))
    out.backward(g.double())
    return out.detach(), z.grad, k.grad, lam.grad


def apa_edges(kappa, lam):
    """z at _apa_kernel's branches for (kappa, lam) (tests/test_kernel_edges.py's apa_inputs), and a gradient."""
    v0 = math.log(max(lam, LAM_MIN))
    z = [(v0 - v) / kappa for v in (0.0, 1e-6, -1e-6, 1e-3, -1e-3, 20.0, -20.0, 87.0, -87.0, 100.0, -100.0)]
    z += [0.0, 1e-40, -1e-40, 88.0, -88.0, 89.0, -89.0, 150.0, -150.0, 1e4, -1e4]
    z = torch.tensor(z, dtype=F32)
    return z, torch.linspace(-2, 3, len(z), dtype=F32)


# ---------------------------------------------------------------- NSwish
def silu(x, approx):
    """_act(x, SWISH): (sigma(x), y, act'(x)), sigma from one ex2 and one rcp."""
    s = approx("rcp sigma", 1 / (1 + approx("ex2 sigma", torch.exp2(x * -LOG2E), "ex2")), "rcp")
    y = x * s
    return s, y, fma(y, 1 - s, s)


def anact_replay(x, g, scale, mu):
    """_anact_kernel, forward (x sigma(x) - mu fused) and backward, at the fp32 scale and mu it is given:
    approx -> (out, grad_x, d scale)."""
    scale, mu = torch.tensor(scale, dtype=F32), torch.tensor(mu, dtype=F32)

    def replay(approx):
        s, y, d = silu(x, approx)
        return scale * fma(x, s, -mu), (g * scale) * d, (g * (y - mu)).double().sum()
    return replay


def rows_replay(x, g, adj):
    """_anact_rows_kernel over each row of x, forward and backward: approx -> (out, grad_x, d adj). Sums in float64
    (a block's tree of fp32 sums rounds less than a sequential one, more than this)."""
    adj = torch.tensor(adj, dtype=F32)

    def replay(approx):
        _, y, d = silu(x, approx)
        xs, ys = x - x[:, :1], y - y[:, :1]  # y[:, :1] is act(x0): the same instructions, the same errors
        inv = approx("div 1/n", 1 / torch.tensor(x.shape[1], dtype=F32), "div")

        def row_sum(t):
            return t.double().sum(1, keepdim=True).float()
        dy, dx = fma(-row_sum(ys), inv, ys), fma(-row_sum(xs), inv, xs)
        var_y, var_x = row_sum(dy * dy) * inv, (row_sum(dx * dx) * inv).clamp_min(TINY)
        rho = approx("div rho", var_y / var_x, "div").clamp_min(EPS)
        rho_prime = (row_sum(d * d) * inv).clamp_min(EPS)
        lam_n2 = approx("div lam_n^2", (rho + rho_prime) / (2 * rho * rho_prime), "div")
        scale = approx("sqrt lam_n", lam_n2.sqrt(), "sqrt") + adj
        return scale * dy, (g * scale) * d, (g * dy).double().sum()
    return replay


def anact_reference(x, g, scale=None, mu=None, adj=0.0):
    """The float64 PyTorch path's formulas (anact.py): with scale and mu given (batch), or per row of x."""
    x, g = x.double(), g.double()
    s = torch.sigmoid(x)
    y, d = x * s, s * (1 + x * (1 - s))
    if scale is None:
        mu = y.mean(1, keepdim=True)
        rho = (y.var(1, correction=0, keepdim=True) / x.var(1, correction=0, keepdim=True).clamp_min(TINY))
        rho, rho_prime = rho.clamp_min(EPS), d.square().mean(1, keepdim=True).clamp_min(EPS)
        scale = ((rho + rho_prime) / (2 * rho * rho_prime)).sqrt() + adj
    return scale * (y - mu), g * scale * d, (g * (y - mu)).sum()


def batch_statistics(x):
    """(scale, mu) of a first training step on batch x, in fp32 as kernels.anact gets them (rho, rho' floored)."""
    x = x.double()
    s = torch.sigmoid(x)
    y, d = x * s, s * (1 + x * (1 - s))
    rho = max((y.var(correction=0) / x.var(correction=0).clamp_min(TINY)).item(), EPS)
    rho_prime = max(d.square().mean().item(), EPS)
    scale = float(torch.tensor(math.sqrt((rho + rho_prime) / (2 * rho * rho_prime)), dtype=F32))
    return scale, float(torch.tensor(y.mean().item(), dtype=F32))


def nswish_cases(points):
    """(label, replay, reference) of the NSwish kernels on the self-check's inputs and on edge inputs."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    # the self-check's 12 rows of 301 (each scaled and shifted by its own factor), drawn again with other seeds
    drawn = [_probe_input((12, 301), F32, "cpu", seed=seed, spread=3.0) for seed in range(max(points // 3612, 1))]
    rows = torch.linspace(0.1, 4, 12, dtype=F64).reshape(-1, 1)
    x = torch.cat([(x.double() * rows + rows - 1).float() for x, _ in drawn])
    g = torch.cat([g for _, g in drawn])
    cases.append(("rows, self-check", rows_replay(x, g, 0.1), anact_reference(x, g, adj=0.1)))
    n, ge = torch.randn(6, 301, generator=gen), torch.randn(6, 301, generator=gen)
    edge = torch.stack([torch.full((301,), 0.7), torch.full((301,), 3.0), torch.full((301,), -2.0),
                        1000 + n[0], 100 + n[1], n[2]])
    edge[-1, :8] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, -88.0, -89.0, -104.0, -200.0])
    cases.append(("rows, constant, mean 1000 and 100, thresholds", rows_replay(edge, ge, 0.1),
                  anact_reference(edge, ge, adj=0.1)))
    # the self-check's batches: its second step's scale and shift of its inputs, drawn again with other seeds
    xb = torch.cat([1.3 * _probe_input((7, 601), F32, "cpu", seed=s, spread=3.0)[0].flatten() + 0.2
                    for s in range(max(points // 4207, 1))])
    for label, xb in [("batch, self-check", xb), ("batch, mean 100", 100 + 0.5 * n.flatten())]:
        gb = torch.randn(xb.shape, generator=gen)
        scale, mu = batch_statistics(xb) if label.endswith("self-check") else (1.4, 100.0)
        cases.append((label, anact_replay(xb, gb, scale, mu), anact_reference(xb, gb, scale, mu)))
    return cases


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ex2-ulps", type=float, default=2.0)
    p.add_argument("--rcp-ulps", type=float, default=1.0)
    p.add_argument("--div-ulps", type=float, default=2.0)
    p.add_argument("--sqrt-ulps", type=float, default=3.0)
    p.add_argument("--lg2-ulps", type=float, default=0.0, help="error of log2(lam), all of it (one value per "
                   "program); the kernel's is precise")
    p.add_argument("--points", type=int, default=200_000)
    args = p.parse_args(argv)
    ulps = {"ex2": args.ex2_ulps, "rcp": args.rcp_ulps, "div": args.div_ulps, "sqrt": args.sqrt_ulps,
            "lg2": args.lg2_ulps}
    rtol, atol = TOLERANCE[F32]
    print(f"worst |error| / (atol + rtol |float64|), fp32, exact / random / worst signs; ex2 {args.ex2_ulps:g} ulp, "
          f"rcp {args.rcp_ulps:g}, div {args.div_ulps:g}, sqrt {args.sqrt_ulps:g}, log2 lam {args.lg2_ulps:g}")
    z, g = (t.flatten() for t in _probe_input((args.points,), F32, "cpu", seed=0))
    tolerances = [(rtol, atol)] * 2 + [PARAM_TOLERANCE] * 2
    for kappa, lam in APA_PROBES:
        for inputs, (zi, gi) in (("self-check", (z, g)), ("edges", apa_edges(kappa, lam))):
            want = apa_reference(zi, gi, kappa, lam)
            cells = columns(apa_replay(zi, gi, kappa, lam),
                            lambda got: [ratio(a, b, *t) for a, b, t in zip(got, want, tolerances)], ulps)
            print(f"aglu kappa {kappa:g}, lam {lam:.6g}, {inputs}: " + ", ".join(
                f"{name} {' / '.join(f'{c:.3f}' for c in cell)}"
                for name, cell in zip(("out", "grad_z", "d kappa", "d lam"), cells)))
    for label, replay, want in nswish_cases(args.points):
        cells = columns(replay, lambda got: [ratio(a, b, *t) for a, b, t in
                                             zip(got, want, [(rtol, atol)] * 2 + [PARAM_TOLERANCE])], ulps)
        print(f"nswish {label}: " + ", ".join(f"{name} {' / '.join(f'{c:.3f}' for c in cell)}"
                                            for name, cell in zip(("out", "grad_x", "d scale"), cells)))


if __name__ == "__main__":
    main()
