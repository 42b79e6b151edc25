"""Compare training runs side by side: a table on stdout and loss/HellaSwag/BLEU curves in one PNG.

    python -m analysis.compare log/gelu log/aglu -o compare.png
    python -m analysis.compare runs/sweep/* --x tokens --smooth 0.95
    python -m analysis.compare log/aglu --telemetry           # also compare_telemetry.png: kappa, lam, rho ... per layer
                                                              # and compare_measures.png (literature_measures.py)
    python analysis/compare.py ../build-nanogpt/log           # build-nanogpt's log.txt reads too
    python -m analysis.compare ../llm.c/log124M log/gelu      # llm.c's main.log too

Each RUN_DIR is a trainer's --out-dir (log.txt / metrics.jsonl / run.json, and hellaswag_*.json from
eval/hellaswag.py, whose numbers get their own columns), a build-nanogpt log directory or llm.c's -o directory.
Runs still training, runs of different lengths and runs without HellaSwag or BLEU are fine. Below the table it names
every setting besides the config (precision, compile, world size x grad accum, versions, GPU, code, a kernel path
changed at a restart) that differs between the runs or within one (analysis/run_setup.py).
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on headless machines
import matplotlib.pyplot as plt

from analysis import literature_measures
from analysis.run_setup import flag_lines
from analysis.runs import RunError, load_runs, markdown_table, metrics_of, summary
from stats.significance import wilson

PANELS = [("train", "train loss"), ("val", "val loss")]  # then a panel per plotted in-loop metric
# measured for every activation (activations/telemetry.py), after each activation's own state in the telemetry figure
MEASURED = ["sparsity", "rho", "rho_prime"]
MEASURED_TITLES = {"sparsity": "sparsity (|y| < 1e-2)", "rho": "measured Var[y]/Var[x]",
                   "rho_prime": "measured E[act'(x)^2]", "product_sparsity": "gated product sparsity"}
GATED = ["product_sparsity"]  # a gated MLP's too: the sparsity of act(x W_gate) * (x W_up)


def ema(values, beta):
    """Bias-corrected exponential moving average (as TensorBoard's smoothing): early points are not pulled to 0."""
    out, avg = [], 0.0
    for i, v in enumerate(values):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _pct_ci(p, ci):
    return "-" if p is None else f"{100 * p:.2f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _hella_eval(record, scoring):
    """'acc / acc_norm' in % of one scoring of an eval/hellaswag.py record."""
    r = (record or {}).get("results", {}).get(scoring)
    return "-" if r is None else f"{100 * r['acc']:.2f} / {100 * r['acc_norm']:.2f}"


def metric_header(metric):
    return f"{metric.label} % [95% CI]" if metric.items else f"{metric.label} (best)"


def metric_cell(run, name):
    """An in-loop metric's last value as its run declares it: a proportion of items in % with the 95% Wilson
    interval eval/hellaswag.py reports, else the value and the run's best, in its format; `-` without one."""
    metric, points = run.metrics.get(name), run.series.get(name)
    if metric is None or not points:
        return "-"
    value = points[-1][1]
    if metric.items:
        return _pct_ci(value, wilson(round(value * metric.items), metric.items))
    best = (max if metric.higher_is_better else min)(p[1] for p in points)
    return f"{value:{metric.fmt}} ({best:{metric.fmt}})"


def table(runs):
    """The comparison table (markdown); metric columns no run has are left out. The in-loop metrics (HellaSwag
    in completion scoring, BLEU, any a trainer declares) come from the training log, shown as each run's run.json
    says; the eval/hellaswag.py columns from the run's hellaswag_*.json (which checkpoint step, how many items)."""
    declared = metrics_of(runs)
    headers = ["run", "act", "seed", "step", "tokens", "final val", "best val (step)", "val bpb",
               *map(metric_header, declared.values()), "hellaswag.py (step, n)", "completion acc / acc_norm %",
               "lm_eval acc / acc_norm %", "tok/s", "ANAct score", "zeros", "massive", "attn entropy",
               "stream growth"]
    rows = []
    for run in runs:
        s, measured = summary(run), literature_measures.summarize(run)
        ev = s["hella_eval"]
        step = "-" if s["step"] is None else (f"{s['step']}/{s['max_steps']}" if s["max_steps"] else str(s["step"]))
        rows.append([s["label"], s["act"] or "-", _fmt(s["seed"], "d"), step, _fmt(s["tokens"], ",d"),
                     _fmt(s["final_val"], ".4f"),
                     "-" if s["best_val"] is None else f"{s['best_val']:.4f} ({s['best_val_step']})",
                     _fmt(s["final_val_bpb"], ".4f"),
                     *(metric_cell(run, name) for name in declared),
                     "-" if ev is None else f"{ev.get('step')}, {ev['n']}",
                     _hella_eval(ev, "completion"), _hella_eval(ev, "lm_eval"),
                     _fmt(s["tok_per_s"], ",.0f"), _fmt(s["anact_score"], ".3f"),
                     *(_fmt(measured.get(name), ".3g") for name in
                       ("zeros", "massive", "attention_entropy", "stream_growth"))])
    keep = [i for i, h in enumerate(headers) if i < 6 or any(row[i] != "-" for row in rows)]  # no empty metric columns
    return markdown_table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows])


