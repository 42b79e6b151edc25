"""Which code runs AGLU/APA and NSwish/NReLU: the fused Triton kernels (activations/kernels.py) or PyTorch.

Every parametric activation takes impl="auto" | "triton" | "torch":
    auto    the kernels for CUDA tensors once they pass their self-check on that GPU (activations/selfcheck.py;
            the trainers also time them there and keep the faster path), the PyTorch path anywhere else
    triton  the kernels, unchecked, failing loudly (a CPU tensor only under Triton's interpreter, TRITON_INTERPRET=1)
    torch   the PyTorch path (autograd.Function, torch.compile fuses it)
Both give the same results to fp32 rounding (tests/test_kernels.py).
"""
import importlib

try:  # Triton is optional; imported by name so that code copied without kernels.py (an export) runs too
    kernels = importlib.import_module("activations.kernels")
except ImportError:  # no Triton: the PyTorch path everywhere
    kernels = None

IMPLS = ("auto", "triton", "torch")
KERNEL_DEVICES = ("cuda",)  # device types where "auto" considers the kernels; tests add "cpu" (the interpreter)


def check_impl(impl):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


def use_kernels(module, x):
    """True when x goes through the Triton kernels in `module` (its .impl); a clear error when impl="triton"
    cannot run."""
    impl = module.impl
    if impl == "torch" or x.numel() == 0:
        return False
    if impl == "auto":
        if kernels is None or x.device.type not in KERNEL_DEVICES or x.dtype not in kernels.DTYPES:
            return False
        from activations import selfcheck  # not at the top: selfcheck builds activations, which import this module
        return selfcheck.trusted(module, x)
    if kernels is None:
        raise RuntimeError("impl='triton' needs Triton (pip install triton); use impl='auto' or 'torch'")
    if not (x.is_cuda or kernels.INTERPRETED):
        raise RuntimeError("impl='triton' on a CPU tensor runs only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported, or use impl='torch'")
    if x.dtype not in kernels.DTYPES:
        raise RuntimeError(f"the Triton kernels take float32, bfloat16 or float16, got {x.dtype}; use impl='torch'")
    return True
