"""The measurements of the activation and normalization literature on GPT-2 checkpoints: activation sparsity
(eval/sparsity.py: exact zeros, dead neurons, CETT-calibrated and top-k sparsity, PPL-p% sparsity), signal
propagation, massive activations and attention entropy (eval/internals.py), per layer and for the model.

    python -m eval.measure log/relu log/gelu --data data/fineweb_edu --out runs/measure
    python -m eval.measure log/relu/model_19073.pt --data data/fineweb_edu --tokens 4096 --ppl 1,5

Each checkpoint (a file, or a run directory: its newest) is measured on the first --tokens of the validation
shard (PPL-p% calibrated on the first half of its sequences, judged with standard errors on the second), and the
same model at its initialisation (its config rebuilt at the run's seed) for what propagates and its exact zeros.
It prints a table per checkpoint and writes measure.json (everything) and signal_propagation.png (every
checkpoint, at init and trained, on one figure) into --out. Training records the one-batch measurements
(signal, massive activations, attention entropy, zeros, dead) at every evaluation (metrics.jsonl `measure`); the
CETT scan (every threshold's CETT, O(tokens x hidden x d) a layer) and the PPL-p% search (a forward pass per
step) are this command's only.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from data.loader import ShardLoader
from errors import NanoactError
from eval import internals, sparsity
from model import GPT, GPTConfig
from activations.impl import model_identity
from training.checkpoint import load_checkpoint


def held_out(data_dir, vocab_size, block_size, tokens, rows=8):
    """The first `tokens` of the validation shards as (x, y) batches of `rows` sequences of block_size."""
    T = min(block_size, 1024)
    loader = ShardLoader(data_dir, "val", rows, T, shuffle=False, vocab_size=vocab_size)
    return [loader.next_batch() for _ in range(max(1, tokens // (rows * T)))]


def at_init(ckpt):
    """The checkpoint's model as it was before its first step: its config, built at the run's seed."""
    run = (ckpt.get("config") or {}).get("run", {})
    seed = run.get("seed", 0) + run.get("init_seed_offset", 0)
    return GPT(GPTConfig(**model_identity(ckpt["model_config"])), seed=seed).eval()


def measure(model, batches, cett_target, ppl_p):
    return {**sparsity.measure(model, batches, cett_target, ppl_p), **internals.measure(model, batches[0][0])}


def measure_init(model, batches):
    """At initialisation: what propagates and the exact zeros (the CETT and PPL searches say little of a random
    model, and cost most of the command's time)."""
    neurons = {}
    with sparsity.captured(model, neurons), torch.no_grad():
        for x, _ in batches:
            model(x, head=False)
    return {"layers": sparsity.dense_sparsity(neurons), **internals.measure(model, batches[0][0])}


def table(name, result):
    lines = [f"{name}: sparsity (model) zeros {result['model']['zeros']:.3f} dead {result['model']['dead']:.3f} "
             f"CETT@{result['cett_target']:g} {result['model']['cett']:.3f} top-k {result['model']['topk']:.3f}"
             + "".join(f" | PPL-{p}% {v['sparsity']:.3f} +- {v['sparsity_se']:.3f} (perplexity x{v['ppl_ratio']:.4f} "
                       f"+- {v['ppl_ratio_se']:.4f} on {v['sequences']['evaluation']} sequences not calibrated on)"
                       for p, v in result["ppl"].items()),
             f"{'layer':>6} {'zeros':>6} {'dead':>6} {'CETT':>6} {'top-k':>6} {'sq mean':>9} {'variance':>9} "
             f"{'branch':>9} {'massive':>8} {'entropy':>8}"]
    for i, (name_l, s) in enumerate(result["layers"].items()):
        sp, m = result["signal"][i + 1], result["massive"][i]
        entropy = sum(result["attention_entropy"][i]) / len(result["attention_entropy"][i])
        lines.append(f"{i:>6} {s['zeros']:6.3f} {s['dead']:6.3f} {s['cett']:6.3f} {s['topk']:6.3f} "
                     f"{sp['squared_mean']:9.3g} {sp['variance']:9.3g} {sp['branch_variance']:9.3g} "
                     f"{m['ratio']:8.1f} {entropy:8.3f}")
    return "\n".join(lines)


def plot(results, path):
    """Signal propagation plot: one line per checkpoint (dashed at init), the three statistics against depth."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("squared_mean", "avg squared channel mean"), ("variance", "avg channel variance"),
            ("branch_variance", "residual branch variance")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, (name, result) in enumerate(results.items()):
        for when, style in (("init", "--"), ("trained", "-")):
            rows = result[when]["signal"]
            for ax, (key, title) in zip(axes, keys):
                depth = [d for d, r in enumerate(rows) if key in r]
                ax.plot(depth, [rows[d][key] for d in depth], style, color=f"C{i}",
                        label=f"{name} ({when})" if ax is axes[0] else None)
                ax.set(title=title, xlabel="depth (0: embeddings, l: after block l)", yscale="log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="Sparsity, signal propagation, massive activations and attention "
                                            "entropy of GPT-2 checkpoints (trained and at their init).")
    p.add_argument("checkpoints", nargs="+", help="checkpoint files or run directories (their newest)")
    p.add_argument("--data", required=True, help="token shard directory; its validation shard is measured")
    p.add_argument("--tokens", type=int, default=4096, help="held-out tokens (default 4096)")
    p.add_argument("--cett", type=float, default=0.2, help="CETT target (ReLU^2 Wins uses 0.2)")
    p.add_argument("--ppl", default="1", help="comma-separated p of PPL-p%% sparsity (default 1)")
    p.add_argument("--out", default="runs/measure", help="directory for measure.json and signal_propagation.png")
    args = p.parse_args(argv)
    try:
        ppl_p = [float(v) for v in args.ppl.split(",")]
        results = {}
        for path in args.checkpoints:
            ckpt = load_checkpoint(path, kind="gpt2")
            model = GPT.from_checkpoint(ckpt)
            batches = held_out(args.data, model.config.vocab_size, model.config.block_size, args.tokens)
            name = str(ckpt["path"])
            results[name] = {"step": ckpt["step"], "init": measure_init(at_init(ckpt), batches),
                             "trained": measure(model, batches, args.cett, ppl_p)}
            print(table(f"{name} (step {ckpt['step']})", results[name]["trained"]), flush=True)
    except (NanoactError, ValueError) as e:
        sys.exit(f"error: {e}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "measure.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "signal_propagation.png")
    print(f"wrote {out / 'measure.json'} and {out / 'signal_propagation.png'}")
    return results


if __name__ == "__main__":
    main()