def _xs(run, points, x):
    if x == "step":
        return [p[0] for p in points]
    if any(p[2] is None for p in points):
        raise RunError(f"{run.path}: no token counts (no metrics.jsonl or run.json); plot with --x step")
    return [p[2] for p in points]


def plot(runs, out, x="step", smooth=0.9):
    """One PNG with a panel per metric that any run has; returns the path."""
    panels = [*PANELS, *((m.name, m.label) for m in metrics_of(runs).values() if m.plotted)]
    panels = [(name, title) for name, title in panels if any(run.series.get(name) for run in runs)]
    if not panels:
        raise RunError("no train/val/in-loop metric points in any run yet; nothing to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    # the question is "activation A vs B": colour = activation, line style = the run's rank within its activation
    groups = list(dict.fromkeys(run.setting("act") or run.label for run in runs))
    seen = {}
    style = []
    for run in runs:
        group = run.setting("act") or run.label
        style.append((colors[groups.index(group) % len(colors)], styles[seen.get(group, 0) % len(styles)]))
        seen[group] = seen.get(group, 0) + 1
    for ax, (name, title) in zip(axes[0], panels):
        for run, (color, linestyle) in zip(runs, style):
            points = run.series.get(name)
            if not points:
                continue
            xs, ys = _xs(run, points, x), [p[1] for p in points]
            if name == "train" and smooth > 0 and len(ys) > 1:
                ax.plot(xs, ys, color=color, alpha=0.15, linewidth=0.8)
                ax.plot(xs, ema(ys, smooth), color=color, linestyle=linestyle, label=run.label)
            else:
                ax.plot(xs, ys, color=color, linestyle=linestyle, label=run.label,
                        marker="o" if len(ys) < 30 else None, markersize=3)
        ax.set_title(title + (f" (EMA {smooth})" if name == "train" and smooth > 0 else ""))
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_telemetry(runs, out, x="step"):
    """Per-layer trajectories over training (as the APA paper's Fig. 6 for kappa and lambda): a row per run
    with the activation's own state (kappa, lam; alpha, scale, running mu/rho/rho') then the measured
    quantities, a line per layer (dark = first layer)."""
    runs = [run for run in runs if run.telemetry]
    if not runs:
        raise RunError("no run has telemetry records (metrics.jsonl 'telemetry' from evaluations); nothing to plot")
    rows = []
    for run in runs:
        state = []
        for layer in run.telemetry[-1][2]["layers"]:
            state += [key for key in layer.get("params", {}) if key not in state]
        gated = [key for key in GATED if any(key in layer for layer in run.telemetry[-1][2]["layers"])]
        rows.append([("params", key) for key in state] + [(None, key) for key in MEASURED + gated])
    width = max(len(row) for row in rows)
    fig, axes = plt.subplots(len(runs), width, figsize=(3 * width, 2.4 * len(runs)), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax_row, run, quantities in zip(axes, runs, rows):
        points = run.telemetry
        xs = _xs(run, [(step, None, tokens) for step, tokens, _ in points], x)
        n_layers = max(len(t["layers"]) for _, _, t in points)
        for ax, (group, key) in zip(ax_row, quantities):
            for i in range(n_layers):
                ys = [_layer_value(t, i, group, key) for _, _, t in points]
                ax.plot(xs, [float("nan") if y is None else y for y in ys],
                        color=cmap(i / max(1, n_layers - 1)), label=f"layer {i}", linewidth=1.2)
            ax.set_title(f"{run.label}: {key if group else MEASURED_TITLES[key]}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in ax_row[len(quantities):]:
            ax.set_axis_off()
        ax_row[0].legend(fontsize=6)
        ax_row[0].set_xlabel(x, fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _layer_value(telemetry, i, group, key):
    layers = telemetry["layers"]
    if i >= len(layers):
        return None
    value = (layers[i].get(group, {}) if group else layers[i]).get(key)
    return value if isinstance(value, (int, float)) else None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or their log.txt)")
    p.add_argument("-o", "--output", default="compare.png", help="PNG to write (default: %(default)s)")
    p.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis (default: %(default)s)")
    p.add_argument("--smooth", type=float, default=0.9,
                   help="EMA factor for the train loss in [0, 1); 0 plots it raw (default: %(default)s)")
    p.add_argument("--telemetry", action="store_true",
                   help="also plot per-layer activation telemetry to OUTPUT's name + _telemetry.png, and the "
                        "literature's measurements (signal propagation, zeros, attention entropy) to + _measures.png")
    args = p.parse_args(argv)
    if not 0 <= args.smooth < 1:
        p.error(f"--smooth {args.smooth}: must lie in [0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        runs = load_runs(args.runs)
        print(table(runs))
        flags = flag_lines(runs)
        if flags:
            print("\nSettings besides the config that differ between runs or within one (run.json):", *flags, sep="\n")
        print(f"wrote {plot(runs, args.output, args.x, args.smooth)}")
        if args.telemetry:
            out = Path(args.output)
            print(f"wrote {plot_telemetry(runs, out.with_name(out.stem + '_telemetry.png'), args.x)}")
            if any(run.measures for run in runs):
                literature_measures.plot(runs, out.with_name(out.stem + "_measures.png"))
                print(f"wrote {out.with_name(out.stem + '_measures.png')}")
    except RunError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
