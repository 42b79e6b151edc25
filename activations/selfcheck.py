"""The Triton kernels prove themselves on the GPU they run on before impl="auto" uses them.

Nobody who wrote activations/kernels.py had a GPU: the first one they meet is a user's, at the start of a
long run. What a proof runs (activations/policy.py runs it in a child process and decides):

    check(family, device, dtype)   runs the kernel beside the PyTorch path on a probe (random values, |z| up
                                   to 30, lam at its clamp, NSwish's tracked statistics) and compares outputs,
                                   input and parameter gradients and running buffers with the float64 PyTorch
                                   path. An exception (Triton/ptxas error, driver mismatch, unsupported GPU) or
                                   a value outside the dtype's tolerance is the reason not to use the kernel.
    time_paths(module, shape, ...) the kernel and PyTorch paths at the run's full MLP shape, compiled as the
                                   run compiles: outputs and input gradients compared, then forward + backward
                                   timed.
    probe(family, state, ...)      both, as the child process's work (its module rebuilt from its state).

impl="triton" is never checked: it asks for the kernels and fails loudly when they do not run.
"""
import copy
import statistics
import time

import torch

import activations
from activations.aglu import APA, LAM_MIN
from activations.anact import _NormalizedActivation
from activations import impl

# The tolerance of tests/test_kernels.py: fp32 rounding, or one ulp of a 16-bit output (the interpreter
# truncates to bf16 where a GPU rounds). Parameter gradients are fp32 sums in every case.
TOLERANCE = {torch.float32: (1e-4, 1e-6), torch.bfloat16: (1e-2, 1e-5), torch.float16: (2e-3, 1e-5)}
PARAM_TOLERANCE = (1e-4, 1e-5)
PROBE_SHAPE = (5, 517)  # odd: not a multiple of any block size, so the masked tails run too
# (kappa, lam): lam just above its clamp (where fp32 cancellation hides, kernels.py), below it (no gradient),
# typical values. Just above, not at: LAM_MIN rounds below itself in fp32, and the float64 reference would clamp it.
APA_PROBES = [(1.0, LAM_MIN * 1.000001), (1.2, 1e-6), (0.9, 0.37), (-0.6, 3.0)]
ANACT_PROBES = [(1.0, 0.0), (1.3, 0.2), (1.0, -4.0)]  # (scale, shift) of 3 steps: init, update, out-of-bounds batch


class ProbeMismatch(Exception):
    pass


def family(module):
    """The kernel family a module runs (impl.family), or None when it never takes the kernels (channelwise
    APA/AGLU, or not a parametric activation)."""
    if isinstance(module, APA) and module.kappa.dim() == 0 or isinstance(module, _NormalizedActivation):
        return impl.family(module)
    return None


def build(name, path):
    base, _, variant = name.partition("/")
    return activations.build(base, impl=path, **({"per_instance": True} if variant else {}))


