"""activations/kernels.py on what a training run can feed it: NaN and +-inf at every operand (input, incoming
gradient, kappa and lam, running statistics, one element of a row), constants, large means, values at each
branch of the kernels and parameters at and beyond their clamps. NaN and inf come out exactly where the fp32
PyTorch path gives them, and the finite values agree with it (the kernels' accuracy on ordinary inputs is
tests/test_kernels.py's). Runs in Triton's interpreter on the CPU (tests/conftest.py)."""
import math

import pytest
import torch

from test_kernels import DEVICE, LAM_MIN32, TOL, step

import activations  # noqa: E402 (after test_kernels, which skips without Triton or its interpreter)

NAN, INF = math.nan, math.inf


pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # numpy's, on NaN and inf


def as_torch_path(got, want, what, rtol=1e-4, atol=1e-6, any_nonfinite=False):
    """NaN and +-inf exactly where the PyTorch path has them (assert_close compares those exactly), the finite
    values within fp32's tolerance. any_nonfinite: NaN or +-inf where the PyTorch path has either (torch's
    var_mean, a Welford pass, makes the mean of [inf, 1] NaN where torch.mean and the kernels' sums make it inf)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if any_nonfinite:
        got = torch.where(~got.isfinite() & ~want.isfinite(), want, got)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def both_paths(name, x, grad, params=None, buffers=None, training=True, **kwargs):
    """[(output, grad_x, {parameter: grad}, {buffer: value})] of the kernels and the fp32 PyTorch path, from one
    forward and backward of a module with these parameter and buffer values (after step_statistics: a training
    step's running buffers)."""
    results = []
    for impl in ("triton", "torch"):
        m = activations.build(name, impl=impl, **kwargs).to(DEVICE).train(training)
        with torch.no_grad():
            for key, value in {**(params or {}), **(buffers or {})}.items():
                getattr(m, key).fill_(value)
        out, gx = step(m, x.to(DEVICE), grad.to(DEVICE))
        if training:
            activations.step_statistics(m)
        results.append((out, gx, {k: p.grad for k, p in m.named_parameters()}, dict(m.named_buffers())))
    return results


def assert_same(results, case, rtol=1e-4, atol=1e-6, param_rtol=1e-4, any_nonfinite=False):
    (out, gx, grads, buffers), (out_t, gx_t, grads_t, buffers_t) = results
    as_torch_path(out, out_t, f"{case}, output", rtol, atol, any_nonfinite)
    as_torch_path(gx, gx_t, f"{case}, input gradient", rtol, atol, any_nonfinite)
    for key, g in grads.items():
        as_torch_path(g, grads_t[key], f"{case}, {key}'s gradient", param_rtol, 1e-5, any_nonfinite)
    for key, b in buffers.items():
        if b.is_floating_point():
            as_torch_path(b, buffers_t[key], f"{case}, {key}", 1e-5, 1e-6, any_nonfinite)


# ---------------------------------------------------------------- AGLU / APA
def apa_inputs(kappa, lam):
    """z at each branch of _apa_kernel and of the PyTorch path for these parameters, where they are finite and
    kappa != 0: v = ln lam - kappa z at 0 (the kernel's where and max), at +-20 (F.softplus's switch to the
    identity); then e^-|v| subnormal and 0, eta underflowing, z subnormal, and fp32's largest; 37 values, so the
    program's lanes off the end run too. A gradient of both signs."""
    z = [0.0, 1e-40, 1e-3, 1.0, 3.0, 30.0, 88.0, 89.0, 150.0, 1e4, 1e30, 3e38]
    z = z + [-v for v in z[1:]]
    lam_c = max(lam, LAM_MIN32)
    if 0 < lam_c < INF and 0 < abs(kappa) < INF:
        z += [(math.log(lam_c) - v) / kappa for v in (0.0, 20.0, -20.0, 1e-6, -1e-6)]
    z += [0.5 * i for i in range(1, 38 - len(z))]
    grad = torch.linspace(-2, 3, len(z))
    return torch.tensor(z), grad


APA_CASES = [  # (kappa, lam, what replaces z = 0, what replaces grad[5])
    (1.0, 0.37, None, None), (-0.6, 3.0, None, None), (0.0, 0.37, None, None), (1e30, 0.5, None, None),
    (1.0, LAM_MIN32, None, None), (1.0, 5e-5, None, None), (1.0, 0.0, None, None), (1.0, -INF, None, None),
    (1.0, INF, None, None), (1.0, NAN, None, None), (NAN, 0.37, None, None),
    # kappa z is NaN at z = 0 only: without one, kappa's gradient is finite (0)
    (INF, 0.37, 2.0, None), (-INF, 0.37, 2.0, None), (INF, 0.37, None, None),
    (1.0, 0.37, NAN, None), (1.0, 0.37, INF, None), (1.0, 0.37, -INF, None), (-0.6, 0.37, INF, None),
    (1.0, 0.37, None, NAN), (1.0, 0.37, None, INF)]


@pytest.mark.parametrize("name", ["aglu", "apa"])
def test_apa_nonfinite_and_clamps_as_torch_path(name):
    """Parameters at and beyond lam's clamp (at it, below: no gradient, 0, -inf, inf, NaN), kappa 0, huge,
    +-inf, NaN; a NaN or +-inf input or incoming gradient; z at every branch threshold."""
    for kappa, lam, z_bad, grad_bad in APA_CASES:
        z, grad = apa_inputs(kappa, lam)
        if z_bad is not None:
            z[0] = z_bad
        if grad_bad is not None:
            grad[5] = grad_bad
        results = both_paths(name, z, grad, params={"kappa": kappa, "lam": lam},
                             kappa_init=1.0, lam_init=1.0)
        # lam's gradient: the PyTorch path's fp32 loses ~0.5% at the clamp (kernels.py); finite sums of 1e30s
        assert_same(results, f"kappa {kappa}, lam {lam}, z {z_bad}, grad {grad_bad}", 1e-3, 1e-5, param_rtol=1e-2)


# ---------------------------------------------------------------- NSwish / NReLU
def act_inputs(shape, seed=0):
    """N(0, 1) draws with x at the kernels' branches: 0, -0, subnormal, exp2(-x log2 e) overflowing fp32 (SiLU's
    sigma(x) = 0 below -88.7) and SiLU underflowing to 0; a gradient of both signs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x.view(-1)[1:9] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, -88.0, -89.0, -104.0, -200.0])
    return x, torch.randn(shape, generator=g)


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_batch_nonfinite_as_torch_path(name):
    """Training: a NaN or +-inf element (first of its statistics block or not) or incoming gradient, on the step
    that initialises the running buffers and on a later one: outputs, gradients and the buffers after
    step_statistics, so a NaN that reaches a buffer also reaches the step's loss (training/loop.py's check).
    Evaluation with non-finite or zero running buffers."""
    x, grad = act_inputs((3, 41))
    for first_step in (True, False):
        buffers = None if first_step else {"num_batches_tracked": 1}
        for at, value, in_grad in [(5, NAN, False), (5, INF, False), (5, -INF, False), (0, INF, False),
                                   (0, NAN, False), (5, NAN, True), (5, -INF, True)]:
            xb, gb = x.clone(), grad.clone()
            (gb if in_grad else xb).view(-1)[at] = value
            results = both_paths(name, xb, gb, buffers=buffers)
            case = f"first step {first_step}, x or grad[{at}] = {value}, in grad {in_grad}"
            assert_same(results, case, any_nonfinite=value == INF and not in_grad)
            out, _, _, after = results[0]
            if not all(after[f"running_{k}"].isfinite() for k in ("mu", "rho", "rho_prime")):
                assert not out.isfinite().all(), case  # the loss the trainer checks is not finite either
    positive = grad.abs() + 0.1  # the scale's gradient sum(grad (y - mu)) is -inf at mu = inf, not NaN
    for buffers in [{"running_mu": INF}, {"running_mu": NAN}, {"running_mu": -INF}, {"running_rho": NAN},
                    {"running_rho": 0.0}, {"running_rho_prime": INF}]:
        assert_same(both_paths(name, x, positive, buffers=buffers, training=False), f"evaluation, {buffers}")


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_constant_batch_gradient_as_torch_path(name):
    """A constant batch (two statistics blocks) has Var = 0 exactly, rho = eps, so the input gradient is the
    PyTorch path's (with Var ~1e-14 instead, rho was an arbitrary ratio and the gradient 100x too small)."""
    for value in (0.7, 3.0, -2.0, 1e-3):
        x = torch.full((2, 2100), value)
        assert_same(both_paths(name, x, act_inputs((2, 2100))[1]), f"constant {value}")


