"""What this machine can run, and the choices a run takes from it: precision (--dtype) and torch.compile (--compile).

nanoGPT's answer to a GPU without bf16 or without Triton is "edit the config by hand"; here `auto` looks at the
device and says, in one line each, what it chose and why. The Platform is plain data, so tests simulate a V100
(no bf16), a P100 (compute capability 6.0) or a Mac (no Triton) on the CPU.
"""
import ctypes
import dataclasses
import importlib.metadata
import importlib.util
from dataclasses import dataclass, replace

import torch

from errors import DistributedError
from training.config import ConfigError

MIN_TRITON_CAPABILITY = (7, 0)  # Triton (inductor's GPU code and our kernels) generates code for sm_70 and newer


@dataclass(frozen=True)
class Platform:
    device_type: str  # cuda, mps, cpu
    name: str  # the device's name as torch reports it, or the device type
    capability: tuple = None  # CUDA compute capability (major, minor)
    bf16: bool = False  # bf16 autocast runs natively (Ampere and newer; not V100, T4, RTX 20xx)
    triton: str = None  # Triton's version when it imports
    inductor: bool = None  # torch.compile's default backend is usable (dynamo supports this Python/OS); None: not asked

    @property
    def sm(self):
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else self.device_type


def triton_version(imports=True):
    """Triton's version when it is installed and (imports) imports, else None. Without the import (a record; a
    platform that never runs Triton code, such as a CPU's) the package's metadata: the import is slow."""
    if importlib.util.find_spec("triton") is None:
        return None
    if not imports:
        try:
            return importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:  # a triton another distribution installs (pytorch-triton)
            pass
    try:
        import triton
    except ImportError:  # installed but broken (a driver/ABI mismatch): as good as missing
        return None
    return triton.__version__


def detect(device):
    """The Platform of torch device `device` (a string or torch.device)."""
    device = torch.device(device)
    triton = triton_version(imports=device.type == "cuda")
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
    """p.inductor, or torch's own answer when detect() left it unasked: asking imports dynamo (slow), which
    only a process that may compile pays (an evaluation or an eager CPU run starts faster)."""
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


# The CUDA builds of torch that docs/install.md names, newest first: {index tag: (its CUDA, the oldest driver that
# runs it as (driver, its CUDA), the GPU architectures it has code for)}. A CUDA 12.x build runs on any CUDA 12 driver
# (minor-version compatibility), a 13.x one needs a CUDA 13 driver; 13.0 dropped Maxwell, Pascal and Volta. The
# architectures are torch's own table for x86_64 (torch.cuda.PYTORCH_RELEASES_CODE_CC, which torch 2.11 lacks).
CUDA_BUILDS = {"cu130": ((13, 0), (580, (13, 0)), (75, 80, 86, 90, 100, 120)),
               "cu126": ((12, 6), (525, (12, 0)), (50, 60, 70, 75, 80, 86, 90))}
CUDA_INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True)
class CudaStack:
    """What must agree before a CUDA run: the NVIDIA driver, torch's build and the GPUs."""
    torch_version: str  # "2.13.0+cu130"
    wheel_cuda: tuple = None  # the CUDA torch was built for, (13, 0); None: a CPU (or ROCm) build
    driver_cuda: tuple = None  # the newest CUDA the driver runs, (12, 4) for a 550 driver; None: no NVIDIA driver
    gpus: tuple = ()  # (name, (major, minor)) of each GPU this process sees
    arch_list: tuple = ()  # torch.cuda.get_arch_list(): the code the build carries ("sm_90", "compute_120")


def dotted(version):
    return ".".join(map(str, version))


