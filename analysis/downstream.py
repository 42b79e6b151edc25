"""Downstream metrics in a sweep: each pair's difference with seeds and items both sampled, what it can detect, and
which metrics separate the arms at all (signal-to-noise), for the sweep report (analysis/sweep_report.py).

A downstream metric is an in-loop metric with a value per benchmark item in the run's final items file
(eval/hellaswag_items.py): HellaSwag acc and acc_norm (right or wrong per item) and the gold ending's bits per byte
(eval/continuous.py). Its paired difference, variant - baseline, is d[s, i] over the seeds s both finished and
the items i both answered. Two sources of noise: another seed of training, another sample of items. In the
two-way random-effects model d[s, i] = mu + a_s + b_i + e_si, the mean over S seeds and I items has variance
sigma_a^2/S + sigma_b^2/I + sigma_e^2/(S I), estimated without bias from the ANOVA mean squares as
(MS_seed + MS_item - MS_resid)/(S I); its degrees of freedom by Satterthwaite. The interval is mean ± t se, the
minimum detectable effect at 80% power and two-sided alpha 0.05 is (t_0.975 + t_0.80) se. Coverage on simulated
seeds and items through `paired_seeds_items` itself: tests/test_sweep_downstream.py (cheap) and
bench/downstream_coverage.py (BENCHMARKS.md, "Continuous downstream scores").

Signal-to-noise (Heineman et al. 2025, "Signal and Noise"): per metric, the spread of the arms' means (largest
minus smallest) over the noise of one run (the seed sd, pooled over arms). Their relative dispersion and relative
sd both divide by the mean, which cancels. Below about 1 the sweep's seeds cannot order its arms on that metric.
The same per task of a CORE bundle (eval/core_in_loop.py's `core_tasks` at each run's final evaluation): which
tasks can separate the arms at the sweep's scale, on accuracy and on the gold bits per byte.
"""
import math
import statistics

import numpy as np

from analysis.runs import markdown_table, read_metrics
from eval import hellaswag_items
from eval.hellaswag_items import ItemsError

# in-loop metric -> (scoring, per-item score) in the final evaluation's items file
DOWNSTREAM = {"hellaswag_acc": ("completion", "acc"), "hellaswag_acc_norm": ("completion", "acc_norm"),
              "hellaswag_bpb": ("completion", "bpb")}


def paired_seeds_items(base, other):
    """other - base over the seeds both have and the items every one of those seeds scored, both sampled.
    base, other: {seed: {item: value}}. {seeds, items, mean, se, df, ci95, p, detectable}; None below 2 seeds
    (one seed cannot see the seed noise) or 2 items."""
    from scipy.special import stdtr, stdtrit  # Student's t cdf and quantile, without scipy.stats' overhead

    seeds = sorted(set(base) & set(other))
    items = sorted(set.intersection(*(set(base[s]) & set(other[s]) for s in seeds))) if seeds else []
    if len(seeds) < 2 or len(items) < 2:
        return None
    d = np.array([[other[s][i] - base[s][i] for i in items] for s in seeds], dtype=np.float64)
    n_s, n_i = d.shape
    mean = float(d.mean())
    seed_dev, item_dev = d.mean(1) - mean, d.mean(0) - mean
    ms = [n_i * float(seed_dev @ seed_dev) / (n_s - 1), n_s * float(item_dev @ item_dev) / (n_i - 1),
          float(((d - mean - seed_dev[:, None] - item_dev[None, :]) ** 2).sum()) / ((n_s - 1) * (n_i - 1))]
    dfs = [n_s - 1, n_i - 1, (n_s - 1) * (n_i - 1)]
    # the residual mean square removes the share of sigma_e^2 the two main ones both count; where it exceeds one
    # of them (that component estimated below 0), the larger main mean square alone, which is never smaller
    if min(ms[0], ms[1]) > ms[2]:
        terms = [(ms[0], dfs[0]), (ms[1], dfs[1]), (-ms[2], dfs[2])]
    else:
        terms = [max(zip(ms[:2], dfs[:2]))]
    total = sum(m for m, _ in terms)
    se = math.sqrt(total / (n_s * n_i))
    df = total ** 2 / sum(m * m / f for m, f in terms) if total > 0 else n_s - 1
    q, q_power = float(stdtrit(df, 0.975)), float(stdtrit(df, 0.80))
    p = float(2 * stdtr(df, -abs(mean) / se)) if se > 0 else float(mean == 0)
    return {"seeds": seeds, "items": n_i, "mean": mean, "se": se, "df": df, "ci95": [mean - q * se, mean + q * se],
            "p": p, "detectable": (q + q_power) * se}


def item_values(runs, variant_of, metrics):
    """{metric: {variant: {seed: {item: value}}}} from the finished runs' own final items files, for the declared
    downstream metrics the files hold (a file written before the continuous scores has no bpb)."""
    out = {m: {} for m in metrics if m in DOWNSTREAM}
    for run in runs:
        path = hellaswag_items.newest(run.path)
        if path is None or variant_of(run) is None:
            continue
        try:
            items = hellaswag_items.read(path)
        except ItemsError as e:
            raise SystemExit(f"error: {e}") from None
        if not hellaswag_items.from_training(items):
            continue  # eval/hellaswag.py's scoring over the run's own: the sweep report's items_of says so
        indices = sorted(items.labels)
        for metric in out:
            scoring, key = DOWNSTREAM[metric]
            if (scoring, key) in items.preds or (scoring, key) in (items.scores or {}):
                values = dict(zip(indices, items.values(scoring, key, indices)))
                out[metric].setdefault(variant_of(run), {})[run.setting("seed")] = values
    return {m: v for m, v in out.items() if v}


