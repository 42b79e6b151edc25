"""Coverage of the sweep report's downstream interval (seeds and items both sampled, analysis/downstream.py) on
simulated sweeps: how often its 95% interval holds the true difference, through paired_seeds_items itself.

    python bench/downstream_coverage.py                    # 2,000 simulated pairs per case, 4 seeds, 500 items
    python bench/downstream_coverage.py --sims 200 --seeds 6 --items 2000

Each case draws a new population sample every simulation: seeds (a per-arm, per-seed effect), items (a difficulty
shared by the arms and a per-arm item effect), and per run and item the score. "continuous": a Gaussian score
(the gold bits per byte); "binary": right or wrong, Bernoulli(sigmoid(difficulty + arm + seed + item effects))
(acc, acc_norm). The truth is the difference of the arms' expected scores over the populations: the arm effect for
the continuous case, a 2,000,000-draw Monte Carlo of the probabilities for the binary one. BENCHMARKS.md,
"Continuous downstream scores", has a result.
"""
import argparse

import numpy as np

from analysis.downstream import paired_seeds_items
from stats.significance import wilson

# case -> (kind, arm effect, seed sd, item-effect sd, noise sd (continuous) / difficulty sd (binary))
CASES = {
    "continuous, seeds dominate": ("continuous", 0.01, 0.02, 0.01, 0.05),
    "continuous, items dominate": ("continuous", 0.01, 0.002, 0.05, 0.05),
    "continuous, no seed noise": ("continuous", 0.0, 0.0, 0.05, 0.10),
    "binary, seeds dominate": ("binary", 0.05, 0.15, 0.1, 1.0),
    "binary, items dominate": ("binary", 0.05, 0.02, 0.5, 1.0),
}


def binary_truth(effect, seed_sd, item_sd, difficulty_sd, rng, n=2_000_000):
    """E[p_variant - p_base] over difficulty, seed and item effects (each arm draws its own)."""
    theta = rng.normal(0, difficulty_sd, n)
    p = lambda shift: 1 / (1 + np.exp(-(theta + shift + rng.normal(0, seed_sd, n) + rng.normal(0, item_sd, n))))
    return float((p(effect) - p(0.0)).mean())


def simulate(case, seeds, items, rng):
    """({seed: {item: score}} of the base arm, of the variant) of one simulated sweep."""
    kind, effect, seed_sd, item_sd, other_sd = CASES[case]
    shared = rng.normal(0, other_sd if kind == "binary" else 0.3, items)  # difficulty: cancels in the difference
    arms = []
    for shift in (0.0, effect):
        latent = (shared[None, :] + shift + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, item_sd, (1, items)))
        if kind == "continuous":
            score = latent + rng.normal(0, other_sd, (seeds, items))
        else:
            score = (rng.random((seeds, items)) < 1 / (1 + np.exp(-latent))).astype(float)
        arms.append({s: dict(enumerate(score[s].tolist())) for s in range(seeds)})
    return arms


def coverage(case, sims, seeds, items, rng, truth_draws=2_000_000):
    """(hits, sims, mean detectable difference) of the 95% interval of paired_seeds_items."""
    kind, effect, seed_sd, item_sd, other_sd = CASES[case]
    truth = effect if kind == "continuous" else binary_truth(effect, seed_sd, item_sd, other_sd, rng, truth_draws)
    hits, detectable = 0, []
    for _ in range(sims):
        base, variant = simulate(case, seeds, items, rng)
        result = paired_seeds_items(base, variant)
        hits += result["ci95"][0] <= truth <= result["ci95"][1]
        detectable.append(result["detectable"])
    return hits, sims, float(np.mean(detectable))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--items", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--truth-draws", type=int, default=2_000_000, help="Monte Carlo draws of a binary case's truth")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'case':30s} coverage of the 95% interval [Wilson 95%]   mean detectable (80%)   "
          f"({args.seeds} seeds, {args.items} items, {args.sims} sweeps)")
    for case in CASES:
        hits, n, detectable = coverage(case, args.sims, args.seeds, args.items, rng, args.truth_draws)
        lo, hi = wilson(hits, n)
        print(f"{case:30s} {hits / n:.3f} [{lo:.3f}, {hi:.3f}]                    {detectable:.4f}")


if __name__ == "__main__":
    main()
