"""The report of a ladder: each arm at its best learning rate, its gain as a compute multiplier, and the trend.

Every number comes from the runs' own run.json and metrics.jsonl, never from directory names, so runs made by hand
or on other machines report alike: the arm is the model options besides the shape (act, act_kwargs, norm, ...: an
option that differs between runs is named in the label, e.g. gelu+norm=rmsnorm) and the init seed offset, the size
is (n_layer, n_embd, n_head), the lr max_lr (translation: lr), the seed run.seed, the loss the final val loss of a
finished run and the compute the `flops` of its last eval record (model.py's flops_per_token times the tokens).

Several lrs at a size: analysis/lr_grid.py picks each arm's best lr there and compares the arms paired by seed, each
at its best lr and all at the baseline's best lr (a common lr); lr_grid.png draws loss against lr. Several sizes:
analysis/scaling.py fits L(C) per arm over the sizes, each arm at its best lr of a size's grid (or the one lr it ran
there), and gives the multiplier with its bootstrap interval and its trend; scaling.png. The wall-clock multiplier
needs throughput measured interleaved on one machine (bench/train_step.py --shape ... --json FILE, given as
--throughput FILE); without it the report says "wall-clock: not measured".
"""
import json
import statistics
from pathlib import Path

from analysis import lr_grid, scaling
from analysis.lr_grid_plot import plot_lr_grid
from analysis.runs import RunError, load_run, markdown_table, read_metrics, summary
from analysis.scaling_plot import plot_scaling
from analysis.sweep_report import finished
from errors import ConfigError

SHAPE = ("n_layer", "n_embd", "n_head")
NOT_ARM = (*SHAPE, "block_size", "vocab_size")  # the model options that are the size's or the data's, not the arm's
N_RESAMPLES = 2000  # bootstrap resamples of the fit's intervals (scaling.fit_ladder's default)


def size_label(size):
    return "L{}-d{}-h{}".format(*size)


def _text(value):
    """An option's value in an arm label: rmsnorm, 1000000, {"impl":"torch"}."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def run_dirs(out):
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and
                  ((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file()))


def read_points(out):
    """([{arm, size, lr, seed, loss, compute, path}] of the finished runs with a run.json, [unfinished paths])."""
    points, unfinished, identities = [], [], []
    for path in run_dirs(out):
        run = load_run(path)
        if run.config is None:
            continue
        if not finished(path):
            unfinished.append(path.name)
            continue
        model = run.config.get("model", {})
        identity = {k: v for k, v in model.items() if k not in NOT_ARM}
        identity["init_seed_offset"] = run.setting("init_seed_offset") or 0
        flops = [r["flops"] for r in read_metrics(path / "metrics.jsonl") if r.get("kind") == "eval" and "flops" in r] \
            if (path / "metrics.jsonl").is_file() else []
        identities.append(identity)
        points.append({"size": tuple(model.get(k) for k in SHAPE), "lr": run.setting("max_lr") or run.setting("lr"),
                       "seed": run.setting("seed"), "loss": summary(run)["final_val"],
                       "compute": flops[-1] if flops else None, "path": path.name})
    varying = [k for k in dict.fromkeys(k for i in identities for k in i)
               if k != "act" and len({json.dumps(i.get(k), sort_keys=True) for i in identities}) > 1]
    for point, identity in zip(points, identities):
        point["arm"] = str(identity.get("act")) + "".join(f"+{k}={_text(identity.get(k))}" for k in varying)
    return points, unfinished


def is_ladder(out):
    """Whether a sweep directory holds a ladder plan's runs, or finished runs of several sizes or several lrs."""
    plan = Path(out) / "sweep_plan.json"
    if plan.is_file() and json.loads(plan.read_text()).get("ladder"):
        return True
    try:
        points, _ = read_points(out)
    except RunError:
        return False
    return len({p["size"] for p in points}) > 1 or len({p["lr"] for p in points}) > 1


def cells(points):
    """{size: {arm: {lr: {seed: point}}}}"""
    out = {}
    for p in points:
        out.setdefault(p["size"], {}).setdefault(p["arm"], {}).setdefault(p["lr"], {})[p["seed"]] = p
    return out


def throughput_ratios(files, ladder_compute, baseline):
    """{"ratio": {arm: {C: compute-per-second ratio to the baseline}}, "source"} from bench/train_step.py --json
    files, each of one ladder size (its "shape"); a file whose shape or arms the ladder lacks is an error."""
    ratios, sources = {}, []
    for file in files:
        try:
            bench = json.loads(Path(file).read_text())
            shape = tuple(bench["shape"][k] for k in SHAPE)
            speed = {r["contender"]["act"]: r["tok_per_s"] * r["flops_per_token"] for r in bench["results"].values()}
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(f"--throughput {file}: not a JSON of bench/train_step.py --shape ... --json") from None
        if shape not in ladder_compute:
            raise ConfigError(f"--throughput {file}: measured at {size_label(shape)}, not a size of this ladder "
                              f"({', '.join(size_label(s) for s in ladder_compute)}); benchmark at a ladder size")
        if baseline not in speed:
            raise ConfigError(f"--throughput {file}: no contender {baseline}; time the baseline beside the arms")
        for arm, compute in ladder_compute[shape].items():
            if arm in speed and arm != baseline:
                ratios.setdefault(arm, {})[compute] = speed[arm] / speed[baseline]
        sources.append(f"{file}: bench/train_step.py on {bench.get('device')}, median of interleaved rounds "
                       f"at {size_label(shape)}")
    return {"ratio": ratios, "source": "; ".join(sources)}