def read_cuda_stack():
    """This machine's CudaStack. The driver and the GPUs are asked of the driver itself (libcuda), which answers
    also when torch's build is too new for it, and which makes no CUDA context (torchrun's ranks have not picked
    their GPU yet)."""
    wheel = tuple(int(v) for v in torch.version.cuda.split(".")[:2]) if torch.version.cuda else None
    stack = CudaStack(torch.__version__, wheel)
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return stack  # no NVIDIA driver
    version, count = ctypes.c_int(), ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or libcuda.cuInit(0) != 0 or \
            libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return stack  # a driver without a usable GPU: nothing for a CUDA run to check
    gpus = []
    for index in range(count.value):
        device, major, minor, name = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(100)
        libcuda.cuDeviceGet(ctypes.byref(device), index)
        libcuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        libcuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # ..._MINOR
        libcuda.cuDeviceGetName(name, len(name), device)
        gpus.append((name.value.decode(), (major.value, minor.value)))
    driver = (version.value // 1000, version.value % 1000 // 10)
    # get_arch_list is empty when torch cannot use the driver, and then the driver is what the check names
    arch = tuple(torch.cuda.get_arch_list()) if wheel and driver[0] >= wheel[0] else ()
    return replace(stack, driver_cuda=driver, gpus=tuple(gpus), arch_list=arch)


def code_runs_on(arch, capability):
    """Whether code for `arch` ("sm_80", "compute_90", "sm_90a") runs on a GPU of `capability`: a cubin on its own
    major version at the same or a higher minor (an "a" one on its own architecture only), PTX on any GPU as new."""
    kind, number = arch.split("_")
    code = int(number.rstrip("af"))
    device = 10 * capability[0] + capability[1]
    if kind == "compute":
        return device >= code
    if number.endswith("a"):
        return device == code
    return device // 10 == code // 10 and device >= code


def builds_for(gpus):
    """[(tag, (driver, its CUDA))] of the CUDA builds (CUDA_BUILDS) that have code for every one of these GPUs."""
    return [(tag, driver) for tag, (_, driver, archs) in CUDA_BUILDS.items()
            if all(any(code_runs_on(f"sm_{a}", cap) for a in archs) for _, cap in gpus)]


def install_fix(stack):
    """What to do instead: the install line of the newest CUDA build of this torch that the driver and every GPU
    here run, or the driver to update to, or the CPU."""
    release = stack.torch_version.split("+")[0]
    runs = builds_for(stack.gpus)
    for tag, (_, driver_cuda) in runs:
        if driver_cuda <= stack.driver_cuda:
            return f"install torch's CUDA {dotted(CUDA_BUILDS[tag][0])} build: pip install torch=={release} " \
                   f"--index-url {CUDA_INDEX}/{tag}"
    if runs:
        tag, (driver, _) = runs[0]
        return f"update the NVIDIA driver to {driver} or newer, then pip install torch=={release} " \
               f"--index-url {CUDA_INDEX}/{tag}"
    name, cap = stack.gpus[0]
    return f"no CUDA build of torch {release} runs on {name} (sm_{cap[0]}{cap[1]}): use --device cpu"


def cuda_mismatch(stack):
    """One line naming the torch build to install when the driver, torch's build and the GPUs cannot work together,
    else None (also on a machine without an NVIDIA GPU)."""
    if stack.driver_cuda is None or not stack.gpus:
        return None
    gpu = f"{stack.gpus[0][0]} (sm_{stack.gpus[0][1][0]}{stack.gpus[0][1][1]})"
    if stack.wheel_cuda is None:
        if not builds_for(stack.gpus):  # a GPU no build runs (a Kepler): the CPU build is the one that works
            return None
        return (f"torch {stack.torch_version} is not a CUDA build, and this machine has a {gpu} with a CUDA "
                f"{dotted(stack.driver_cuda)} driver: {install_fix(stack)}; or --device cpu")
    if stack.wheel_cuda[0] > stack.driver_cuda[0]:
        return (f"torch {stack.torch_version} is built for CUDA {dotted(stack.wheel_cuda)}, which this NVIDIA driver "
                f"(CUDA {dotted(stack.driver_cuda)} at most) cannot run: {install_fix(stack)}")
    for name, cap in stack.gpus:
        if stack.arch_list and not any(code_runs_on(arch, cap) for arch in stack.arch_list):
            return (f"torch {stack.torch_version} has no code for the {name} (sm_{cap[0]}{cap[1]}), only for "
                    f"{' '.join(stack.arch_list)}: {install_fix(stack)}")
    return None


def check_cuda(requested_device, stack=None):
    """Before a run builds anything, unless it asked for another device: a DistributedError whose one line names
    the torch build to install when the driver, torch's build and the GPUs cannot work together (otherwise torch
    would fall back to the CPU without a word, or fail at the first kernel)."""
    if requested_device != "auto" and not requested_device.startswith("cuda"):
        return
    problem = cuda_mismatch(stack or read_cuda_stack())
    if problem:
        raise DistributedError(f"{problem} (docs/install.md, \"Which build\")")
