"""Coordinate check (Tensor Programs V, Sec. 7 / Fig. 5; EleutherAI/nanoGPT-mup's): train GPT-2 10 steps at each width
and depth and look at every block's output, the residual stream, on a fixed batch: its mean |x| and, against step 0,
its mean |update|. A parametrization that transfers keeps both flat as the model grows; under sp they grow with width
(Adam's update of an n-wide matrix moves its output ~n times as much) and with depth (L branches add up).

    python bench/coord_check.py                 # sp, mup, completep: widths 32-256 at depth 4, depths 2-16 at width 64
    python bench/coord_check.py --smoke         # seconds: widths 32 and 64, depths 2 and 4, 3 steps
    python bench/coord_check.py --params completep --out log/coord_check --json stats.json

Base (where mup and completep equal sp's lr): width 64, depth 4. One PNG per parametrization in --out
(coord_check_PARAM.png: mean |x| and mean |update| at the last step against width, each layer a line, and against
depth, the blocks half way up and at the top), and per parametrization its spread: the largest max/min ratio, over
widths of each block's value, over depths of those two blocks' (tests/test_coord_check.py).
Synthetic tokens (a noisy walk over 256 ids), AdamW at a constant lr, no weight decay, one CPU thread.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from model import GPT, GPTConfig
from training.optimizer import adamw, set_lr

WIDTHS, DEPTHS = (32, 64, 128, 256), (2, 4, 8, 16)
BASE_WIDTH, BASE_DEPTH = 64, 4
HEAD_DIM = 16  # heads grow with width, as GPT-2's sizes do (64 there); muP's 1/d_head then changes nothing with size
VOCAB, SEQ, BATCH = 256, 64, 8
# the base model's lr: updates 3-10x the init's scale in 10 steps. At 1e-2 the base itself runs unstably (mean |x| 5 to
# 25 after 10 steps, not monotone in depth under any parametrization): a coordinate check wants the regime a tuned lr
# trains in
LR = 1e-3


def tokens(generator, rows):
    """(rows, SEQ + 1) ids of a walk with small random steps: a next token that a model can learn to predict."""
    steps = torch.randint(-3, 4, (rows, SEQ + 1), generator=generator)
    return (torch.randint(0, VOCAB, (rows, 1), generator=generator) + steps.cumsum(1)) % VOCAB


def block_outputs(model, idx):
    """Every block's output on idx, in a list."""
    outputs = []
    hooks = [block.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
             for block in model.transformer.h]
    with torch.no_grad():
        model(idx)
    for hook in hooks:
        hook.remove()
    return outputs


def coordinates(param, width, depth, steps=10, lr=LR, seed=0):
    """{"act": [mean |x_l|], "update": [mean |x_l - x_l at step 0|]} of every block l after `steps` AdamW steps."""
    config = GPTConfig(block_size=SEQ, vocab_size=VOCAB, n_layer=depth, n_head=width // HEAD_DIM, n_embd=width,
                       param=param, base_width=BASE_WIDTH, base_depth=BASE_DEPTH)
    model = GPT(config, seed=seed)
    optimizer = adamw(model, lr, 0.0, (0.9, 0.95), 1e-8, "cpu", model.optimizer_groups(0.0, 1e-8))
    set_lr(optimizer, lr)
    generator = torch.Generator().manual_seed(seed)
    probe = tokens(generator, BATCH)[:, :-1]
    before = block_outputs(model, probe)
    for _ in range(steps):
        batch = tokens(generator, BATCH)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    after = block_outputs(model, probe)
    return {"act": [x.abs().mean().item() for x in after],
            "update": [(x - x0).abs().mean().item() for x, x0 in zip(after, before)]}


def check(param, widths=WIDTHS, depths=DEPTHS, steps=10, lr=LR):
    """{"width": {w: coordinates at BASE_DEPTH}, "depth": {L: coordinates at BASE_WIDTH},
    "spread": {"act", "update"}}."""
    by_width = {w: coordinates(param, w, BASE_DEPTH, steps, lr) for w in widths}
    by_depth = {d: by_width[BASE_WIDTH] if d == BASE_DEPTH and BASE_WIDTH in by_width else
                coordinates(param, BASE_WIDTH, d, steps, lr) for d in depths}
    return {"width": by_width, "depth": by_depth,
            "spread": {kind: spread(by_width, by_depth, kind) for kind in ("act", "update")}}


def compared_layers(values):
    """The values of the blocks half way up and at the top: the layers at one relative depth, which CompleteP's
    residual stream (a sum of L branches / L) keeps alike whatever L."""
    return [values[len(values) // 2 - 1], values[-1]]


def spread(by_width, by_depth, kind):
    """The largest max/min ratio of `kind`: over widths, layer by layer; over depths, first, middle and last block."""
    rows = list(zip(*(c[kind] for c in by_width.values()))) + \
        list(zip(*(compared_layers(c[kind]) for c in by_depth.values())))
    return max(max(row) / min(row) for row in rows)


def plot(param, result, out):
    """coord_check_PARAM.png in `out`: mean |x| and mean |update| against width and depth."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on headless machines
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for row, kind in enumerate(("act", "update")):
        for col, (axis, runs) in enumerate((("width", result["width"]), ("depth", result["depth"]))):
            ax = axes[row][col]
            sizes = list(runs)
            lines = list(zip(*(c[kind] for c in runs.values()))) if axis == "width" else \
                list(zip(*(compared_layers(c[kind]) for c in runs.values())))
            names = [f"block {i}" for i in range(len(lines))] if axis == "width" else ["half way", "top"]
            for name, values in zip(names, lines):
                ax.plot(sizes, values, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("n_embd (depth 4)" if axis == "width" else "n_layer (width 64)")
            ax.set_ylabel("mean |x|" if kind == "act" else "mean |x - x at step 0|")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.suptitle(f"coordinate check, {param}: block outputs after the last step (max/min over sizes "
                 f"{result['spread']['act']:.2f}x |x|, {result['spread']['update']:.2f}x |update|)", fontsize=10)
    fig.tight_layout()
    path = Path(out) / f"coord_check_{param}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="sp,mup,completep", help="comma-separated parametrizations")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=LR, help="the base model's (width 64, depth 4)")
    p.add_argument("--smoke", action="store_true", help="widths 32, 64; depths 2, 4; 3 steps")
    p.add_argument("--out", default="log/coord_check", help="the PNGs' folder")
    p.add_argument("--json", help="write every number here")
    args = p.parse_args()
    torch.set_num_threads(1)
    widths, depths, steps = ((32, 64), (2, 4), 3) if args.smoke else (WIDTHS, DEPTHS, args.steps)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {}
    for param in args.params.split(","):
        t0 = time.time()
        results[param] = check(param, widths, depths, steps, args.lr)
        path = plot(param, results[param], args.out)
        s = results[param]["spread"]
        print(f"{param:>9}: max/min over widths {widths[0]}-{widths[-1]} and depths {depths[0]}-{depths[-1]}: "
              f"|x| {s['act']:.2f}x, |update| {s['update']:.2f}x | {path} | {time.time() - t0:.1f}s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