def ladder_report(out_dir, baseline=None, throughput=None):
    """Writes sweep.md, sweep.json, lr_grid.png (several lrs) and scaling.png (several sizes); returns the markdown."""
    out = Path(out_dir)
    try:
        points, unfinished = read_points(out)
        return _report(out, points, unfinished, baseline, throughput or [])
    except (RunError, ConfigError) as e:
        raise SystemExit(f"error: {out}: {e}") from None


def _report(out, points, unfinished, baseline, throughput):
    plan = json.loads((out / "sweep_plan.json").read_text()) if (out / "sweep_plan.json").is_file() else {}
    arms = sorted({p["arm"] for p in points})
    baseline = baseline or plan.get("baseline") or ("gelu" if "gelu" in arms else arms[0])
    if baseline not in arms:
        raise ConfigError(f"baseline {baseline!r} is not an arm of these runs ({', '.join(arms)}); name one with "
                          "--baseline")
    arms = [baseline] + [a for a in arms if a != baseline]
    by_size = cells(points)
    sizes = sorted(by_size, key=lambda s: tuple(x or 0 for x in s))
    md = [f"# Ladder {out}", "", f"Runs read from their own run.json and metrics.jsonl: {len(points)} finished, "
          f"arms {', '.join(arms)} (baseline {baseline}), sizes {', '.join(size_label(s) for s in sizes)}.", ""]
    if unfinished:
        md += [f"Unfinished (left out): {', '.join(unfinished)}", ""]
    rows = [[size_label(s), a, f"{lr:g}", len(seeds), f"{statistics.mean(p['loss'] for p in seeds.values()):.4f}",
             "-" if None in [p["compute"] for p in seeds.values()] else f"{next(iter(seeds.values()))['compute']:.3g}"]
            for s in sizes for a in arms for lr, seeds in sorted(by_size[s].get(a, {}).items())]
    md += [markdown_table(["size", "arm", "lr", "seeds", "final val loss (mean)", "compute (FLOPs)"], rows), ""]
    result = {"baseline": baseline, "arms": arms, "sizes": [size_label(s) for s in sizes], "unfinished": unfinished,
              "lr_grid": {}, "best_lr": {}}

    chosen = {}  # (size, arm) -> the lr the ladder uses
    for s in sizes:
        grids = {a: {lr: {seed: p["loss"] for seed, p in seeds.items()} for lr, seeds in by_size[s][a].items()}
                 for a in arms if a in by_size[s]}
        if all(len(g) == 1 for g in grids.values()):
            chosen.update({(s, a): next(iter(g)) for a, g in grids.items()})
            continue
        compared = lr_grid.compare(grids, baseline)
        result["lr_grid"][size_label(s)] = compared
        for a, lr in compared["best_lr"].items():
            chosen[(s, a)] = lr
            result["best_lr"].setdefault(a, {})[size_label(s)] = lr
        md += [f"## Learning rate at {size_label(s)}", "", f"Rule: {compared['rule']}. Each arm is compared with "
               f"{baseline} paired by seed twice: each at its own best lr (both tuned), and at {baseline}'s best lr "
               "(a common lr: the arm dropped into the baseline's recipe).", "",
               *[f"- {line}" for line in compared["sentences"]], ""]
    if result["lr_grid"]:
        plot_lr_grid(result["lr_grid"], out / "lr_grid.png")
        md += ["![loss against lr](lr_grid.png)", ""]

    if len(sizes) > 1:
        ladder, compute_at = {}, {}
        for s in sizes:
            for a in arms:
                if (s, a) not in chosen:
                    continue
                seeds = by_size[s][a][chosen[(s, a)]]
                if any(p["compute"] is None for p in seeds.values()):
                    raise ConfigError(f"{size_label(s)} {a}: a run records no training FLOPs (its eval records have "
                                      "no `flops`: an older nanoact, or the translation trainer, which has no FLOP "
                                      "count); a ladder needs them")
                compute = statistics.mean(p["compute"] for p in seeds.values())
                ladder.setdefault(a, {})[compute] = {seed: p["loss"] for seed, p in seeds.items()}
                compute_at.setdefault(s, {})[a] = compute
        fit = scaling.fit_ladder(ladder, baseline, n_resamples=N_RESAMPLES,
                                 throughput=throughput_ratios(throughput, compute_at, baseline) if throughput else None)
        plot_scaling(fit, out / "scaling.png")
        used = {a: [(s, chosen[(s, a)]) for s in sizes if (s, a) in chosen] for a in arms}
        which = "each arm at its best lr of a size's grid, or the one lr it ran at a size without one: " + "; ".join(
            f"{a} {lrs[0][1]:g} at every size" if len({lr for _, lr in lrs}) == 1 else
            f"{a} " + ", ".join(f"{lr:g} at {size_label(s)}" for s, lr in lrs) for a, lrs in used.items())
        md += ["## Compute multiplier", "", f"Final val loss against training compute (FLOPs) per arm, {which}.", "",
               *[f"- {line}" for line in fit["sentences"]]]
        if not throughput:
            md.append("- Wall-clock: not measured (no --throughput benchmark of the arms on one machine).")
        md += ["", "![loss and multiplier against compute](scaling.png)", ""]
        result.update(fit=fit, **{name: {a: f[name] for a, f in fit["arms"].items()} for name in ("E", "A", "alpha")},
                      multiplier={a: {"at_sizes": m["at_sizes"], "target": m["target"], "trend": m["trend"]}
                                  for a, m in fit["multipliers"].items()},
                      wall_clock=fit["throughput_source"] or "not measured")
    text = "\n".join(md)
    (out / "sweep.md").write_text(text)
    (out / "sweep.json").write_text(json.dumps(result, indent=2, default=str))
    return text
