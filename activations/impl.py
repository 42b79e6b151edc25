"""Which code runs AGLU/APA and NSwish/NReLU: the fused Triton kernels (activations/kernels.py) or PyTorch.

Every parametric activation takes impl="auto" | "triton" | "torch":
    auto    what the run decided (activations/policy.py: the kernels checked and timed in a child process on
            that GPU, the faster correct path kept; the trainers fix each module's impl to it), and for a
            module no decision reached, the kernels only where TRUSTED says so, the PyTorch path anywhere else
    triton  the kernels, unchecked, failing loudly (a CPU tensor only under Triton's interpreter, TRITON_INTERPRET=1)
    torch   the PyTorch path (autograd.Function, torch.compile fuses it)
Both give the same results to fp32 rounding (tests/test_kernels.py).

impl is a speed option, not part of a model's identity (model_identity): a checkpoint trained on either path
loads, evaluates, exports and resumes on any device, on the path that device decides.
"""
import importlib

from errors import ConfigError


NOT_LOADED = "not loaded"
kernels = NOT_LOADED  # activations/kernels.py once loaded_kernels() has run, None without Triton


def loaded_kernels():
    """activations/kernels.py, imported at its first use, or None without Triton (the PyTorch path everywhere).
    Importing Triton costs a process start-up time: a CPU run, which never takes the kernels, does not pay it. Imported
    by name so that code copied without kernels.py (an export) runs too. A plain global, so that dynamo traces a
    forward that reads it without a graph break (the activations load it when built with impl="triton", the
    policy before it trusts a kernel for impl="auto"); a test sets `kernels` to None, as without Triton."""
    global kernels
    if kernels is NOT_LOADED:
        try:
            kernels = importlib.import_module("activations.kernels")
        except ImportError:
            kernels = None
    return kernels


IMPLS = ("auto", "triton", "torch")
KERNEL_DEVICES = ("cuda",)  # device types where "auto" considers the kernels; tests add "cpu" (the interpreter)
TRUSTED = {}  # (family, device, dtype) -> use the kernel there; activations/policy.py's decisions fill it


def family(module):
    """The kernel family of a parametric activation: 'aglu', 'apa', 'nswish', 'nrelu', 'nswish/per_instance' ..."""
    return type(module).__name__.lower() + ("/per_instance" if getattr(module, "per_instance", False) else "")


def check_impl(impl):
    if impl not in IMPLS:
        raise ConfigError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "triton":
        loaded_kernels()  # now, not in a forward that dynamo traces
    return impl


def model_identity(model_config):
    """A model's config without the speed option impl (act_kwargs["impl"]): what a checkpoint's model is, and
    what a resume compares. Checkpoints written before impl left it (e.g. {"impl": "triton"}) read the same."""
    kwargs = {k: v for k, v in (model_config.get("act_kwargs") or {}).items() if k != "impl"}
    return {**model_config, "act_kwargs": kwargs} if "act_kwargs" in model_config else dict(model_config)


def use_kernels(module, x):
    """True when x goes through the Triton kernels in `module` (its .impl); a clear error when impl="triton"
    cannot run."""
    impl = module.impl
    if impl == "torch" or x.numel() == 0:
        return False
    if impl == "auto":
        if x.device.type not in KERNEL_DEVICES:
            return False
        kernels = loaded_kernels()
        if kernels is None or x.dtype not in kernels.DTYPES:
            return False
        # only a decision table: a kernel never proven on this GPU must not run in this process (a bad one leaves
        # a sticky CUDA error that no fallback survives), so proving it is policy.py's, in a child process
        return TRUSTED.get((family(module), str(x.device), x.dtype), False)
    kernels = loaded_kernels()
    if kernels is None:
        raise RuntimeError("impl='triton' needs Triton (pip install triton); use impl='auto' or 'torch'")
    if not (x.is_cuda or kernels.INTERPRETED):
        raise RuntimeError("impl='triton' on a CPU tensor runs only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported, or use impl='torch'")
    if x.dtype not in kernels.DTYPES:
        raise RuntimeError(f"the Triton kernels take float32, bfloat16 or float16, got {x.dtype}; use impl='torch'")
    return True


def model_paths(model, x):
    """{family: "triton" | "torch"}: the path each parametric activation of `model` takes for an input like x (its
    device and dtype), as use_kernels decides it: a record of how a model was run."""
    return {family(m): "triton" if use_kernels(m, x) else "torch" for m in model.modules()
            if getattr(m, "impl", None) in IMPLS}
