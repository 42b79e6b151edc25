"""The literature's one-pass measurements (eval/internals.py, eval/sparsity.py; recorded in metrics.jsonl as
`measure` at every evaluation) read back: one number per measure and run, a table and a figure of runs side by
side, and a sweep's arms against their baselines paired by seed (analysis/sweep_report.py)."""
import statistics

from stats.significance import paired

# name -> (what it is, in a table's words; the number from one `measure` record)
SUMMARIES = {
    "zeros": ("exact zeros among MLP neurons, mean over layers",
              lambda m: statistics.fmean(layer["zeros"] for layer in m["sparsity"].values())),
    "dead": ("dead neurons (0 on every token of the batch), mean over layers",
             lambda m: statistics.fmean(layer["dead"] for layer in m["sparsity"].values())),
    "massive": ("massive activations: max |h| / median |h| of the largest layer",
                lambda m: max(row["ratio"] for row in m["massive"])),
    "attention_entropy": ("attention entropy (nats), mean over layers and heads",
                          lambda m: statistics.fmean(h for layer in m["attention_entropy"] for h in layer)),
    "stream_growth": ("residual stream variance after the last block / after the embeddings",
                      lambda m: m["signal"][-1]["variance"] / m["signal"][0]["variance"]),
}


def last_measure(run):
    """The newest `measure` record of a run (analysis/runs.py RunRecord), or None."""
    return run.measures[-1][2] if run.measures else None


def summarize(run):
    """{measure name: value} of the run's newest record ({} without one)."""
    measure = last_measure(run)
    return {name: value(measure) for name, (_, value) in SUMMARIES.items()} if measure else {}


def paired_differences(per_variant, baselines):
    """{variant: {measure: stats.significance.paired difference (variant - baseline) over the seeds both have}} for every
    variant with a baseline; per_variant: {variant: [runs]}, baselines: {variant: its baseline}."""
    def by_seed(runs, name):
        return {r.setting("seed"): summarize(r)[name] for r in runs if name in summarize(r)}
    out = {}
    for variant, base in baselines.items():
        if base is None or variant == base:
            continue
        out[variant] = {name: paired(by_seed(per_variant[base], name), by_seed(per_variant[variant], name))
                        for name in SUMMARIES}
    return out


def beyond_noise(pair):
    """True when the 95% interval over seeds excludes 0, False when it holds it, None without an interval."""
    ci = pair.get("ci95")
    return None if ci is None else not (ci[0] <= 0 <= ci[1])


def sentences(differences, baselines):
    """One line per variant: the measures that differ from its baseline beyond seed noise, and those that do not."""
    lines = []
    for variant, pairs in differences.items():
        differ = [f"{name} {p['mean']:+.3g} [{p['ci95'][0]:+.3g}, {p['ci95'][1]:+.3g}]"
                  for name, p in pairs.items() if beyond_noise(p)]
        same = [name for name, p in pairs.items() if beyond_noise(p) is False]
        if not differ and not same:
            continue
        lines.append(f"- {variant} - {baselines[variant]}: differs beyond seed noise (95% interval over "
                     f"{len(next(iter(pairs.values()))['seeds'])} seeds excludes 0) in "
                     f"{'; '.join(differ) if differ else 'none'}; within noise: {', '.join(same) or 'none'}")
    return lines


def plot(runs, path):
    """Side by side, each run's newest record: residual variance against depth (signal propagation), exact zeros
    and mean attention entropy per layer; one colour per arm (a sweep's label before its /seedN), its seeds alike."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in runs if last_measure(r)]
    arms = list(dict.fromkeys(r.label.split("/")[0] for r in measured))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in measured:
        m, arm = last_measure(run), run.label.split("/")[0]
        first = run is next(r for r in measured if r.label.split("/")[0] == arm)
        style = dict(color=f"C{arms.index(arm) % 10}", alpha=0.8, marker="o", markersize=3)
        axes[0].plot([row["variance"] for row in m["signal"]], label=arm if first else None, **style)
        axes[1].plot([layer["zeros"] for layer in m["sparsity"].values()], **style)
        axes[2].plot([statistics.fmean(layer) for layer in m["attention_entropy"]], **style)
    axes[0].set(title="residual stream variance", xlabel="depth (0: embeddings)", yscale="log")
    axes[1].set(title="exact zeros among MLP neurons", xlabel="layer")
    axes[2].set(title="attention entropy (nats)", xlabel="layer")
    fig.legend(loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
