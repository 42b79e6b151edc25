"""lr_grid.png: final loss against learning rate, every arm on one panel per size with a grid (stats/lr_grid.py).

Each arm's mean over seeds at each lr with a bar of ± the seeds' std, its best lr ringed; a diverged
point is left out of the line and marked at the top of the panel.
"""
import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines
import matplotlib.pyplot as plt


def plot_lr_grid(compared, out):
    """compared: {size label: lr_grid.compare's dict}; writes the PNG to `out` and returns it."""
    fig, axes = plt.subplots(1, len(compared), figsize=(5.5 * len(compared), 4), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (size, result) in zip(axes[0], compared.items()):
        for i, (arm, picked) in enumerate(result["picks"].items()):
            color = palette[i % len(palette)]
            rows = [r for r in picked["grid"] if not r["diverged"]]
            ax.errorbar([r["lr"] for r in rows], [r["mean"] for r in rows], yerr=[r["std"] or 0 for r in rows],
                        marker="o", markersize=4, capsize=3, color=color,
                        label=f"{arm}: best {picked['best_lr']:g}{' (edge)' if picked['edge'] else ''}")
            best = next(r for r in picked["grid"] if r["lr"] == picked["best_lr"])
            ax.plot(best["lr"], best["mean"], "o", markersize=11, markerfacecolor="none", color=color)
            for r in picked["grid"]:
                if r["diverged"]:
                    ax.annotate("x diverged", (r["lr"], 1), xycoords=("data", "axes fraction"), color=color,
                                fontsize=7, va="top")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate (GPT: max_lr)")
        ax.set_ylabel("final val loss: mean, bar = seed std")
        ax.set_title(f"{size}: best lr per arm ringed", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