def _probe_input(shape, dtype, device, seed, spread=30.0):
    """|z| up to `spread` (a linspace) plus 3 N(0,1), and a gradient; drawn on the CPU from their own
    generator, so the check leaves every RNG stream of the run untouched."""
    g = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel()
    z = torch.cat([torch.linspace(-spread, spread, n // 4, dtype=torch.float64),
                   3 * torch.randn(n - n // 4, generator=g, dtype=torch.float64)])
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    return z.reshape(shape).to(dtype).to(device), grad.reshape(shape).to(dtype).to(device)


def _compare(what, got, want, rtol, atol):
    got = got.detach().double().cpu()
    want = want.detach().double().cpu()
    if got.shape != want.shape:
        raise ProbeMismatch(f"{what}: shape {tuple(got.shape)}, PyTorch path {tuple(want.shape)}")
    bad = ~((got - want).abs() <= atol + rtol * want.abs())  # NaN where PyTorch is finite counts as bad
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise ProbeMismatch(f"{what} differs from the PyTorch path at {int(bad.sum())} of {bad.numel()} "
                            f"values (e.g. {got.flatten()[i].item():.6g} vs {want.flatten()[i].item():.6g}; "
                            f"rtol {rtol:g}, atol {atol:g})")


def _step(module, x, grad):
    xg = x.clone().requires_grad_()
    out = module(xg)
    out.backward(grad)
    return out, xg.grad


def _pair(name, device, **state):
    """(kernel module, float64 PyTorch-path module) with the same parameters."""
    kern = build(name, "triton").to(device)
    ref = build(name, "torch").to(device).double()
    with torch.no_grad():
        for key, value in state.items():
            getattr(kern, key).fill_(value)
        ref.load_state_dict(kern.state_dict())
    return kern, ref


def _check_pair(kern, ref, x, grad, rtol, atol, label):
    out, gx = _step(kern, x, grad)
    out64, gx64 = _step(ref, x.double(), grad.double())
    _compare(f"{label} output", out, out64, rtol, atol)
    _compare(f"{label} input gradient", gx, gx64, rtol, atol)
    if out.dtype != x.dtype or gx.dtype != x.dtype:
        raise ProbeMismatch(f"{label}: output {out.dtype}, gradient {gx.dtype} for a {x.dtype} input")


def check(name, device, dtype):
    """Raise (ProbeMismatch, or whatever the kernel raised) unless kernel family `name` matches the float64
    PyTorch path on `device` in `dtype`: output, input gradient, parameter gradients, running statistics."""
    device = torch.device(device)
    rtol, atol = TOLERANCE[dtype]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        if name in ("aglu", "apa"):
            for i, (kappa, lam) in enumerate(APA_PROBES):
                kern, ref = _pair(name, device, kappa=kappa, lam=lam)
                x, grad = _probe_input(PROBE_SHAPE, dtype, device, seed=i)
                label = f"kappa {kappa:g}, lam {lam:g}:"
                _check_pair(kern, ref, x, grad, rtol, atol, label)
                for p in ("kappa", "lam"):
                    _compare(f"{label} {p} gradient", getattr(kern, p).grad, getattr(ref, p).grad, *PARAM_TOLERANCE)
            return
        kern, ref = _pair(name, device, alpha=0.4)
        if name.endswith("/per_instance"):
            x, grad = _probe_input((4, 3, 301), dtype, device, seed=0, spread=3.0)
            rows = torch.linspace(0.1, 4, 12, dtype=torch.float64).reshape(4, 3, 1).to(device)
            _check_pair(kern, ref, (x.double() * rows + rows - 1).to(dtype), grad, rtol, atol, "rows:")
        else:
            for i, (scale, shift) in enumerate(ANACT_PROBES):
                x, grad = _probe_input((7, 601), dtype, device, seed=i, spread=3.0)
                _check_pair(kern, ref, (scale * x.double() + shift).to(dtype), grad, rtol, atol, f"step {i}:")
                activations.step_statistics(kern), activations.step_statistics(ref)
                for (key, b), b64 in zip(kern.named_buffers(), ref.buffers()):
                    _compare(f"step {i}: running {key}", b, b64, 1e-5, 1e-6)
            kern.eval(), ref.eval()
            x, grad = _probe_input((3, 601), dtype, device, seed=7, spread=3.0)
            _check_pair(kern, ref, x, grad, rtol, atol, "evaluation:")
        _compare("alpha gradient", kern.alpha.grad, ref.alpha.grad, *PARAM_TOLERANCE)


def failure(name, device, dtype):
    """check() as a one-line reason, or None when the kernel passed."""
    try:
        check(name, device, dtype)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel (Triton, ptxas, driver) means "do not use it"
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no message'}"[:400]
    return None


def device_name(device):
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_paths(module, shape, device, dtype, compiled, reps=10, warmup=3):
    """Median ms of forward + backward (input and parameter gradients) of `module` through the kernel and the
    PyTorch path at `shape`, interleaved so that drift hits both, compiled as the run will be (mode default:
    the activation has no matmul for max-autotune to tune). The first call's output and input gradient of the
    two paths are compared first: a kernel that passed check() small may still index out of bounds at the
    run's size. Returns {"triton": ms, "torch": ms}."""
    device = torch.device(device)
    rtol, atol = TOLERANCE[dtype]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(shape, device=device, dtype=dtype)
        steps = {}
        for path in ("triton", "torch"):
            m = copy.deepcopy(module).to(device)
            m.impl = path
            fn = torch.compile(m, dynamic=False) if compiled else m

            def step(fn=fn, params=list(m.parameters())):
                out = fn(x)
                return out, torch.autograd.grad(out, [x, *params], grad)[0]
            steps[path] = step
        first = {path: step() for path, step in steps.items()}
        # both paths carry their own rounding here (check() compares with float64): twice the tolerance
        for what, i in (("output", 0), ("input gradient", 1)):
            _compare(f"{shape[0]}x{shape[1]} {what}", first["triton"][i], first["torch"][i], 2 * rtol, 2 * atol)
        del first
        return _median_ms(steps, device, warmup, reps)


def probe(name, state, shape, device, dtype, compiled):
    """What activations/policy.py's child process runs for kernel family `name`: check() on the probe, then
    the full-size comparison and timing of time_paths on the run's module (its state_dict as lists). Raises
    on any failure."""
    check(name, device, dtype)
    module = build(name, "auto")
    module.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    return time_paths(module, shape, device, dtype, compiled)


def blocker(platform):
    """Why "auto" cannot use the kernels on this platform at all (training/hardware.py), or None."""
    if platform.device_type not in impl.KERNEL_DEVICES:
        return f"not a CUDA device ({platform.device_type})"
    if platform.capability is not None and platform.capability < (7, 0):
        return f"{platform.name} is {platform.sm}; Triton needs compute capability 7.0 or newer"
    # the platform's own Triton (a described GPU has one or not), then whether our kernels import on this machine
    if platform.triton is None or impl.loaded_kernels() is None:
        return "Triton is not installed"
    return None


# ---------------------------------------------------------------- the fused MLP (activations/fused_mlp.py)
class MLP(torch.nn.Module):
    """model.py's MLP, c_proj(act(c_fc(x))) or gated c_proj(act(c_fc(x)) c_up(x)), fused where .fused is set (as
    model.py's MLP.forward does)."""

    def __init__(self, act, d_model, width, gated=False):
        super().__init__()
        self.c_fc, self.act, self.c_proj = torch.nn.Linear(d_model, width), act, torch.nn.Linear(width, d_model)
        self.c_up = torch.nn.Linear(d_model, width) if gated else None
        self.fused = False

    def forward(self, x):
        y = activations.load_fused_mlp().forward(self, x) if self.fused else None
        if y is not None:
            return y
        h = self.act(self.c_fc(x))
        return self.c_proj(h if self.c_up is None else h * self.c_up(x))


def _mlp_step(mlp, x, grad):
    mlp.zero_grad()
    xg = x.clone().requires_grad_()
    out = mlp(xg)
    out.backward(grad)
    return [out, xg.grad, *(p.grad for p in mlp.parameters())]


def check_fused(name, device, dtype, state=None):
    """Raise (ProbeMismatch or the kernel's error) unless the fused MLP of `name` (an MLP setting: aglu, swiglu,
    aglu_glu; the activation's parameters from
    `state`) is within the dtype's tolerance of float64, beyond the unfused MLP's own error: output, input gradient,
    every parameter's gradient (max |error| / max |value|)."""
    device = torch.device(device)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        torch.manual_seed(0)
        act_name, gated = activations.mlp_activation(name)
        mlp = MLP(activations.build(act_name), 64, 200, gated)  # 200: the tiles' edges masked
        if state:
            mlp.act.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
        ref = copy.deepcopy(mlp).double().to(device)
        mlp = mlp.to(device, dtype)
        x, grad = _probe_input((37, 64), dtype, device, seed=0, spread=3.0)
        want = _mlp_step(ref, x.double(), grad.double())
        unfused = _mlp_step(mlp, x, grad)
        mlp.fused = True
        fused = _mlp_step(mlp, x, grad)
        for i, (f, u, w) in enumerate(zip(fused, unfused, want)):
            scale = w.abs().max().item() or 1.0
            err_f, err_u = ((t.double() - w).abs().max().item() / scale for t in (f, u))
            if not err_f <= err_u + tolerance:  # NaN fails too
                raise ProbeMismatch(f"fused MLP, tensor {i} (output, input gradient, parameters' gradients): "
                                    f"error {err_f:.3g} of its largest value, unfused {err_u:.3g}")


def probe_fused(name, state, shape, device, dtype, compiled, reps=10, warmup=3):
    """What activations/policy.py's child runs for the fused MLP of `name` ('mlp/aglu', 'mlp/silu_glu'): the
    check, then forward + backward of the unfused MLP (the activation on the path `state["impl"]` that policy
    chose) and of the fused one at the run's (rows, width) and d_model, compiled as the run compiles, interleaved.
    Returns {"triton": fused ms, "torch": unfused ms}."""
    setting = name.partition("/")[2]
    act_name, gated = activations.mlp_activation(setting)
    device = torch.device(device)
    check_fused(setting, device, dtype, state["act"])
    act = activations.build(act_name)
    act.load_state_dict({k: torch.tensor(v) for k, v in state["act"].items()})
    if state.get("impl") and hasattr(act, "impl"):
        act.impl = state["impl"]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        x = torch.randn(shape[0], state["d_model"], device=device, dtype=dtype)
        grad = torch.randn_like(x)
        steps = {}
        for path in ("triton", "torch"):
            mlp = MLP(copy.deepcopy(act), state["d_model"], shape[1], gated).to(device, dtype)
            mlp.fused = path == "triton"
            fn = torch.compile(mlp, dynamic=False) if compiled else mlp

            def step(fn=fn, params=list(mlp.parameters())):
                xg = x.requires_grad_()
                return torch.autograd.grad(fn(xg), [xg, *params], grad)
            steps[path] = step
        return _median_ms(steps, device, warmup, reps)


def _median_ms(steps, device, warmup, reps):
    """{path: median milliseconds} of each step, the paths interleaved round by round (one drift, all paths)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {path: [] for path in steps}
    for _ in range(reps):
        for path, step in steps.items():
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times[path].append(1e3 * (time.perf_counter() - t0))
    return {path: statistics.median(t) for path, t in times.items()}
