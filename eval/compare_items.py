"""Two models on the same HellaSwag items: each accuracy, the paired difference, its exact McNemar p-value, its
95% interval and the number of items on which they disagree.

    python -m eval.compare_items log/aglu log/gelu        # run directories: their final evaluation's items files
    python -m eval.compare_items A.jsonl.gz B.jsonl.gz --scoring completion --metric acc_norm
    python -m eval.compare_items log/aglu/hellaswag_19073_items.jsonl.gz results/nanoact/samples_hellaswag_X.jsonl

Inputs: the items files eval/hellaswag.py writes (hellaswag_<step>_items.jsonl.gz beside the checkpoint), the one a
training run's final evaluation writes into its run directory (hellaswag_items_<step>.jsonl.gz), lm-eval's
`--log_samples` hellaswag file (the lm_eval scoring), or a run directory (its final evaluation's file). Both must
hold the same items with the same labels.

Why paired: two accuracies of ~30% on 10,042 items each carry a Wilson interval of about ±0.9 points, but the
two models answer most items alike, and only the items they answer differently (the discordant ones) say
anything about which is better. Conditional on those, "equal accuracy" means each discordant item goes either
way with probability 1/2: the exact McNemar test (scipy's exact binomial test). The interval is Newcombe's
square-and-add interval for paired proportions (stats/significance.py: paired_difference_ci; unconditional, built from
the two Wilson intervals and their correlation). Both measure item-level noise only: the same two trained models
on another sample of items like these. Whether another seed of training would change the difference is the
per-seed question (python -m sweep); a claim needs both.
"""
import argparse
import sys
from pathlib import Path

from eval import hellaswag_items
from eval.hellaswag_items import METRICS, ItemsError
from stats.significance import mcnemar_exact, paired_difference_ci


def load(path):
    """Items of a file, or of a run directory's own latest items file (its final evaluation's)."""
    path = Path(path)
    if path.is_dir():
        found = hellaswag_items.newest(path)
        if found is None:
            raise ItemsError(f"{path}: no hellaswag_items_*.jsonl.gz here (a training run's final evaluation writes "
                            "one with --hellaswag-interval); pass the items file eval/hellaswag.py wrote instead "
                            "(hellaswag_<step>_items.jsonl.gz)")
        path = found
    return hellaswag_items.read(path)


def shared_items(a, b):
    """The item indices of both, which must be the same items with the same labels."""
    if set(a.labels) != set(b.labels):
        only_a, only_b = sorted(set(a.labels) - set(b.labels)), sorted(set(b.labels) - set(a.labels))
        raise ItemsError(f"{a.path} has {len(a.labels)} items, {b.path} {len(b.labels)}; they differ in "
                        f"{len(only_a) + len(only_b)} (e.g. item {(only_a or only_b)[0]}): score both on the same "
                        "items (the same data file and --limit)")
    indices = sorted(a.labels)
    wrong = [i for i in indices if a.labels[i] != b.labels[i]]
    if wrong:
        raise ItemsError(f"{a.path} and {b.path} disagree on the label of {len(wrong)} items (e.g. item {wrong[0]}: "
                        f"{a.labels[wrong[0]]} vs {b.labels[wrong[0]]}): not scored on the same data file")
    return indices


def paired(a, b, scoring, metric, indices):
    """Accuracies of a and b, a - b with its 95% interval and exact McNemar p, and the 2x2 counts."""
    right_a, right_b = a.correct(scoring, metric, indices), b.correct(scoring, metric, indices)
    both = sum(x and y for x, y in zip(right_a, right_b))
    only_a, only_b = sum(right_a) - both, sum(right_b) - both
    n = len(indices)
    return {"scoring": scoring, "metric": metric, "n": n, "acc_a": sum(right_a) / n, "acc_b": sum(right_b) / n,
            "diff": (only_a - only_b) / n,
            "ci95": paired_difference_ci(both, only_a, only_b, n - both - only_a - only_b),
            "p_mcnemar": mcnemar_exact(only_a, only_b), "discordant": only_a + only_b, "only_a": only_a,
            "only_b": only_b, "interval": "newcombe square-and-add (paired)", "test": "exact McNemar (two-sided)"}


def compare(a, b, scorings=None, metrics=None):
    """paired() for every scoring and metric both files hold (or those asked for)."""
    indices = shared_items(a, b)
    both = [key for key in a.preds if key in b.preds]
    keys = [(s, m) for s, m in both if (scorings is None or s in scorings) and (metrics is None or m in metrics)]
    if not keys:
        have = lambda items: ", ".join(sorted({s for s, _ in items.preds}))
        raise ItemsError(f"no scoring in common (or as asked): {a.path} has {have(a)}, {b.path} has {have(b)}")
    return [paired(a, b, s, m, indices) for s, m in keys]


def describe(items):
    about = items.about
    parts = [f"{k} {about[k]}" for k in ("act", "step", "checkpoint", "run", "hf", "source") if about.get(k)]
    return f"{items.path} ({', '.join(parts)})" if parts else str(items.path)


def report(a, b, rows):
    """The comparison as text: which files, then one table row per scoring and metric."""
    lines = [f"A: {describe(a)}", f"B: {describe(b)}", f"{rows[0]['n']:,} items, the same in both", "",
             "| scoring | metric | A % | B % | A - B (points) | 95% CI (paired) | McNemar p (exact) | discordant: "
             "A right / B right |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scoring']} | {r['metric']} | {100 * r['acc_a']:.2f} | {100 * r['acc_b']:.2f} | "
                     f"{100 * r['diff']:+.2f} | [{100 * r['ci95'][0]:+.2f}, {100 * r['ci95'][1]:+.2f}] | "
                     f"{r['p_mcnemar']:.3g} | {r['discordant']:,}: {r['only_a']:,} / {r['only_b']:,} |")
    lines += ["", "Item-level noise only (Newcombe's paired interval, exact McNemar test on the discordant items): "
                  "these two trained models on another sample of items. Another seed of training is another "
                  "question: compare seeds with python -m sweep."]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="items file (hellaswag_items_*.jsonl.gz, hellaswag_*_items.jsonl.gz or lm-eval's "
                             "samples_hellaswag_*.jsonl) or run directory")
    p.add_argument("b", help="the same for the model it is compared with (the difference is A - B)")
    p.add_argument("--scoring", choices=("completion", "lm_eval"), help="only this scoring (default: all both have)")
    p.add_argument("--metric", choices=tuple(METRICS), help="only this metric (default: acc and acc_norm)")
    args = p.parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
        rows = compare(a, b, args.scoring and [args.scoring], args.metric and [args.metric])
    except ItemsError as e:
        sys.exit(f"error: {e}")
    print(report(a, b, rows))
    return rows


if __name__ == "__main__":
    main()
