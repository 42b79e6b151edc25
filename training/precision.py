"""Numerics shared by the trainers: which precision a run uses, its autocast context and its GradScaler."""
import contextlib

import torch

from training.hardware import choose_precision, detect

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_precision(requested, device_type):
    """'auto' -> bfloat16 autocast on CUDA GPUs with bf16, float16 on those without, float32 elsewhere
    (training/hardware.py says why)."""
    return choose_precision(requested, detect(device_type))[0]


def autocast_context(device_type, precision):
    """Weights stay float32; matmuls run in bfloat16/float16 under autocast. float32 runs get a no-op context."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=PRECISIONS[precision])


def autocast_for(device_type, requested="auto"):
    """The autocast context of --dtype `requested` on this device type: what evaluation and sampling run under."""
    return autocast_context(device_type, resolve_precision(requested, device_type))


def grad_scaler(device_type, precision):
    """float16's 5 exponent bits underflow small gradients: scale the loss up, unscale before clipping, skip
    the steps whose gradients overflowed (torch.amp.GradScaler). A disabled scaler, a no-op, otherwise."""
    return torch.amp.GradScaler(device_type, enabled=precision == "float16")
