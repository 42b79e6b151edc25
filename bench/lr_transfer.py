"""Does one lr serve every size? Reads an lr-transfer sweep (configs/lr_transfer_cpu.toml: arms x param x shapes x
lrs) and gives each cell's (arm, param, shape) optimum lr, the drift of the optimum across the depths and across the
widths, and one overlay figure per axis (experiments/lr_transfer.md).

    python bench/lr_transfer.py runs/lr_transfer --out experiments     # table and drift on stdout, 2 PNGs, a JSON
    python bench/lr_transfer.py runs/lr_transfer_gated --out experiments --name lr_transfer_gated   # other files
    python bench/lr_transfer.py --smoke --out log/lr_transfer_smoke    # seconds: synthetic curves of known optima

A cell's optimum: the vertex of a parabola in log2 lr fitted to the final val loss at the grid's lowest point and up to
two neighbours each side (3-5 points; a least-squares fit, so one noisy point moves it less than the 3-point
interpolation of stats/lr_grid.py). A lowest point at the grid's edge has no vertex: the optimum lies beyond the grid,
and the cell's lr is that edge, flagged (its drift is then a bound, not a measurement). A diverged run (non-finite
loss) counts as the worst point. Drift: the largest over the smallest optimum across an axis's shapes, per arm and
param. Axes: the shapes at the base width (depth varies) and those at the base depth (width varies).
"""
import argparse
import json
import math
from pathlib import Path

import numpy as np

from analysis.runs import RunError, finished, load_run, summary
from errors import ConfigError

BASE_WIDTH, BASE_DEPTH = 64, 4
HALF_WINDOW = 2  # points each side of the lowest in the parabola's fit


def read_cells(out_dir, seeds=None):
    """({(act, param, n_layer, n_embd): {lr: final val loss, mean over seeds}}, {that key: the seeds averaged}) of
    the finished runs under out_dir (seeds: only these). A cell averages the seeds finished at every lr of its grid,
    and a cell without a finished run at every lr of the sweep is left out: a sweep still running reads as its
    finished cells."""
    runs = {}
    for path in sorted(p for p in Path(out_dir).iterdir() if finished(p)):
        try:
            run = load_run(path)
        except RunError as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        if seeds and run.setting("seed") not in seeds:
            continue
        loss = summary(run)["final_val"]
        key = (run.setting("act"), run.setting("param") or "sp", run.setting("n_layer"), run.setting("n_embd"))
        runs.setdefault(key, {}).setdefault(run.lr, {})[run.setting("seed")] = math.inf if loss is None else loss
    cells, cell_seeds = {}, {}
    sweep_lrs = set().union(*runs.values())
    for key, grid in runs.items():
        if set(grid) != sweep_lrs:
            continue
        common = sorted(set.intersection(*(set(by_seed) for by_seed in grid.values())))
        if common:
            cells[key] = {lr: float(np.mean([by_seed[s] for s in common])) for lr, by_seed in grid.items()}
            cell_seeds[key] = common
    if not cells:
        raise ConfigError(f"{out_dir}: no finished runs (run.json with its final evaluation) here")
    return cells, cell_seeds


def optimum(grid):
    """{"lr": the fitted vertex, or the edge lr; "edge": "low", "high" or None; "points": lrs fitted} of {lr: loss}."""
    lrs = sorted(grid)
    if len(lrs) < 3:
        raise ConfigError(f"a grid of {len(lrs)} lrs has no vertex; run at least 3, log-spaced")
    losses = np.array([grid[lr] for lr in lrs])
    worst = np.max(losses[np.isfinite(losses)], initial=0.0)
    losses = np.where(np.isfinite(losses), losses, worst)
    best = int(np.argmin(losses))
    if best in (0, len(lrs) - 1):
        return {"lr": lrs[best], "edge": "low" if best == 0 else "high", "points": [lrs[best]]}
    window = slice(max(0, best - HALF_WINDOW), min(len(lrs), best + HALF_WINDOW + 1))
    x = np.log2(lrs[window])
    a, b, _ = np.polyfit(x, losses[window], 2)
    # a parabola opening downwards, or a vertex outside the fitted points, says the points are not a minimum's
    # neighbourhood: the lowest point is then the best estimate
    vertex = -b / (2 * a) if a > 0 else None
    lr = 2 ** vertex if vertex is not None and x[0] <= vertex <= x[-1] else lrs[best]
    return {"lr": float(lr), "edge": None, "points": lrs[window]}