def test_anact_large_mean_within_fp32_tolerance():
    """x = 100 + 0.5 N(0, 1): in evaluation with running_mu = 100, outputs and input gradients against the float64
    PyTorch path (the forward's scale y - scale mu was 13x the tolerance, in the interpreter); in training over two
    statistics blocks, against the fp32 PyTorch path (both round the batch's mean to fp32 as anact.py keeps it)."""
    x, grad = act_inputs((2, 2100))
    x = 100 + 0.5 * x.clamp(-5, 5)
    results = []
    for impl, dtype in (("triton", torch.float32), ("torch", torch.float64)):
        m = activations.build("nswish", impl=impl).to(DEVICE).to(dtype).eval()
        with torch.no_grad():
            m.running_mu.fill_(100.0), m.running_rho.fill_(0.5)
        results.append(step(m, x.to(DEVICE, dtype), grad.to(DEVICE, dtype)))
    for got, want in zip(*results):
        torch.testing.assert_close(got.double(), want, **TOL[torch.float32])
    assert_same(both_paths("nswish", x, grad), "training, mean 100")


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_per_instance_rows_far_from_zero(name):
    """Rows of 1000 + N(0, 1), 100 + N(0, 1) and 1 + 1e-6 N(0, 1): outputs and input gradients against the float64
    PyTorch path, within fp32's tolerance (the fp32 PyTorch path's outputs are 2-23x outside it, its row mean
    rounded to fp32; the kernels' were 7-73x). 1 + 1e-6 N's gradient is left out: its y spans a few ulps, so
    Var[y], rho and the scale are set by how each y rounds, on either path (~0.4% of the scale)."""
    x, grad = act_inputs((3, 300))
    x = torch.stack([1000 + x[0], 100 + x[1], 1 + 1e-6 * x[2]])
    outputs = []
    for impl, dtype in (("triton", torch.float32), ("torch", torch.float64)):
        m = activations.build(name, impl=impl, per_instance=True).to(DEVICE).to(dtype)
        outputs.append(step(m, x.to(DEVICE, dtype), grad.to(DEVICE, dtype)))
    (out, gx), (out64, gx64) = outputs
    torch.testing.assert_close(out.double(), out64, **TOL[torch.float32])
    torch.testing.assert_close(gx.double()[:2], gx64[:2], **TOL[torch.float32])


