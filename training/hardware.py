"""What this machine can run, and the choices a run takes from it: precision (--dtype) and torch.compile (--compile).

nanoGPT's answer to a GPU without bf16 or without Triton is "edit the config by hand"; here `auto` looks at the
device and says, in one line each, what it chose and why. The Platform is plain data, so tests simulate a V100
(no bf16), a P100 (compute capability 6.0) or a Mac (no Triton) on the CPU.
"""
import dataclasses
import importlib.util
from dataclasses import dataclass

import torch

from training.config import ConfigError

MIN_TRITON_CAPABILITY = (7, 0)  # Triton (inductor's GPU code and our kernels) generates code for sm_70 and newer


@dataclass(frozen=True)
class Platform:
    device_type: str  # cuda, mps, cpu
    name: str  # "NVIDIA H100 80GB HBM3", or the device type
    capability: tuple = None  # CUDA compute capability (major, minor)
    bf16: bool = False  # bf16 autocast runs natively (Ampere and newer; not V100, T4, RTX 20xx)
    triton: str = None  # Triton's version when it imports
    inductor: bool = None  # torch.compile's default backend is usable (dynamo supports this Python/OS); None: not asked

    @property
    def sm(self):
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else self.device_type


def triton_version():
    """Triton's version when it imports, else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton
    except ImportError:  # installed but broken (a driver/ABI mismatch): as good as missing
        return None
    return triton.__version__


def detect(device):
    """The Platform of torch device `device` (a string or torch.device)."""
    device = torch.device(device)
    triton = triton_version()
    if device.type == "cuda":
        return Platform("cuda", torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device),
                        torch.cuda.is_bf16_supported(including_emulation=False), triton)
    return Platform(device.type, device.type, None, device.type == "cpu", triton)


PRECISION_CHOICES = ("auto", "bfloat16", "float16", "float32")


def choose_precision(requested, p):
    """(precision, why): bfloat16 autocast on CUDA GPUs that have it (the anchor recipe), float16 autocast with a
    GradScaler on those that do not, float32 elsewhere or when asked."""
    if requested not in PRECISION_CHOICES:
        raise ConfigError(f"unknown dtype {requested!r}; choose {', '.join(PRECISION_CHOICES)}")
    if requested == "auto":
        if p.device_type != "cuda":
            return "float32", f"auto: float32 on {p.device_type} (autocast pays off on CUDA)"
        if p.bf16:
            return "bfloat16", f"auto: bfloat16 autocast, {p.name} ({p.sm}) has bf16"
        return "float16", (f"auto: float16 autocast + GradScaler, {p.name} ({p.sm}) has no bf16; "
                           "--dtype float32 for no loss scaling")
    if requested == "bfloat16" and p.device_type == "cuda" and not p.bf16:
        raise ConfigError(f"--dtype bfloat16: {p.name} ({p.sm}) has no bf16; use --dtype float16 (with a "
                          "GradScaler) or --dtype float32")
    if requested == "float16" and p.device_type not in ("cuda", "cpu"):
        raise ConfigError(f"--dtype float16 needs a CUDA or CPU device, not {p.device_type}; use float32")
    return requested, f"--dtype {requested}" + (" (autocast + GradScaler)" if requested == "float16" else "")


def inductor_usable(p):
    """p.inductor, or torch's own answer when detect() left it unasked: asking imports dynamo (~1 CPU-s), which
    only a process that may compile pays (an evaluation or an eager CPU run starts that much faster)."""
    if p.inductor is not None:
        return p.inductor
    return importlib.util.find_spec("torch._inductor") is not None and torch._dynamo.is_dynamo_supported()


def compile_blocker(p):
    """Why torch.compile cannot run on this platform, or None when it can."""
    if not inductor_usable(p):
        return "torch.compile (dynamo/inductor) does not support this Python or OS"
    if p.device_type == "cuda":
        if p.triton is None:
            return "Triton is not installed (inductor generates Triton code on CUDA)"
        if p.capability < MIN_TRITON_CAPABILITY:
            return f"{p.name} is {p.sm}; Triton needs compute capability 7.0 or newer"
    return None


def choose_compile(requested, p):
    """(compile, why). None (auto): on for CUDA GPUs where inductor's Triton code runs, off elsewhere.
    --compile on a platform that cannot compile is a one-line error, not a crash deep inside inductor."""
    if requested is None:
        if p.device_type != "cuda":
            return False, f"auto: eager on {p.device_type} (--compile to compile anyway)"
        blocker = compile_blocker(p)
        if blocker:
            return False, f"auto: eager PyTorch, {blocker}"
        return True, f"auto: torch.compile, {p.name} ({p.sm}), Triton {p.triton}"
    if requested and (blocker := compile_blocker(p)):
        raise ConfigError(f"--compile: {blocker}; use --no-compile")
    return bool(requested), "--compile" if requested else "--no-compile"


def decide(run, dist_info):
    """A run's platform, precision and compile choices (run = RunConfig): one line each on rank 0 of a CUDA run
    (the CPU defaults are in the run's first line already), and a record for run.json."""
    p = detect(dist_info.device)
    precision, precision_why = choose_precision(run.dtype, p)
    use_compile, compile_why = choose_compile(run.compile, p)
    if dist_info.master and p.device_type == "cuda":
        print(f"precision: {precision} ({precision_why})\ncompile: {'on' if use_compile else 'off'} ({compile_why})",
              flush=True)
    record = {"platform": dataclasses.asdict(p), "precision": {"value": precision, "reason": precision_why},
              "compile": {"value": use_compile, "reason": compile_why,
                          "mode": run.compile_mode if use_compile else None}}
    return p, precision, use_compile, record
