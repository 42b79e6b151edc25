"""The LM head and its cross-entropy a chunk of rows at a time: GPT(loss_chunks > 0)'s loss, whose full (N, V)
logits and their fp32 gradient would otherwise each take N x V x 4 bytes (N = B T rows, V the vocabulary)."""
import torch


class _LinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(hidden_i @ weight.T, target_i) over targets != -1, a chunk of rows at a time.

    The gradients are computed in the forward, chunk by chunk, so neither pass ever holds more than one chunk
    of logits (the plain path keeps the (N, V) logits and their fp32 gradient), and no logit is computed twice.
    Under autocast the matmuls run in its dtype and the softmax in fp32, as in the plain path; the weight
    gradient is summed over chunks in fp32.

    The logit gradient enters the half-precision matmuls before the upstream gradient (a GradScaler's scale)
    is known, so it brings its own: fp16 flushes values under 6e-8 to zero, and softmax / n_valid would put
    every probability under n_valid * 6e-8 there (the errors with and without it: BENCHMARKS.md,
    "Chunked loss under fp16"). It is cast as softmax - onehot, within [-1, 1], times the largest power of two
    (at most 2^14) that keeps each product's largest possible entry finite, and the fp32 product is divided
    back (a power of two: no rounding).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, n_chunks, with_grad):
        device = hidden.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        high = torch.promote_types(low, torch.float32)  # fp32 softmax (float64 stays float64)
        w = weight.to(low)
        n_valid = (targets != -1).sum()
        loss = torch.zeros((), dtype=high, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if with_grad else None
        grad_weight = torch.zeros_like(weight, dtype=high) if with_grad else None
        # a row of softmax - onehot sums to at most 2 in absolute value: |(d_logits @ w)_ij| <= 2 max|w|
        hidden_scale = matmul_scale(2 * w.abs().max().to(high), low) if with_grad else None
        size = -(-hidden.size(0) // n_chunks)
        for start in range(0, hidden.size(0), size):
            h, t = hidden[start:start + size].to(low), targets[start:start + size]
            logits = (h @ w.t()).to(high)  # the plain path's logits: the matmul in `low`, then upcast
            lse = logits.logsumexp(-1)
            valid = t != -1
            index = t.clamp_min(0)[:, None]
            loss = loss + torch.where(valid, lse - logits.gather(1, index)[:, 0], 0.0).sum()
            if with_grad:  # d mean CE / d logits = (softmax - onehot) / n_valid on the valid rows
                d_logits = torch.exp(logits - lse[:, None]).scatter_add_(1, index, -torch.ones_like(logits[:, :1]))
                keep = valid.to(high)[:, None]
                # each entry of d_logits.T @ h sums at most `rows` terms of |d| <= 1 times max|h|
                weight_scale = matmul_scale(h.size(0) * h.abs().max().to(high), low)
                grad_hidden[start:start + size] = (((d_logits * (keep * hidden_scale)).to(low) @ w).to(high)
                                                   / (hidden_scale * n_valid)).to(hidden.dtype)
                grad_weight += ((d_logits * (keep * weight_scale)).to(low).t() @ h).to(high) / (weight_scale * n_valid)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss / n_valid

    @staticmethod
    def backward(ctx, grad):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad, (grad_weight * grad).to(ctx.weight_dtype), None, None, None


def matmul_scale(bound, dtype):
    """The largest power of two, at most 2^14 (which lifts fp16's smallest normal, 6e-5, to 4e-9), by which a
    matmul in `dtype` whose entries are at most `bound` can be scaled with no entry over half dtype's maximum.
    A tensor, not a Python number: no GPU sync."""
    return torch.exp2(torch.floor(torch.log2(torch.finfo(dtype).max / 2 / bound)).clamp(max=14))


def linear_cross_entropy(hidden, weight, targets, n_chunks):
    """F.cross_entropy(hidden @ weight.T, targets, ignore_index=-1) without the full (N, V) logits."""
    with_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(hidden, weight, targets, n_chunks, with_grad)
