"""The figure of analysis/scaling.py's result: what X is worth in compute, and whether that holds as models grow.

Left, loss against training compute (log axis) per arm: the mean over seeds at each ladder size with a bar from the
lowest to the highest seed, and the fitted curve drawn out to the target compute (dashed beyond the ladder: an
extrapolation). Right, each arm's compute multiplier over the baseline against compute with its bootstrap band,
1 (no gain) as a line, the ladder's largest size as a dotted line and the target as a point with its interval.
"""
import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines
import matplotlib.pyplot as plt
import numpy as np


def _curve(fit, compute):
    return fit["E"] + fit["A"] * compute ** -fit["alpha"]


def plot_scaling(result, out):
    """result: fit_ladder's dict; writes the PNG to `out` and returns it."""
    fig, (loss_ax, mult_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {a: palette[i % len(palette)] for i, a in enumerate(result["arms"])}
    target = result["target"]
    top = max(p["compute"] for f in result["arms"].values() for p in f["points"])
    for a, fit in result["arms"].items():
        compute = np.array([p["compute"] for p in fit["points"]])
        mean = np.array([p["mean"] for p in fit["points"]])
        spread = [mean - [p["low"] for p in fit["points"]], [p["high"] for p in fit["points"]] - mean]
        loss_ax.errorbar(compute, mean, yerr=spread, fmt="o", color=colors[a], capsize=3, markersize=4,
                         label=f"{a} (alpha {fit['alpha']:.3g})")
        if fit["alpha"] is not None:
            inside = np.geomspace(compute.min(), top, 60)
            loss_ax.plot(inside, _curve(fit, inside), color=colors[a])
            if target and target["compute"] > top:
                beyond = np.geomspace(top, target["compute"], 30)
                loss_ax.plot(beyond, _curve(fit, beyond), color=colors[a], linestyle="--")
    for a, m in result["multipliers"].items():
        curve = [row for row in m["curve"] if row["multiplier"] is not None]
        compute = [row["compute"] for row in curve]
        for part, style in ((lambda c: c <= top, "-"), (lambda c: c >= top, "--")):  # measured, extrapolated
            rows = [row for row in curve if part(row["compute"])]
            mult_ax.plot([row["compute"] for row in rows], [row["multiplier"] for row in rows], color=colors[a],
                         linestyle=style, label=f"{a} over {result['baseline']}: {m['trend']['verdict']}"
                         if style == "-" else None)
        band = [(row["compute"], *row["ci"]) for row in curve if None not in row["ci"]]
        if band:
            mult_ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=colors[a],
                                 alpha=0.2, linewidth=0)
        mult_ax.plot([row["compute"] for row in m["at_sizes"]], [row["multiplier"] for row in m["at_sizes"]], "o",
                     color=colors[a], markersize=4)
        t = m["target"]
        if t and t["multiplier"] is not None:
            err = None if None in t["ci"] else [[t["multiplier"] - t["ci"][0]], [t["ci"][1] - t["multiplier"]]]
            mult_ax.errorbar(t["compute"], t["multiplier"], yerr=err, fmt="s", color=colors[a], capsize=4)
    mult_ax.axhline(1, color="k", linewidth=0.8)
    # a ratio: 0.5x and 2x as far from 1; the axis spans the measured sizes and the target, not an extrapolation
    # that runs off to 0 or infinity where a fitted curve crosses the baseline's floor E
    shown = [v for m in result["multipliers"].values() for row in m["at_sizes"] + [m["target"] or {}]
             for v in [row.get("multiplier")] if v is not None and 0 < v < float("inf")]
    mult_ax.set_yscale("log")
    if shown:
        mult_ax.set_ylim(max(min(shown) / 3, 1e-4), min(max(shown) * 3, 1e4))
    for ax in (loss_ax, mult_ax):
        ax.set_xscale("log")
        ax.set_xlabel("training compute C (FLOPs)")
        ax.axvline(top, color="0.5", linestyle=":", linewidth=0.8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if target:
        mult_ax.annotate(target["name"], (target["compute"], 0.02), xycoords=("data", "axes fraction"), fontsize=7,
                         rotation=90, va="bottom", ha="right")
    loss_ax.set_ylabel("final loss")
    loss_ax.set_title("loss vs compute: mean and seed range, fit (dashed: extrapolated)", fontsize=9)
    mult_ax.set_ylabel(f"compute multiplier over {result['baseline']}")
    mult_ax.set_title(f"multiplier and its {result['confidence']:.0%} bootstrap band over seeds", fontsize=9)
    fig.suptitle(result["form_text"], fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
