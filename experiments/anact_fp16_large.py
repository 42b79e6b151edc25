"""NSwish/NReLU on fp16 inputs in the hundreds: the Triton kernels (Triton's interpreter on the CPU) and the fp32
PyTorch path against the float64 PyTorch path, in units of fp16's tolerance (activations/selfcheck.py's: rtol 2e-3,
atol 1e-5; 1.0 fails). fp32 modules fed fp16 activations, as under autocast: three training steps (the running
buffers updated by step_statistics after each), then one evaluation step on the buffers; per_instance rows train only.

    python experiments/anact_fp16_large.py                        # every input, shape and mode (~10 CPU-min)
    python experiments/anact_fp16_large.py --shapes 3x300 --inputs 1000+N

Worst |error| / (atol + rtol |float64|) over the outputs and over the input gradients of each (path, mode); the
findings are in BENCHMARKS.md, "The activation fused into the MLP's matmuls".
"""
import argparse
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import: the kernels run on the CPU

import torch  # noqa: E402

import activations  # noqa: E402
from activations.selfcheck import TOLERANCE  # noqa: E402

RTOL, ATOL = TOLERANCE[torch.float16]
# a large common offset with a small spread, a large spread, per-row offsets (a channel's mean), mostly negative
INPUTS = {
    "300+N": lambda n, rows: 300 + n(),
    "1000+N": lambda n, rows: 1000 + n(),
    "300+10N": lambda n, rows: 300 + 10 * n(),
    "500+100N": lambda n, rows: 500 + 100 * n(),
    "100N": lambda n, rows: 100 * n(),
    "300r+N": lambda n, rows: 300 * rows() + n(),
    "200+100r+N": lambda n, rows: 200 + 100 * rows() + n(),
    "-50+20N": lambda n, rows: -50 + 20 * n(),
    "20+5N": lambda n, rows: 20 + 5 * n(),
}
# tests/test_kernel_edges.py's shapes, the self-check's, and one of 16 statistics blocks
SHAPES = ["3x41", "2x2100", "3x300", "2x150", "7x601", "64x1024"]


def ratio(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs() / (ATOL + RTOL * want.abs())).max().item()


def step(m, x, grad):
    xg = x.clone().requires_grad_()
    out = m(xg)
    out.backward(grad)
    return out.detach(), xg.grad


def worst(name, per_instance, shape, make, steps=3, seed=0):
    """{(path, mode): (output ratio, input-gradient ratio)}, the worst over the steps."""
    gen = torch.Generator().manual_seed(seed)
    n = lambda: torch.randn(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    rows = lambda: torch.randn(shape[:-1] + (1,), generator=gen, dtype=torch.float64)  # noqa: E731
    paths = {p: activations.build(name, impl=p, per_instance=per_instance) for p in ("triton", "torch")}
    ref = activations.build(name, impl="torch", per_instance=per_instance).double()
    found = {}
    for i in range(steps + (0 if per_instance else 1)):
        training = i < steps
        x, grad = make(n, rows).half(), torch.randn(shape, generator=gen).half()
        out64, gx64 = step(ref.train(training), x.double(), grad.double())
        for path, m in paths.items():
            out, gx = step(m.train(training), x, grad)
            key = (path, "train" if training else "eval")
            old = found.get(key, (0.0, 0.0))
            found[key] = max(old[0], ratio(out, out64)), max(old[1], ratio(gx, gx64))
        if training:
            for m in (*paths.values(), ref):
                activations.step_statistics(m)
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated ROWSxCOLS")
    p.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated, of {', '.join(INPUTS)}")
    args = p.parse_args(argv)
    print("worst |error| / fp16 tolerance vs float64: output, input gradient; kernel | PyTorch path")
    for name in ("nswish", "nrelu"):
        for per_instance in (False, True):
            for shape in args.shapes.split(","):
                for label in args.inputs.split(","):
                    found = worst(name, per_instance, tuple(map(int, shape.split("x"))), INPUTS[label])
                    for mode in ("train", "eval"):
                        if ("triton", mode) in found:
                            (ko, kg), (to, tg) = found[("triton", mode)], found[("torch", mode)]
                            print(f"{name} {'rows' if per_instance else 'batch'} {mode:5} {shape:8} {label:11} "
                                  f"kernel {ko:5.2f} {kg:5.2f} | torch {to:5.2f} {tg:5.2f}", flush=True)


if __name__ == "__main__":
    main()
