"""Learning-rate schedules of the two recipes."""
import math


def warmup_cosine(step, warmup_steps, max_steps, max_lr, min_lr):
    """build-nanogpt's schedule: linear warmup from max_lr/warmup, cosine to min_lr at max_steps."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    ratio = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def inverse_sqrt(step, warmup_steps, max_lr):
    """fairseq's inverse_sqrt: linear warmup to max_lr, then max_lr * sqrt(warmup / step)."""
    step = step + 1
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    return max_lr * math.sqrt(warmup_steps / step)