def rows_input(special_rows, seed=0):
    """act_inputs rows of 37, then one row per entry: a number fills its row, a (position, value) pair goes
    into an N(0, 1) row."""
    x, grad = act_inputs((3 + len(special_rows), 37), seed)
    for row, special in enumerate(special_rows, start=3):
        if isinstance(special, tuple):
            x[row, special[0]] = special[1]
        else:
            x[row] = special
    return x, grad


@pytest.mark.parametrize("name", ["nswish", "nrelu"])
def test_anact_per_instance_rows_as_torch_path(name):
    """Constant rows (Var = 0: rho = eps, as in the PyTorch path; 1e30 too), then rows with NaN or +-inf (first or
    not) and rows holding +-1e30 (the variance overflows: NaN, not a finite scale), apart, as they make alpha's
    gradient NaN."""
    x, grad = rows_input([0.7, 3.0, -2.0, 0.0, 1e-3, 1e30])
    assert_same(both_paths(name, x, grad, per_instance=True), "finite rows")
    x, grad = rows_input([(5, NAN), (0, NAN), (5, INF), (0, INF), (5, -INF), (0, -INF), (5, 1e30), 1e30])
    x[-1, ::2] *= -1
    assert_same(both_paths(name, x, grad, per_instance=True), "non-finite rows")


def test_anact_large_fp16_values_within_fp16_tolerance():
    """fp16 inputs in the hundreds (rows of 100 N(0, 1) and 300 + 10 N(0, 1), the scale a long run's
    pre-activations reach), NSwish and NReLU: a training step, then evaluation on the running buffers, and the
    per-instance rows; outputs and input gradients against the float64 PyTorch path within fp16's tolerance
    (selfcheck.TOLERANCE), as the fp16 PyTorch path is."""
    from activations.selfcheck import TOLERANCE
    x, grad = act_inputs((2, 150))
    x = torch.stack([100 * x[0], 300 + 10 * x[1]]).half()
    for name, per_instance in (("nswish", False), ("nrelu", False), ("nswish", True)):
        kern = activations.build(name, impl="triton", per_instance=per_instance).to(DEVICE)
        ref = activations.build(name, impl="torch", per_instance=per_instance).to(DEVICE).double()
        for training in (True, False) if not per_instance else (True,):
            out, gx = step(kern.train(training), x.to(DEVICE), grad.half().to(DEVICE))
            out64, gx64 = step(ref.train(training), x.double().to(DEVICE), grad.double().to(DEVICE))
            activations.step_statistics(kern), activations.step_statistics(ref)
            case = f"{name}, per_instance {per_instance}, training {training}"
            for got, want in ((out, out64), (gx, gx64)):
                torch.testing.assert_close(got.double(), want, **dict(zip(("rtol", "atol"), TOLERANCE[torch.float16])),
                                           msg=case)