def downstream_pairs(values, baselines):
    """{variant: {metric: paired_seeds_items(...)}} for each variant with a baseline and both with items."""
    pairs = {}
    for metric, per_variant in values.items():
        for a, base in baselines.items():
            if a != base and a in per_variant and base in per_variant:
                result = paired_seeds_items(per_variant[base], per_variant[a])
                if result is not None:
                    pairs.setdefault(a, {})[metric] = result
    return pairs


def signal_to_noise(rows, metrics, arms):
    """[(metric key, spread of arm means, pooled seed sd, SNR)] over the arms with 2+ seeds: rows is
    {arm: {metric: {seed: value}}}, the sweep report's seed_values."""
    out = []
    for key, _ in metrics:
        per_arm = [list(rows[a].get(key, {}).values()) for a in arms]
        per_arm = [v for v in per_arm if len(v) > 1]
        if len(per_arm) < 2:
            continue
        means = [statistics.fmean(v) for v in per_arm]
        sd = math.sqrt(statistics.fmean([statistics.variance(v) for v in per_arm]))
        spread = max(means) - min(means)
        out.append((key, spread, sd, spread / sd if sd > 0 else math.inf))
    return out


def core_task_values(runs):
    """{arm: {(task, key): {seed: value}}} of each CORE task's acc and gold bits per byte (`core_tasks`) in the
    eval record of each run's final evaluation (the step of its last val loss); {} where no run logs them."""
    rows = {}
    for run in runs:
        val, path = run.series.get("val"), run.path / "metrics.jsonl"
        if not val or not path.is_file():
            continue
        final = [r for r in read_metrics(path) if r.get("kind") == "eval" and r["step"] == val[-1][0]
                 and isinstance(r.get("core_tasks"), dict)]
        for task, numbers in (final[-1]["core_tasks"] if final else {}).items():
            for key in ("acc", "bpb"):
                if isinstance(numbers.get(key), (int, float)):
                    rows.setdefault(run.arm, {}).setdefault((task, key), {})[run.setting("seed")] = numbers[key]
    return rows


def core_task_snr(runs, arms):
    """[(task, acc's (spread, sd, SNR) or None, bits/byte's or None)] over the arms with 2+ seeds (signal_to_noise
    per task and score)."""
    rows = core_task_values(runs)
    tasks = sorted({task for per in rows.values() for task, _ in per})
    snr = {key: (spread, sd, r) for key, spread, sd, r in
           signal_to_noise(rows, [((task, key), None) for task in tasks for key in ("acc", "bpb")], arms)}
    return [(task, snr.get((task, "acc")), snr.get((task, "bpb"))) for task in tasks
            if (task, "acc") in snr or (task, "bpb") in snr]


def task_section(tasks):
    """The markdown of the per-task signal-to-noise table of a sweep's CORE tasks (none without them)."""
    def cells(x):
        return ["-"] * 2 if x is None else [f"{x[1]:.4g}", f"{x[2]:.2f}"]

    if not tasks:
        return []
    return ["Signal-to-noise per CORE task at the runs' final evaluation (the same definition, from this sweep's "
            "own seeds): which tasks can separate these arms at this scale, on accuracy and on the gold bits per "
            "byte:", "", markdown_table(["task", "acc seed sd", "acc SNR", "bits/byte seed sd", "bits/byte SNR"],
                                        [[task, *cells(acc), *cells(bpb)] for task, acc, bpb in tasks]), ""]


def section(pairs, baselines, snr, names, units):
    """The markdown of the downstream section: the two-way intervals, then the signal-to-noise table."""
    md = []
    rows = [[f"{a} - {baselines[a]}", names.get(m, m), len(p["seeds"]), f"{p['items']:,}", f"{p['mean']:+.4f}",
             f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]", f"{p['df']:.1f}", f"{p['p']:.3g}",
             f"{p['detectable']:.4f} {units.get(m, '')}".rstrip()]
            for a, per in pairs.items() for m, p in per.items()]
    if rows:
        md += ["Downstream differences with seeds and items both sampled (the runs' final items files): the mean of "
               "the per-seed, per-item differences, its 95% interval from the two-way random-effects variance "
               "(MS_seed + MS_item - MS_resid)/(seeds x items) with Satterthwaite's degrees of freedom, and the "
               "smallest true difference it detects with 80% power at alpha 0.05 (coverage measured on simulated "
               "seeds and items: analysis/downstream.py). Exploratory beside the Holm family above:", "",
               markdown_table(["pair", "metric", "seeds", "items", "diff", "95% CI (seeds and items)", "df", "p",
                               "detectable (80%)"], rows), ""]
    if snr:
        md += ["Signal-to-noise per metric (Signal and Noise, Heineman et al. 2025): the spread of the arms' means "
               "(largest - smallest) over the seed sd pooled over arms; below about 1 these seeds cannot order the "
               "arms on that metric, and a metric of higher SNR separates them with fewer seeds:", "",
               markdown_table(["metric", "spread of arm means", "seed sd (pooled)", "SNR"],
                              [[names.get(k, k), f"{spread:.4g}", f"{sd:.4g}", f"{r:.2f}"]
                               for k, spread, sd, r in snr]), ""]
    return md
