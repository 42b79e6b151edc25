"""What deciding the activation kernels' path costs a run's start (activations/policy.py's select): with an empty
verdict cache (a child process per kernel family proves and times the kernel), with the verdicts cached (a second
run, another seed, another rank), and with a recorded decision (a resume, a sweep's later seed).

    python bench/kernel_decision.py                  # CPU: the kernels in Triton's interpreter, at 64x256
    python bench/kernel_decision.py --device cuda    # a GPU: the GPT-2 124M MLP shape, compiled, bfloat16

On the CPU the interpreter stands in for the GPU (the trainers never consider the kernels there: this script lets
"auto" take CPU tensors, as the tests do), so the cold figure is mostly the fork server's start-up (torch's
import, once per run) and the interpreter.
"""
import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TRITON_INTERPRET", "0" if any("cuda" in a for a in sys.argv) else "1")  # before triton loads

import torch  # noqa: E402

import activations  # noqa: E402
from activations import impl, policy  # noqa: E402
from training.hardware import detect  # noqa: E402


def timed(families, shape, platform, device, dtype, compiled, cache, recorded=None):
    model = torch.nn.Sequential(*[activations.build(name) for name in families]).to(device)
    t0 = time.perf_counter()
    decisions = policy.select(model, shape, platform, device, dtype, compiled, cache=cache, recorded=recorded)
    return time.perf_counter() - t0, decisions


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--families", default="aglu,nswish", help="comma-separated parametric activations")
    args = p.parse_args(argv)
    if impl.loaded_kernels() is None:
        raise SystemExit("Triton is not installed: there are no kernels to decide about")
    cuda = args.device == "cuda"
    shape, dtype = ((65536, 3072), torch.bfloat16) if cuda else ((64, 256), torch.float32)
    if not cuda:
        impl.KERNEL_DEVICES = ("cuda", "cpu")
    platform = detect(args.device)
    families = [f for f in args.families.split(",") if f]
    with tempfile.TemporaryDirectory() as cache:
        cold, decisions = timed(families, shape, platform, args.device, dtype, cuda, cache)  # starts the fork server
        warm, _ = timed(families, shape, platform, args.device, dtype, cuda, cache)
        recorded, _ = timed(families, shape, platform, args.device, dtype, cuda, cache, recorded=decisions)
    t0 = time.perf_counter()
    policy.run_child(int, (), policy.PROBE_TIMEOUT)  # a child that does nothing: what a family's child costs before
    fork = time.perf_counter() - t0                  # its work, once the fork server runs
    print(f"{platform.name}, {', '.join(families)} at {shape[0]}x{shape[1]} {str(dtype)[6:]}: empty cache {cold:.2f} s "
          f"({cold / len(families):.2f} s per family, the fork server's start included; a child doing nothing "
          f"{fork:.2f} s), cached verdicts "
          f"{warm * 1e3:.1f} ms, recorded decision {recorded * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