def axes(cells):
    """{axis: {(act, param): {shape label: cell key}}}: depth at the base width, width at the base depth."""
    out = {"depth": {}, "width": {}}
    for key in cells:
        act, param, depth, width = key
        if width == BASE_WIDTH:
            out["depth"].setdefault((act, param), {})[f"d{depth}"] = key
        if depth == BASE_DEPTH:
            out["width"].setdefault((act, param), {})[f"w{width}"] = key
    return out


def analyse(cells):
    """{"optima": {cell key: optimum}, "drift": {axis: {(act, param): {"ratio", "bound", "optima"}}}}."""
    optima = {key: optimum(grid) for key, grid in cells.items()}
    drift = {}
    for axis, groups in axes(cells).items():
        for group, shapes in groups.items():
            if len(shapes) < 2:
                continue
            lrs = {shape: optima[key]["lr"] for shape, key in sorted(shapes.items(), key=lambda s: cells_order(s[1]))}
            drift.setdefault(axis, {})[group] = {
                "ratio": max(lrs.values()) / min(lrs.values()), "optima": lrs,
                "bound": any(optima[key]["edge"] for key in shapes.values())}
    return {"optima": optima, "drift": drift}


def cells_order(key):
    return key[2], key[3]


def table(cells, result, cell_seeds):
    """Markdown: every cell's optimum, then the drift per axis, arm and param."""
    lines = ["| arm | param | depth | width | seeds | optimum lr | fitted on | best grid lr | its loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells, key=lambda k: (k[0], k[1], k[2], k[3])):
        o = result["optima"][key]
        where = f"grid edge ({o['edge']})" if o["edge"] else f"{len(o['points'])} points"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {','.join(map(str, cell_seeds[key]))} | "
                     f"{o['lr']:.2e} | {where} | {min(cells[key], key=cells[key].get):g} | "
                     f"{min(cells[key].values()):.4f} |")
    lines += ["", "| axis | arm | param | optima (lr) | drift max/min |", "|---|---|---|---|---|"]
    for axis, groups in result["drift"].items():
        for (act, param), d in sorted(groups.items()):
            optima = ", ".join(f"{shape} {lr:.2e}" for shape, lr in d["optima"].items())
            bound = " (an edge: at least)" if d["bound"] else ""
            lines.append(f"| {axis} | {act} | {param} | {optima} | {d['ratio']:.2f}x{bound} |")
    return "\n".join(lines)


