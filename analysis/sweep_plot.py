"""A sweep's compare.png: the picture a reader of a paper wants of "does X beat the baseline by more than noise".

Top, one mean curve per variant with a band spanning its seeds (min to max), for the train loss (EMA) and
the val loss, zoomed to the second half of training where differences of 0.01 nats are visible. Below, per
metric, a dot plot of each variant's paired difference to its baseline with its 95% interval, and a grey bar
of ± the difference those seeds detect at 80% power: an interval inside the grey bar says "not resolved",
not "no difference". HellaSwag pairs with items files also show, in grey below, the item-level interval.
"""
import math

import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from analysis.compare import ema
from analysis.runs import RunError

CURVES = [("train", "train loss (EMA {smooth}), 2nd half"), ("val", "val loss, 2nd half")]
DOTS = [("final_val", "final val loss - baseline\n(negative is better)")]  # then each plotted in-loop metric's


def _mean_band(runs, name, smooth):
    """(steps, mean, low, high) over the steps every run logged; the train loss EMA-smoothed per run first."""
    per_run = []
    for run in runs:
        points = run.series.get(name) or []
        ys = [p[1] for p in points]
        if name == "train" and smooth > 0 and len(ys) > 1:
            ys = ema(ys, smooth)
        per_run.append(dict(zip((p[0] for p in points), ys)))
    steps = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    cols = [[r[s] for r in per_run] for s in steps]
    return steps, [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def _zoom(ax, curves):
    """x from half the longest run, y from what the curves show there."""
    last = max(steps[-1] for steps, *_ in curves)
    shown = [y for steps, _, low, high in curves for s, lo, hi in zip(steps, low, high) if s >= last / 2
             for y in (lo, hi)]
    ax.set_xlim(last / 2, last * 1.01)
    if shown:
        pad = (max(shown) - min(shown)) * 0.08 or 0.01
        ax.set_ylim(min(shown) - pad, max(shown) + pad)


def _dots(ax, result, key, colors):
    pairs = [(a, p[key]) for a, p in result["paired"].items() if p.get(key) and p[key]["mean"] is not None]
    labels, item_label = [], "item-level 95% CI (another sample of items)"
    for row, (a, p) in enumerate(pairs):
        y = len(pairs) - 1 - row
        if p["detectable"] is not None:
            ax.barh(y, 2 * p["detectable"], left=-p["detectable"], height=0.5, color="0.85", zorder=1,
                    label="± detectable with these seeds (80% power)" if row == 0 else None)
        err = None if p["ci95"] is None else [[p["mean"] - p["ci95"][0]], [p["ci95"][1] - p["mean"]]]
        ax.errorbar(p["mean"], y, xerr=err, fmt="o", color=colors[a], capsize=4, zorder=3,
                    label="mean, 95% CI over seeds" if row == 0 else None)
        items = p.get("item_level")
        if items and items["ci95"] is not None:  # drawn just below the seeds' interval, same difference
            lo, hi = items["ci95"]
            ax.errorbar(items["mean"], y - 0.22, xerr=[[items["mean"] - lo], [hi - items["mean"]]], fmt="s",
                        markersize=3, color="0.35", capsize=3, zorder=3, label=item_label)
            item_label = None
        control = " (A/A)" if a == result.get("control") else ""
        labels.append(f"{a} - {result['baselines'][a]}{control}\nn={p['n']}")
    ax.axvline(0, color="k", linewidth=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.set_yticks(range(len(pairs)), labels[::-1], fontsize=8)
    ax.set_ylim(-0.6, len(pairs) - 0.4)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)


def plot_sweep(groups, result, out, metrics=(), smooth=0.9):
    """groups: {variant: [finished runs]} in report order; result: the report's sweep.json dict; metrics: the
    plotted in-loop Metrics the runs declare."""
    groups = {a: runs for a, runs in groups.items() if runs}
    curves = [(name, title) for name, title in CURVES if any(r.series.get(name) for rs in groups.values() for r in rs)]
    dots = [*DOTS, *((m.name, f"{m.label} - baseline\n({'positive' if m.higher_is_better else 'negative'} is better)")
                     for m in metrics)]
    dots = [(key, title) for key, title in dots
            if any(p.get(key) and p[key]["mean"] is not None for p in result["paired"].values())]
    if not curves:
        raise RunError("no finished run with train or val points yet; nothing to plot")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {a: palette[i % len(palette)] for i, a in enumerate(groups)}
    # curves on top, dot plots below, each row split evenly
    width = math.lcm(len(curves), len(dots) or 1)
    fig = plt.figure(figsize=(11, 4 + 0.55 * max(len(result["paired"]), 4) if dots else 4.2))
    grid = fig.add_gridspec(2 if dots else 1, width, height_ratios=[1, 1.15] if dots else None)
    step = width // len(curves)
    curve_axes = [fig.add_subplot(grid[0, i * step:(i + 1) * step]) for i in range(len(curves))]
    step = width // (len(dots) or 1)
    dot_axes = [fig.add_subplot(grid[1, i * step:(i + 1) * step]) for i in range(len(dots))]
    for ax, (name, title) in zip(curve_axes, curves):
        drawn = []
        for a, runs in groups.items():
            steps, mean, low, high = _mean_band(runs, name, smooth)
            if not steps:
                continue
            ax.fill_between(steps, low, high, color=colors[a], alpha=0.18, linewidth=0)
            ax.plot(steps, mean, color=colors[a], label=f"{a} ({len(runs)} seed{'s' * (len(runs) != 1)})",
                    linestyle="--" if a == result.get("control") else "-",
                    marker="o" if len(steps) < 30 else None, markersize=3)
            drawn.append((steps, mean, low, high))
        if drawn:
            _zoom(ax, drawn)
        ax.set_title(title.format(smooth=smooth), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax, (key, title) in zip(dot_axes, dots):
        _dots(ax, result, key, colors)
        ax.set_title(title, fontsize=10)
    fig.suptitle("curves: mean over seeds, band from the lowest to the highest seed; below: paired difference "
                 "to the baseline, mean and 95% interval", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
