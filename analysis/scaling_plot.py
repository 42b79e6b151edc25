"""The figure of stats/scaling.py's result: what X is worth in compute, and whether that holds as models grow.

Left, loss against training compute (log axis) per arm: the mean over seeds at each ladder size with a bar from the
lowest to the highest seed, and the shared fit's curve over the ladder. Right, each arm's compute multiplier over the
baseline: the shared fit's one number as a band across the ladder, the curve-free multiplier at each size with its
interval, the trend fit as a line, 1 (no gain) as a line. A target is drawn only where asked for, and one beyond the
ladder's reach is drawn hollow and labelled "extrapolation".
"""
import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import LogLocator, NullFormatter


def plot_scaling(result, out):
    """result: fit_ladder (stats/ladder_fit.py)'s dict; writes the PNG to `out` and returns it."""
    fig, (loss_ax, mult_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {a: palette[i % len(palette)] for i, a in enumerate(result["arms"])}
    target = result["target"]
    for a, fit in result["arms"].items():
        compute = np.array([p["compute"] for p in fit["points"]])
        mean = np.array([p["mean"] for p in fit["points"]])
        # a mean can sit a rounding step outside its seeds' range when they are all equal: bars of at least 0
        spread = np.maximum([mean - [p["low"] for p in fit["points"]], [p["high"] for p in fit["points"]] - mean], 0)
        loss_ax.errorbar(compute, mean, yerr=spread, fmt="o", color=colors[a], capsize=3, markersize=4, label=a)
        inside = np.geomspace(compute.min(), compute.max(), 60)
        loss_ax.plot(inside, fit["E"] + fit["A"] * inside ** -fit["alpha"], color=colors[a])
    top = max(p["compute"] for f in result["arms"].values() for p in f["points"])
    low = min(p["compute"] for f in result["arms"].values() for p in f["points"])
    for a, m in result["multipliers"].items():
        f = m["average"]
        mult_ax.fill_between([low, top], *f["ci"], color=colors[a], alpha=0.15, linewidth=0)
        mult_ax.plot([low, top], [f["multiplier"]] * 2, color=colors[a], label=f"{a} over {result['baseline']}")
        rows = [r for r in m["at_sizes"] if r["curve_free"] is not None and None not in r["curve_free_ci"]]
        if rows:
            value = np.array([r["curve_free"] for r in rows])
            err = np.maximum([value - [r["curve_free_ci"][0] for r in rows],
                              [r["curve_free_ci"][1] for r in rows] - value], 0)
            mult_ax.errorbar([r["compute"] for r in rows], value, yerr=err, fmt="o", color=colors[a], capsize=3,
                             markersize=4)
        curve = [r for r in m["curve"] if r["multiplier"] is not None and r["compute"] <= top]
        if curve:
            mult_ax.plot([r["compute"] for r in curve], [r["multiplier"] for r in curve], color=colors[a],
                         linestyle="--", linewidth=0.8)
        t = m["target"]
        if t and t["multiplier"] is not None:
            err = None if None in t["ci"] else np.maximum([[t["multiplier"] - t["ci"][0]],
                                                           [t["ci"][1] - t["multiplier"]]], 0)
            mult_ax.errorbar(t["compute"], t["multiplier"], yerr=err, fmt="s", capsize=4, color=colors[a],
                             markerfacecolor="none" if target["extrapolation"] else colors[a])
    mult_ax.axhline(1, color="k", linewidth=0.8)
    mult_ax.set_yscale("log")
    for ax in (loss_ax, mult_ax):
        ax.set_xscale("log")
        # a ladder spans one or two decades: matplotlib then labels the minor ticks too, and their labels overlap
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 3.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("training compute C (FLOPs)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if target:
        mult_ax.annotate(target["name"] + (" (extrapolation)" if target["extrapolation"] else ""),
                         (target["compute"], 0.02), xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                         va="bottom", ha="right")
    loss_ax.set_ylabel("final loss")
    loss_ax.set_title("loss vs compute: mean and seed range, shared fit", fontsize=9)
    mult_ax.set_ylabel(f"compute multiplier over {result['baseline']}")
    mult_ax.set_title(f"ladder average (band: {result['confidence']:.0%}), curve-free points, "
                      f"{result['form']} fit (dashed)",
                      fontsize=9)
    fig.suptitle(result["form_text"], fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