def plot(cells, result, out, name="lr_transfer"):
    """{name}_{axis}.png: loss against lr, a curve per shape, a panel per (param, arm); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on headless machines
    import matplotlib.pyplot as plt

    paths, grid_lrs = [], sorted({lr for grid in cells.values() for lr in grid})
    for axis, groups in axes(cells).items():
        acts = sorted({act for act, _ in groups})
        params = sorted({param for _, param in groups}, key=lambda p: p != "sp")
        fig, grid = plt.subplots(len(params), len(acts), figsize=(4.2 * len(acts), 3.4 * len(params)),
                                 squeeze=False, sharex=True)
        for row, param in enumerate(params):
            for col, act in enumerate(acts):
                ax = grid[row][col]
                for i, (shape, key) in enumerate(sorted(groups.get((act, param), {}).items(),
                                                        key=lambda s: cells_order(s[1]))):
                    lrs = sorted(cells[key])
                    color = plt.cm.viridis(i / 2.5)
                    ax.plot(lrs, [cells[key][lr] for lr in lrs], "o-", color=color, markersize=3.5, label=shape)
                    o = result["optima"][key]
                    ax.axvline(o["lr"], color=color, ls=":" if o["edge"] else "--", lw=1)
                d = result["drift"].get(axis, {}).get((act, param))
                drift = f": drift {d['ratio']:.1f}x{' (edge)' if d['bound'] else ''}" if d else ""
                ax.set_title(f"{act}, {param}{drift}", fontsize=9)
                ax.set_xscale("log", base=2)
                ax.set_xticks(grid_lrs, [f"{lr:g}" for lr in grid_lrs], fontsize=7)
                ax.minorticks_off()
                ax.grid(alpha=0.3, which="both")
                ax.legend(fontsize=7)
                if col == 0:
                    ax.set_ylabel("final val loss (nats/byte)")
                if row == len(params) - 1:
                    ax.set_xlabel("max_lr (dashed: fitted optimum; dotted: grid edge)")
        fig.suptitle(f"lr transfer across {axis} ({'width' if axis == 'depth' else 'depth'} "
                     f"{BASE_WIDTH if axis == 'depth' else BASE_DEPTH}); completep base width {BASE_WIDTH}, "
                     f"depth {BASE_DEPTH}", fontsize=10)
        fig.tight_layout()
        path = Path(out) / f"{name}_{axis}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def synthetic_cells():
    """Parabolic curves with known optima: sp's optimum halving per doubling of size, completep's fixed at 4e-3
    (the same optimum as the base at every size); one sp cell's optimum beyond the grid's top."""
    lrs = [1e-3 * 2 ** i for i in range(6)]
    cells = {}
    for param in ("sp", "completep"):
        for depth, width in ((2, 64), (4, 64), (8, 64), (4, 32), (4, 128)):
            size = math.log2(depth / BASE_DEPTH) + math.log2(width / BASE_WIDTH)
            best = math.log2(4e-3) - (size if param == "sp" else 0) + (3 if (param, depth) == ("sp", 2) else 0)
            cells[("gelu", param, depth, width)] = {lr: 2.5 + 0.1 * (math.log2(lr) - best) ** 2 for lr in lrs}
    return cells


def smoke():
    """The analysis on synthetic_cells: each optimum recovered, the edge flagged, completep's drift 1x, sp's 4x."""
    cells = synthetic_cells()
    result = analyse(cells)
    assert math.isclose(result["optima"][("gelu", "completep", 8, 64)]["lr"], 4e-3, rel_tol=1e-6), result
    assert math.isclose(result["optima"][("gelu", "sp", 4, 128)]["lr"], 2e-3, rel_tol=1e-6), result
    assert result["optima"][("gelu", "sp", 2, 64)]["edge"] == "high", result
    assert math.isclose(result["drift"]["width"][("gelu", "completep")]["ratio"], 1.0, rel_tol=1e-6), result
    assert math.isclose(result["drift"]["width"][("gelu", "sp")]["ratio"], 4.0, rel_tol=1e-6), result
    return cells, result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?", help="the sweep's --out-dir")
    p.add_argument("--out", default="experiments", help="the PNGs' and the JSON's folder")
    p.add_argument("--name", default="lr_transfer", help="the files' stem: NAME_depth.png, NAME_width.png, NAME.json")
    p.add_argument("--seeds", help="comma-separated: only these seeds' runs (default: every seed finished)")
    p.add_argument("--smoke", action="store_true", help="synthetic curves of known optima instead of runs")
    args = p.parse_args()
    if not args.smoke and not args.out_dir:
        p.error("name the sweep's directory (or --smoke)")
    if args.smoke:
        cells, result = smoke()
        cell_seeds = {key: [1] for key in cells}
    else:
        cells, cell_seeds = read_cells(args.out_dir, args.seeds and {int(s) for s in args.seeds.split(",")})
        result = analyse(cells)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(table(cells, result, cell_seeds))
    for path in plot(cells, result, args.out, args.name):
        print(f"wrote {path}")
    record = {"optima": [{"act": k[0], "param": k[1], "n_layer": k[2], "n_embd": k[3], "seeds": cell_seeds[k], **o,
                          "losses": {f"{lr:g}": loss for lr, loss in sorted(cells[k].items())}}
                         for k, o in result["optima"].items()],
              "drift": [{"axis": axis, "act": act, "param": param, **d}
                        for axis, groups in result["drift"].items() for (act, param), d in groups.items()]}
    (Path(args.out) / f"{args.name}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
