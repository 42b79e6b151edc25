"""Log-likelihood of continuations given contexts, many rows per forward pass.

A row is (context tokens, continuation tokens). Rows are padded to a fixed (n_rows, length) batch so
that a torch.compile'd model sees only a handful of shapes (`bucket`) instead of one per item;
padding positions carry target -1 and never enter a sum. HellaSwag and the lm-eval adapter both
score through `score_batch`, so the two can never disagree on what a log-likelihood is.
"""
import contextlib
import functools

import numpy as np
import torch
import torch.nn.functional as F

from data.tokenizer import EOT, VOCAB_SIZE, GPT2Tokens


def bucket(length, block_size, step=64):
    """Round a sequence length up to a multiple of `step`: HellaSwag (<= 166 tokens) needs 3 shapes."""
    return min(block_size, step * -(-length // step))


def fit_row(context, continuation, block_size):
    """(input, target) token lists for one row; an over-long context is cut on the left, as lm-eval does."""
    if not continuation:
        raise ValueError("empty continuation: nothing to score")
    if len(continuation) > block_size:
        raise ValueError(f"continuation of {len(continuation)} tokens exceeds the model's block_size {block_size}")
    seq = (list(context) + list(continuation))[-(block_size + 1):]
    return seq[:-1], seq[1:]


def row_length(context, continuation, block_size):
    """Input length of a row after `fit_row`: the batch length it needs."""
    return min(len(context) + len(continuation), block_size + 1) - 1


def unwrapped(model):
    """The GPT under DDP (.module) and torch.compile (._orig_mod) wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def block_size_of(model):
    return unwrapped(model).config.block_size


def pack_rows(rows, length, n_rows, block_size):
    """(idx, tgt) CPU tensors of shape (n_rows, length): rows left-aligned, EOT padding, target -1 wherever
    a position is not a continuation token. Rows beyond len(rows) are pure padding."""
    idx = np.full((n_rows, length), EOT, dtype=np.int64)  # numpy: filling rows from lists is ~4x torch's speed
    tgt = np.full((n_rows, length), -1, dtype=np.int64)
    for r, (context, continuation) in enumerate(rows):
        inp, target = fit_row(context, continuation, block_size)
        if len(inp) > length:
            raise ValueError(f"row of {len(inp)} tokens does not fit the batch length {length}")
        idx[r, :len(inp)] = inp
        n = len(continuation)
        tgt[r, len(inp) - n:len(inp)] = target[-n:]
    return torch.from_numpy(idx), torch.from_numpy(tgt)


@torch.no_grad()
def score_batch(model, idx, tgt, autocast=None, n_vocab=VOCAB_SIZE, greedy=True):
    """Sum of log p(continuation | context), token count and is-greedy (None with greedy=False) of every
    row of a packed batch, left on the batch's device.

    The model's forward stops before the LM head (a compiled model: one graph per batch length) and the
    head is applied to the scored positions only: a continuation is ~20 of a row's 64-128 positions, and
    the head (n_embd x 50304) is GPT-2 124M's largest matrix. Logits are cut to the tokenizer's n_vocab:
    GPT pads its vocabulary to 50304 and those extra logits must not take probability mass (transformers'
    GPT-2 has exactly 50257).
    """
    scored = tgt >= 0
    with autocast or contextlib.nullcontext():
        hidden, _ = model(idx, head=False)
        picked = unwrapped(model).lm_head(hidden[scored])[:, :n_vocab].float()
    targets = tgt[scored]
    logp = -F.cross_entropy(picked, targets, reduction="none")
    row_of = scored.nonzero()[:, 0]
    n_rows = idx.size(0)
    sums = torch.zeros(n_rows, dtype=torch.float64, device=idx.device).index_add_(0, row_of, logp.double())
    counts = scored.sum(1)
    if not greedy:
        return sums, counts, None
    hits = (picked.argmax(-1) == targets).to(torch.float64)
    all_greedy = torch.zeros(n_rows, dtype=torch.float64, device=idx.device).index_add_(0, row_of, hits) == counts
    return sums, counts, all_greedy


def score_rows(model, rows, length, n_rows, device, autocast=None, n_vocab=VOCAB_SIZE):
    """Sum of log p(continuation | context), token count and is-greedy for each row, on the CPU.

    The batch is always (n_rows, length), whatever len(rows): a compiled model sees one shape per length.
    """
    idx, tgt = pack_rows(rows, length, n_rows, block_size_of(model))
    sums, counts, all_greedy = score_batch(model, idx.to(device), tgt.to(device), autocast, n_vocab)
    k = len(rows)
    return sums[:k].cpu(), counts[:k].cpu(), all_greedy[:k].cpu()


@functools.cache
def _token_bytes():
    return GPT2Tokens().byte_lengths()


def byte_count(tokens):
    """UTF-8 bytes the GPT-2 tokens stand for: the denominator of a continuation's bits per byte."""
    return int(_token_bytes()[np.asarray(tokens, dtype=np.int64)].sum()) if len(tokens) else 0

