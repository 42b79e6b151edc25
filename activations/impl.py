"""Which code runs AGLU/APA and NSwish/NReLU: the fused Triton kernels (activations/kernels.py) or PyTorch.

Every parametric activation takes impl="auto" | "triton" | "torch":
    auto    the kernels for CUDA tensors once they pass their self-check on that GPU (activations/selfcheck.py;
            the trainers also time them there and keep the faster path), the PyTorch path anywhere else
    triton  the kernels, unchecked, failing loudly (a CPU tensor only under Triton's interpreter, TRITON_INTERPRET=1)
    torch   the PyTorch path (autograd.Function, torch.compile fuses it)
Both give the same results to fp32 rounding (tests/test_kernels.py).
"""
import importlib

import torch

from errors import ConfigError

try:  # Triton is optional; imported by name so that code copied without kernels.py (an export) runs too
    kernels = importlib.import_module("activations.kernels")
except ImportError:  # no Triton: the PyTorch path everywhere
    kernels = None

IMPLS = ("auto", "triton", "torch")
KERNEL_DEVICES = ("cuda",)  # device types where "auto" considers the kernels; tests add "cpu" (the interpreter)
TRUSTED = {}  # (family, device, dtype) -> the kernel passed its self-check there; activations/selfcheck.py fills it


def family(module):
    """The kernel family of a parametric activation: 'aglu', 'apa', 'nswish', 'nrelu', 'nswish/per_instance' ..."""
    return type(module).__name__.lower() + ("/per_instance" if getattr(module, "per_instance", False) else "")


def check_impl(impl):
    if impl not in IMPLS:
        raise ConfigError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
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
        key = (family(module), str(x.device), x.dtype)
        if key in TRUSTED or torch.compiler.is_compiling():  # no check inside a graph: PyTorch unless checked before
            return TRUSTED.get(key, False)
        # by name, not `from activations import selfcheck` (it builds activations, which import this module), and
        # so that an export's remote code, which has no selfcheck.py and no kernels, does not need it
        return importlib.import_module("activations.selfcheck").trusted(module, key)
    if kernels is None:
        raise RuntimeError("impl='triton' needs Triton (pip install triton); use impl='auto' or 'torch'")
    if not (x.is_cuda or kernels.INTERPRETED):
        raise RuntimeError("impl='triton' on a CPU tensor runs only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported, or use impl='torch'")
    if x.dtype not in kernels.DTYPES:
        raise RuntimeError(f"the Triton kernels take float32, bfloat16 or float16, got {x.dtype}; use impl='torch'")
    return True
