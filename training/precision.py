"""Numerics shared by the trainers: which precision a run uses and the autocast context for it."""
import contextlib

import torch

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_precision(requested, device_type):
    """'auto' -> bfloat16 autocast on CUDA (as the anchor recipe), float32 elsewhere."""
    if requested == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if requested not in PRECISIONS:
        raise ValueError(f"unknown dtype {requested!r}; choose auto, {', '.join(PRECISIONS)} "
                         "(float16 would need loss scaling; bfloat16 does not)")
    return requested


def autocast_context(device_type, precision):
    """Weights stay float32; matmuls run in bfloat16 under autocast. float32 runs get a no-op context."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=PRECISIONS[precision])

