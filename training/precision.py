"""Numerics shared by the trainers: which precision a run uses and the autocast context for it."""
import contextlib
import math

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


def stop_if_not_finite(step, loss, grad_norm, lr, model, out_dir, lr_flag):
    """A NaN/inf loss or gradient norm ends the run before the optimizer step can spread it into the
    weights, so the newest checkpoint on disk is still a good one; say which, and which grads broke."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    from training.checkpoint import latest_checkpoint

    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    listed = f"{bad[:5]}{' ...' if len(bad) > 5 else ''}"
    raise SystemExit(f"step {step}: loss {loss} / grad norm {grad_norm} is not finite (lr {lr:.3e}; non-finite "
                     f"grads in {listed}). Stopped without saving; last good checkpoint: "
                     f"{latest_checkpoint(out_dir) or 'none'} (lower {lr_flag} or check the data, then --resume)")
