"""How exact the chunked loss's gradients are under fp16 autocast with a GradScaler-sized loss scale, against a
float64 reference and beside the plain path (the full logits), on random hidden states and LM-head weights.

    python bench/loss_chunk_precision.py                           # 4,096 rows x vocabulary 4,096
    python bench/loss_chunk_precision.py --rows 16384 --vocab 50304 --dim 16 --chunks 8

Prints the normwise relative error of the hidden-state and weight gradients of each path. Before the chunked
loss kept the scaler's range (BENCHMARKS.md), probabilities under ~n_valid x 6e-8 flushed to zero in fp16.
"""
import argparse

import torch
import torch.nn.functional as F

from model_parts.chunked_loss import linear_cross_entropy


def relative_error(grad, reference):
    return ((grad.double() - reference).norm() / reference.norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--scale", type=float, default=2.0 ** 16, help="the loss scale (a GradScaler's initial one)")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.rows, args.dim, generator=gen)
    weight = 0.1 * torch.randn(args.vocab, args.dim, generator=gen)
    targets = torch.randint(0, args.vocab, (args.rows,), generator=gen)
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    reference = torch.autograd.grad(F.cross_entropy(h64 @ w64.t(), targets), (h64, w64))
    paths = {"plain": lambda h, w: F.cross_entropy((h @ w.t()).float(), targets),
             "chunked": lambda h, w: linear_cross_entropy(h, w, targets, args.chunks)}
    print(f"rows {args.rows} x vocabulary {args.vocab}, dim {args.dim}, {args.chunks} chunks, fp16 autocast, "
          f"loss scale {args.scale:g}, torch {torch.__version__}")
    for name, loss_fn in paths.items():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(h, w)
        (args.scale * loss).backward()
        print(f"{name:8s} relative error: hidden {relative_error(h.grad / args.scale, reference[0]):.3e}, "
              f"weight {relative_error(w.grad / args.scale, reference[1]):.3e}")


if __name__ == "__main__":
    main()
