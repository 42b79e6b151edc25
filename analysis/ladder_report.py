"""The report of a ladder: each arm at a learning rate chosen honestly, its gain as a compute multiplier (fitted and
read off the baseline's points), the trend, and every verdict under one error control.

Every number comes from the runs' own run.json and metrics.jsonl (analysis/ladder_points.py: each run's arm, size,
lr, seed, final val loss and compute), never from directory names.

The lr: stats/lr_grid.py picks each arm's best lr on a size's grid; lr_grid.png draws loss against lr. With the
plan's lr_seeds the grid ran on its own seeds, and the arms are compared on the others only: the pick's luck never
favours the arm it picked for. Without them the pick was made on the compared runs, and every comparison at that size
is marked "exploratory" (the winner's curse: an arm with a flat lr curve gains most from picking the luckiest point).
The grid's own pairs are always exploratory. The tuning
audit (the plan's audit_size, on the first two of lr_seeds): each arm's optimum at the largest size with its interval,
and the lr it ran there judged within or beyond the tolerance (stats/lr_audit.py); an arm whose lr it does not put
within the tolerance declares nothing where it rests on that lr (withheld). Every multiplier and trend sentence
names the lrs, where and on which seeds they were picked, and the audit's result. Several sizes: stats/ladder_fit.py gives the estimator's numbers
(estimate in stats/scaling.py: each arm's multiplier at the largest rung with its interval, the ladder average, the
curve-free multiplier at every size, the trend) and its coverage measured on ladders drawn from the configuration
this ladder implies; this module only formats them; scaling.png. Verdicts (the per-size pairs, the multipliers, the
trends) form one family: Holm at family-wise error rate 1 - level. A downstream metric the runs declare
lower-is-better (hellaswag_bpb) is fitted alike, its multipliers and trends in the same family
(analysis/ladder_downstream.py). The wall-clock multiplier needs throughput
measured interleaved on one machine (bench/train_step.py --shape ... --json FILE, given as --throughput FILE), looked
up by the arm's label (a contender named as the arm); an arm without one is said to be "not measured".
"""
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from analysis import ladder_downstream
from analysis.lr_grid_plot import plot_lr_grid
from analysis.ladder_audit import (audit_section, ci_text, rate_text, reruns_of, size_label, verdicts, withheld,
                                   withhold)
from analysis.ladder_points import SHAPE, by_size_arm_lr, plan_of, read_points, shape_of
from analysis.runs import RunError, markdown_table
from analysis.scaling_plot import plot_scaling
from errors import ConfigError
from stats import ladder_fit, lr_audit, lr_grid, scaling
from stats.family import adjust
from stats.significance import paired


def throughput_ratios(files, ladder_compute, baseline):
    """{"ratio": {arm: {C: compute-per-second ratio to the baseline}}, "source", "missing": [arms]} from
    bench/train_step.py --json files, each of one ladder size (its "shape"), a contender matched to an arm by its
    label (bench/train_step.py --acts 'gelu,aglu'): an arm that differs by another option (gelu+norm=rmsnorm) is
    found only under its own label, never under its activation's."""
    ratios, sources, missing = {}, [], set()
    for file in files:
        try:
            bench = json.loads(Path(file).read_text())
            shape = tuple(bench["shape"][k] for k in SHAPE)
            speed = {label: r["tok_per_s"] * r["flops_per_token"] for label, r in bench["results"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(f"--throughput {file}: not a JSON of bench/train_step.py --shape ... --json") from None
        if shape not in ladder_compute:
            raise ConfigError(f"--throughput {file}: measured at {size_label(shape)}, not a size of this ladder "
                              f"({', '.join(size_label(s) for s in ladder_compute)}); benchmark at a ladder size")
        if baseline not in speed:
            raise ConfigError(f"--throughput {file}: no contender {baseline}; time the baseline beside the arms")
        for arm, compute in ladder_compute[shape].items():
            if arm == baseline:
                continue
            if arm in speed:
                ratios.setdefault(arm, {})[compute] = speed[arm] / speed[baseline]
            else:
                missing.add(arm)
        sources.append(f"{file}: bench/train_step.py on {bench.get('device')}, median of interleaved rounds "
                       f"at {size_label(shape)}")
    return {"ratio": ratios, "source": "; ".join(sources), "missing": sorted(missing)}


def target_of(text):
    """--target: "gpt2-124m-10b" (GPT-2 124M at 10B tokens, GPT-2's vocabulary) or a compute in FLOPs on the
    ladder's own data and vocabulary."""
    if text is None:
        return None
    if text == "gpt2-124m-10b":
        return scaling.GPT2_124M_10B
    try:
        return f"{float(text):.3g} FLOPs", float(text), None
    except ValueError:
        raise ConfigError(f"--target {text!r}: give a compute in FLOPs (e.g. 1e13) or gpt2-124m-10b") from None


@dataclass(frozen=True)
class ReportOptions:
    """What a ladder's report depends on besides its runs (python -m sweep's options of the same names). target:
    --target's text (a compute in FLOPs or gpt2-124m-10b), None for none; extrapolate: print a target the ladder
    cannot support, marked as one; level: the intervals' confidence (verdicts at family-wise rate 1 - level);
    resamples, seed: the simulated ladders that measure the interval's coverage, and their seed; reference: the
    compute (FLOPs) of the headline multiplier, None for the largest rung; tolerance: how far from its audited optimum
    an arm's lr may lie before the audit refutes it and its verdicts are not declared (stats/lr_audit.py)."""
    target: str | None = None
    extrapolate: bool = False
    level: float = 0.95
    resamples: int = 400
    seed: int = 0
    reference: float | None = None
    tolerance: float = 1.4

    def estimator(self):
        return scaling.Options(self.level, self.reference)

    def audit(self):
        return lr_audit.AuditOptions(self.tolerance, self.level)


def ladder_report(out_dir, baseline=None, throughput=None, options=ReportOptions()):
    """Writes sweep.md, sweep.json, lr_grid.png (several lrs) and scaling.png (several sizes); returns the
    markdown."""
    out = Path(out_dir)
    try:
        points, unfinished = read_points(out)
        target_of(options.target)  # a bad --target is an error before anything is written
        if not options.tolerance > 1:
            raise ConfigError(f"--lr-tolerance {options.tolerance:g}: a factor above 1 (e.g. 1.4: an lr within "
                              "1.4x of its audited optimum, either way, passes)")
        return _report(out, points, unfinished, baseline, throughput or [], options)
    except (RunError, ConfigError) as e:
        raise SystemExit(f"error: {out}: {e}") from None


def _mean(points, key):
    return statistics.mean(p[key] for p in points)


@dataclass
class LadderRuns:
    """A ladder's finished runs as its report reads them."""
    arms: list  # the baseline first
    baseline: str
    sizes: list  # by compute
    by_size: dict  # {size: {arm: {lr: {seed: point}}}} of the compared runs
    grid_by_size: dict  # the same of the lr grid's own seeds (lr_seeds), {} without them
    lr_seeds: set
    points: list  # the compared runs' points
    grid_runs: int  # how many runs the lr grid's own seeds have
    audit_size: tuple | None = None  # where the tuning audit ran (the plan's audit_size)
    audit: dict | None = None  # its runs {arm: {lr: {seed: point}}}
    lr_design: str = "smallest"  # the plan's lr design (stats/lr_grid.py DESIGNS), for the calibration
    reruns: dict | None = None  # {arm: {size name: lr}}: re-run at the audited optimum (the plan's rerun_refuted)
    audit_seeds: int = lr_audit.AUDIT_SEEDS  # the plan's

    def at(self, size, arm, lr):
        """{seed: point} of one arm at one size and lr, or None."""
        return self.by_size[size].get(arm, {}).get(lr)


def read_ladder(out, points, baseline):
    """The LadderRuns of a ladder's points: the lr grid's seeds apart (its tuning audit too), the baseline checked,
    the sizes by compute."""
    plan = plan_of(out)
    ladder = plan.get("ladder") or {}
    lr_seeds = set(ladder.get("lr_seeds") or [])
    # a horizon design's grid on the base shape at another size's steps: its picks set the lrs (after_grid.json)
    horizons = [f"_{name}_lr" for name in ladder.get("grid_sizes", {}) if name not in ladder.get("sizes", {})]
    points = [p for p in points if not any(h in p["path"] for h in horizons)]
    reruns, points = reruns_of(out, points, lr_seeds)
    grid_points = [p for p in points if p["seed"] in lr_seeds]
    points = [p for p in points if p["seed"] not in lr_seeds]
    arms = sorted({p["arm"] for p in points})
    baseline = baseline or plan.get("baseline") or ("gelu" if "gelu" in arms else arms[0])
    if baseline not in arms:
        raise ConfigError(f"baseline {baseline!r} is not an arm of these runs ({', '.join(arms)}); name one with "
                          "--baseline")
    arms = [baseline] + [a for a in arms if a != baseline]
    by_size, grid_by_size = by_size_arm_lr(points), by_size_arm_lr(grid_points)
    audit_size = shape_of(ladder["sizes"][ladder["audit_size"]]) if ladder.get("audit_size") else None
    audit = grid_by_size.pop(audit_size, {}) if audit_size else None
    compute_of = {s: _mean([p for p in points if p["size"] == s and p["compute"] is not None] or [{"compute": 0}],
                           "compute") for s in by_size}
    sizes = sorted(by_size, key=lambda s: (compute_of[s], tuple(x or 0 for x in s)))  # by compute
    return LadderRuns(arms, baseline, sizes, by_size, grid_by_size, lr_seeds, points, len(grid_points), audit_size,
                      audit, ladder.get("lr_design", "smallest"), reruns,
                      ladder.get("audit_seeds", lr_audit.AUDIT_SEEDS))


def runs_section(out, ladder, unfinished):
    """The report's head: what was read, and each arm's mean loss and compute at each size and lr."""
    arms, sizes, by_size, grid_runs = ladder.arms, ladder.sizes, ladder.by_size, ladder.grid_runs
    md = [f"# Ladder {out}", "", f"Runs read from their own run.json and metrics.jsonl: {len(ladder.points)} compared"
          + (f" and {grid_runs} of the lr grid{' and its tuning audit' if ladder.audit else ''} (seeds "
             f"{', '.join(map(str, sorted(ladder.lr_seeds)))})"
             if grid_runs else "")
          + f", arms {', '.join(arms)} (baseline {ladder.baseline}), sizes by compute "
          f"{', '.join(map(size_label, sizes))}.", ""]
    if unfinished:
        md += [f"Unfinished (left out): {', '.join(unfinished)}", ""]
    rows = [[size_label(s), a, f"{lr:g}", ", ".join(map(str, sorted(seeds))),
             f"{_mean(seeds.values(), 'loss'):.4f}",
             "-" if None in [p["compute"] for p in seeds.values()] else f"{_mean(seeds.values(), 'compute'):.3g}"]
            for s in sizes for a in arms for lr, seeds in sorted(by_size[s].get(a, {}).items())]
    return md + [markdown_table(["size", "arm", "lr", "seeds", "final val loss (mean)", "compute (FLOPs)"], rows), ""]


def lr_sections(out, ladder, result):
    """Each size's lr grid: the picks into result ("lr_grid", "best_lr") and the markdown; returns (markdown,
    {(size, arm): the lr compared}, the sizes whose pick was made on the compared runs)."""
    md, chosen, cursed = [], {}, set()
    by_size, grid_by_size, sizes = ladder.by_size, ladder.grid_by_size, ladder.sizes
    for s in sorted(set(by_size) | set(grid_by_size), key=lambda s: sizes.index(s) if s in sizes else -1):
        own = {a: {lr: {seed: p["loss"] for seed, p in seeds.items()} for lr, seeds in by_size.get(s, {})[a].items()}
               for a in ladder.arms if a in by_size.get(s, {})}
        grids = {a: {lr: {seed: p["loss"] for seed, p in seeds.items()} for lr, seeds in g.items()}
                 for a, g in grid_by_size.get(s, {}).items()} if s in grid_by_size else own
        if all(len(g) == 1 for g in grids.values()):
            continue
        if single := [a for a, g in grids.items() if len(g) == 1]:
            several = next(a for a, g in grids.items() if len(g) > 1)
            raise ConfigError(f"at {size_label(s)} {several} ran at {len(grids[several])} lrs "
                              f"({', '.join(f'{lr:g}' for lr in sorted(grids[several]))}) and {', '.join(single)} at "
                              "one: a size is a grid (every arm at several lrs) or a ladder point (every arm at one); "
                              "move the runs of an earlier pick out of this directory")
        compared = lr_grid.compare(grids, ladder.baseline)
        result["lr_grid"][size_label(s)] = compared
        for a, lr in compared["best_lr"].items():
            result["best_lr"].setdefault(a, {})[size_label(s)] = lr
            if grids is own:
                chosen[(s, a)] = lr
        if grids is own:
            cursed.add(s)
        picks = [f"- {line}" for line in compared["sentences"][:len(compared["picks"])]]
        pairs = [f"- {line}" for line in compared["sentences"][len(compared["picks"]):]]
        md += [f"## Learning rate at {size_label(s)}", "", f"Rule: {compared['rule']}.", "", *picks, "",
               "Unadjusted, exploratory (outside the report's error control: the lr was picked on these very runs, "
               f"so the arm with the flatter lr curve gains most from the pick's luck): each arm against "
               f"{ladder.baseline} paired by seed, each at its own best lr and at the baseline's.", "", *pairs, ""]
    if result["lr_grid"]:
        plot_lr_grid(result["lr_grid"], out / "lr_grid.png")
        md += ["![loss against lr](lr_grid.png)", ""]
    return md, chosen, cursed


def lr_choices(ladder, result, chosen):
    """Each arm's lr at each size, and how it was chosen, into result["lr_choice"] and chosen (an arm that ran
    one lr at a size: that one); its markdown."""
    for s in ladder.sizes:
        for a in ladder.arms:
            if (s, a) not in chosen and len(ladder.by_size[s].get(a, {})) == 1:
                chosen[(s, a)] = next(iter(ladder.by_size[s][a]))
    seeds = ", ".join(map(str, sorted(ladder.lr_seeds)))
    for a in ladder.arms:
        lrs = [(s, chosen[(s, a)]) for s in ladder.sizes if (s, a) in chosen]
        where = {k: v for k, v in result["best_lr"].get(a, {}).items()}
        how = (f"the vertices of the grids on {', '.join(where)}'s shape at its horizon and the largest size's, on "
               f"seeds {seeds}, as a power of the horizon (lr_design horizon), compared on the others"
               if ladder.lr_design == "horizon" and ladder.grid_runs and where else
               f"picked on the grid at {', '.join(where)} on seeds {seeds}, compared on the others"
               if ladder.grid_runs and where else
               f"picked at {', '.join(where)} on the compared seeds themselves (its comparisons there: exploratory)"
               if where else "the one lr it ran")
        ran = (f"{lrs[0][1]:g} at every size" if len({lr for _, lr in lrs}) == 1 else
               ", ".join(f"{lr:g} at {size_label(s)}" for s, lr in lrs)) if lrs else "no run"
        if a in (ladder.reruns or {}):
            how += (f"; re-run at {', '.join(ladder.reruns[a])} at lrs between its lr at the smallest size and its "
                    "audited optimum at the largest, as a power of the horizon, after the audit did not put its lr "
                    "within the tolerance (rerun_refuted; its runs at the design's lrs there superseded, the audit "
                    "judging the re-run's lr on its same runs)")
        result["lr_choice"][a] = f"{ran} ({how})"
        result["lr_basis"][a] = (ran, how)
    return ["## Each arm's lr", "", *[f"- {a}: {text}." for a, text in result["lr_choice"].items()], ""]


def basis(result, baseline, arm):
    """What a multiplier or trend of `arm` over the baseline rests on: the lrs, where and on which seeds they were
    picked, and the tuning audit's result."""
    (ran_b, how_b), (ran_a, how_a) = result["lr_basis"][baseline], result["lr_basis"][arm]
    how = f", both {how_b}" if how_b == how_a else f" ({baseline} {how_b}; {arm} {how_a})"
    audit = result["audit"]["text"] if result.get("audit") else "no tuning audit (the plan has none)"
    return f"at lrs {baseline} {ran_b} and {arm} {ran_a}{how}; {audit}"


def size_pairs(ladder, result, chosen, cursed, family):
    """Each arm against the baseline at each size, paired by seed at the lrs compared, into result["pairs"]; those
    neither exploratory nor withheld by the audit join the family. Returns [(size, arm, pair)]."""
    pair_rows = []
    for s in ladder.sizes:
        base = ladder.at(s, ladder.baseline, chosen.get((s, ladder.baseline)))
        for a in ladder.arms[1:]:
            arm = ladder.at(s, a, chosen.get((s, a)))
            if not base or not arm:
                continue
            pair = paired({k: p["loss"] for k, p in base.items()}, {k: p["loss"] for k, p in arm.items()})
            pair["exploratory"] = s in cursed
            result["pairs"].setdefault(size_label(s), {})[a] = pair
            claim = f"{a} - {ladder.baseline} at {size_label(s)}"
            if pair["p"] is not None and not pair["exploratory"] and not withhold(
                    result, a, size_label(s), ("pair", claim, pair)):
                family.append(("pair", claim, pair["p"], pair))
            pair_rows.append((s, a, pair))
    return pair_rows


def fit_cells(ladder, chosen):
    """(the compared runs {(size, arm): {seed: point} or None}, the sizes every arm has finished, the seeds all of
    them share): what the fits read, the val loss's and the downstream metrics'."""
    compared = {(s, a): ladder.at(s, a, chosen.get((s, a))) for s in ladder.sizes for a in ladder.arms}
    complete = [s for s in ladder.sizes if all(compared[(s, a)] for a in ladder.arms)]
    shared = set.intersection(*(set(compared[(s, a)]) for s in complete for a in ladder.arms)) if complete else set()
    return compared, complete, shared


def fit_input(compared, complete, shared, arms, metric=None):
    """({arm: {compute: {seed: value}}}, {size: {arm: compute}}) of the complete sizes on the shared seeds: the
    final val loss, or with `metric` that in-loop metric at the final evaluation (ladder_points' `metrics`)."""
    losses, compute_at = {}, {}
    for s in complete:
        for a in arms:
            seeds = {seed: p for seed, p in compared[(s, a)].items() if seed in shared}
            if any(p["compute"] is None for p in seeds.values()):
                raise ConfigError(f"{size_label(s)} {a}: a run records no training FLOPs (its eval records have "
                                  "no `flops`: an older nanoact, or the translation trainer, which has no FLOP "
                                  "count); a ladder needs them")
            compute = _mean(seeds.values(), "compute")
            losses.setdefault(a, {})[compute] = {seed: p["loss"] if metric is None else p["metrics"][metric]
                                                  for seed, p in seeds.items()}
            compute_at.setdefault(s, {})[a] = compute
    return losses, compute_at


def audit_seeds(ladder, result):
    """The tuning audit's seeds the calibration simulates: the plan's (its audit_seeds first lr seeds), or as many
    as the audit ran on where more were added; 0 without an audit."""
    if ladder.audit_size is None:
        return 0
    return max(len((result.get("audit") or {}).get("seeds", [])), min(ladder.audit_seeds, len(ladder.lr_seeds)))


def fit_section_of(out, ladder, chosen, cursed, throughput, opts, result, family):
    """The multiplier fit (its verdicts join the family, Holm-adjusted here, unless a fitted size's lr was picked
    on the compared runs: the calibration does not simulate that pick, so they are then exploratory; or the audit
    withholds them) and its
    markdown; without enough sizes, the family is adjusted alone. The fit pairs every arm at every size on the same
    seeds: a half-finished ladder is fitted on the sizes every arm has finished, on the seeds all of them share, and
    says which."""
    compared, complete, shared = fit_cells(ladder, chosen)
    md = []
    if len(complete) < len(ladder.sizes) or any(set(compared[(s, a)]) != shared for s in complete
                                                for a in ladder.arms):
        md += [f"Fitted on sizes {', '.join(map(size_label, complete)) or 'none'} and seeds "
               f"{', '.join(map(str, sorted(shared))) or 'none'}: those every arm has finished.", ""]
    if len(complete) < scaling.MIN_SIZES["shared"] or not shared:
        adjust([(p, where) for _, _, p, where in family])
        return md + [f"No fit: {len(complete)} complete sizes (the shared fit needs {scaling.MIN_SIZES['shared']}).",
                     ""]
    losses, compute_at = fit_input(compared, complete, shared, ladder.arms)
    speeds = throughput_ratios(throughput, compute_at, ladder.baseline) if throughput else None
    vocab = {p["vocab"] for p in ladder.points}
    fit = ladder_fit.fit_ladder(losses, ladder.baseline, opts.estimator(), target=target_of(opts.target),
                                extrapolate=opts.extrapolate, vocab=vocab.pop() if len(vocab) == 1 else None,
                                throughput=speeds, n_sims=opts.resamples, rng=opts.seed,
                                lr_design=(ladder.lr_design, max(len(ladder.lr_seeds), 1),
                                           audit_seeds(ladder, result), opts.tolerance))
    if isinstance(fit, ladder_fit.NotFitted):
        adjust([(p, where) for _, _, p, where in family])
        result["fit"] = {"not_fitted": fit.reason}
        return md + [f"No fit: {fit.reason}.", ""]
    fit["exploratory"] = [size_label(s) for s in complete if s in cursed]
    for a, m in fit["multipliers"].items():
        if fit["exploratory"]:
            continue
        # the fit spans every size: an arm the audit withholds anywhere is withheld here
        claims = [("multiplier", f"{a}'s multiplier over {ladder.baseline}", m["headline"])] + (
            [("trend", f"{a}'s trend", m["trend"])] if m["trend"] else [])
        for kind, claim, where in claims:
            if not withhold(result, a, None, (kind, claim, where)):
                family.append((kind, claim, where["p"], where))
    adjust([(p, where) for _, _, p, where in family])
    md += fit_section(fit, complete, speeds, opts, {a: basis(result, ladder.baseline, a) for a in ladder.arms[1:]})
    plot_scaling(fit, out / "scaling.png")
    result.update(fit=fit, wall_clock=fit["throughput_source"] or "not measured")
    return md + ["![loss and multiplier against compute](scaling.png)", ""]


def _report(out, points, unfinished, baseline, throughput, opts):
    ladder = read_ladder(out, points, baseline)
    result = {"baseline": ladder.baseline, "arms": ladder.arms, "sizes": [size_label(s) for s in ladder.sizes],
              "unfinished": unfinished, "level": opts.level, "lr_grid": {}, "best_lr": {}, "lr_choice": {},
              "pairs": {}, "lr_basis": {}, "not_declared": []}
    md = runs_section(out, ladder, unfinished)
    lr_md, chosen, cursed = lr_sections(out, ladder, result)
    md += lr_md + lr_choices(ladder, result, chosen) + audit_section(ladder, result, chosen, opts)
    result["withheld"] = withheld(ladder, result, out)
    family = []  # the report's verdicts, one Holm family: (kind, name, p, the dict its adjusted p is written into)
    pair_rows = size_pairs(ladder, result, chosen, cursed, family)
    cells = fit_cells(ladder, chosen)
    inputs = {m: fit_input(*cells, ladder.arms, m)[0] for m in ladder_downstream.fittable(cells)}
    downstream = ladder_downstream.fit_metrics(inputs, ladder, cells, cursed, opts, result, family)
    md += fit_section_of(out, ladder, chosen, cursed, throughput, opts, result, family)
    md += pairs_section(pair_rows, ladder.baseline) + ladder_downstream.section(downstream, result, opts) + verdicts(
        family, opts.level, result["not_declared"])
    result["family"] = [{"kind": kind, "claim": name, "p": p, "p_holm": where.get("p_holm")}
                        for kind, name, p, where in family]
    text = "\n".join(md)
    (out / "sweep.md").write_text(text)
    (out / "sweep.json").write_text(json.dumps(result, indent=2, default=str))
    return text


def _holm(where, level):
    if "not_declared" in where:
        return f"; not declared: {where['not_declared']}"
    p = where.get("p_holm")
    return "; unadjusted, exploratory" if p is None else \
        f"; Holm p {p:.3g}: {'declared' if p < 1 - level else 'not declared'}"


def _parameter(v):
    """E or alpha with its interval, or "not identified" in words."""
    return f"{v['value']:.3g} ({v['not_identified']})" if "not_identified" in v else f"{v['value']:.3g} {ci_text(*v['ci'])}"


def calibration_sentence(fit, opts):
    """What the calibration measured (stats/ladder_unseen.py: the worst over the fit's twin and the twin perturbed
    by what the fit cannot see), of which truths, with its Monte-Carlo interval."""
    cal, level = fit["calibration"], f"{fit['confidence']:.0%}"
    worst = cal.get("worst", {})
    text = (f"Coverage measured: {rate_text(cal['coverage'])} of the {level} headline intervals held the true "
            f"multiplier at {fit['reference']:.3g} FLOPs, the worst over {len(cal.get('truths', [])) or 1} truths "
            f"of {cal['n']} ladders each (Monte-Carlo 95% interval over the ladders; simulation seed {cal['seed']})"
            f": the fit's own twin ({rate_text(cal['twin']['coverage'])}) and it perturbed by what the fit cannot see"
            f"; the worst: {worst.get('coverage')}")
    if cal.get("false_alarm"):
        text += (f". With no arm differing, the trend verdict fired in {rate_text(cal['false_alarm'])} of the ladders "
                 f"({worst['false_alarm']})")
    if cal.get("family_wise"):
        text += f" and Holm's family declared something in {rate_text(cal['family_wise'])} ({worst['family_wise']})"
    text += (f". The lr stage in them: {lr_grid.DESIGNS.get(cal['lr_design'], 'none')}. The fitted configuration: "
             f"{cal['assumptions']}.")
    if cal["coverage"]["rate"] < 0.9 or (cal.get("family_wise") or {"rate": 0})["rate"] > 1 - fit["confidence"]:
        text += (" This ladder's design does not hold its intervals' level or Holm's error on a truth its data "
                 "allow: read every multiplier and trend below as conditional on that truth not being the real one.")
    return text


def fit_section(fit, sizes, speeds, opts, bases):
    level, base = f"{fit['confidence']:.0%}", fit["baseline"]
    md = ["## Compute multiplier", "", f"Fit: {fit['form_text']}; {level} intervals: {fit['interval']}.", "",
          calibration_sentence(fit, opts), ""]
    if len(fit["seeds"]) == 1:
        md += [f"One seed ({fit['seeds'][0]}) at every fitted size: the seed noise cannot be fitted (one run "
               "per cell measures no spread), so every interval below rests on the curve's residuals alone, and no "
               "seed's own ladder is fitted beside it.", ""]
    if fit["exploratory"]:
        md += [f"Exploratory: the lr at {', '.join(fit['exploratory'])} was picked on the compared runs, a pick the "
               "calibration does not simulate; the multipliers and trends below are unadjusted and declare "
               "nothing (run the grid on its own seeds, the plan's lr_seeds, to make them verdicts).", ""]
    for form, f in fit["forms"].items():
        if not f["identified"]:
            md.append(f"- {f['text']}.")
            continue
        params = "; ".join(f"{a} E {_parameter(v['E'])}, alpha {_parameter(v['alpha'])}"
                           for a, v in f["params"].items())
        effect = (f"each size off the curve by {f['size_effect_sd']:.3g} nats (sd) shared by its arms, so E and "
                  f"alpha on {f['level_dof']} degrees of freedom" if f["size_effect_sd"] > 0
                  else "no size off the curve beyond its seeds' noise")
        md.append(f"- {f['text']} ({f['dof']} residual degrees of freedom; {effect}): {params}.")
    md.append("")
    for a, m in fit["multipliers"].items():
        h, avg = m["headline"], m["average"]
        md.append(f"- {a}: {base} needs {h['multiplier']:.3g}x the compute to reach {a}'s loss at "
                  f"{h['compute']:.3g} FLOPs ({level} interval {ci_text(*h['ci'])}, the {h['form']} fit"
                  f"{_holm(h, opts.level)}); ladder average, assumes constant m: {avg['multiplier']:.3g} "
                  f"{ci_text(*avg['ci'])}; {bases[a]}.")
        if m.get("per_seed"):
            ps = m["per_seed"]
            spread = "-" if ps["spread_over_model"] is None else f"{ps['spread_over_model']:.3g}"
            md.append(f"- {a}, each seed's own ladder fitted alike: "
                      f"{', '.join('-' if v is None else f'{v:.3g}' for v in ps['multipliers'])}; their spread is "
                      f"{spread}x the model's"
                      + (f" (**over {scaling.PER_SEED_FLAG:g}x: the seeds differ more than the noise model allows, "
                         "the interval may be too narrow**)" if ps["flag"] else "") + ".")
        if m["trend"]:
            t = m["trend"]
            md.append(f"- {a}'s trend: slope of log m on log C {t['slope']:+.3g} {ci_text(*t['ci'], fmt='{:+.3g}')} "
                      f"(alpha_{a} / alpha_{base} - 1, the trend fit; > 0: the gain grows with compute"
                      f"{_holm(t, opts.level)}); {bases[a]}.")
        if m["target"]:
            t, name = m["target"], fit["target"]["name"]
            word = "EXTRAPOLATION (beyond what the ladder supports, asked for by --extrapolate)" \
                if fit["target"]["extrapolation"] else "inside the ladder's reach"
            md.append(f"- {a} at {name} ({t['compute']:.3g} FLOPs), {word}: {t['multiplier']:.3g}x "
                      f"{ci_text(*t['ci'])} ({fit['form']} fit).")
    if speeds and speeds["missing"]:
        md.append(f"- Wall-clock: not measured for {', '.join(speeds['missing'])} (no contender of that label in "
                  "the --throughput files).")
    elif not speeds:
        md.append("- Wall-clock: not measured (no --throughput benchmark of the arms on one machine).")
    md.append("")
    rows = []
    for a, m in fit["multipliers"].items():
        for s, row in zip(sizes, m["at_sizes"]):
            status = row["curve_free_status"]
            free = f"{row['curve_free']:.3g} {ci_text(*row['curve_free_ci'])}" if status == "ok" else \
                "-" if status == "outside" else status
            rows.append([size_label(s), a, f"{row['compute']:.3g}", free,
                         f"{row['fit']['multiplier']:.3g} {ci_text(*row['fit']['ci'])}",
                         "-" if row["wall_clock"] is None else f"{row['wall_clock']:.3g} {ci_text(*row['wall_clock_ci'])}",
                         "**fit and curve-free disagree**" if row["disagree"] else ""])
    md += [f"Per size, by compute: the curve-free multiplier ({base}'s compute read off its observed points along "
           "its fitted curve shifted through them, Fieller interval, '-' outside them, 'not resolved' where "
           f"{base}'s own step there is not significant) beside the {fit['form']} fit's, and the wall-clock "
           "multiplier (the fit's times the measured throughput ratio). Flagged where the curve-free interval and "
           "the fit's are disjoint.", "",
           markdown_table(["size", "arm", "compute (FLOPs)", "curve-free m", f"{fit['form']} fit m", "wall-clock m",
                           "flag"], rows), ""]
    if fit["throughput_source"]:
        md += [f"Throughput ratios measured by: {fit['throughput_source']}.", ""]
    return md


def pairs_section(pair_rows, baseline):
    rows = [[size_label(s), f"{a} - {baseline}", pair["n"], f"{pair['mean']:+.4f}",
             "-" if pair["ci95"] is None else ci_text(*pair["ci95"], fmt="{:+.4f}"),
             "-" if pair["p"] is None else f"{pair['p']:.3g}",
             "exploratory" if pair["exploratory"] else "not declared (audit)" if "not_declared" in pair else
             "-" if pair.get("p_holm") is None else f"{pair['p_holm']:.3g}"] for s, a, pair in pair_rows]
    return ["## Paired by seed at each size", "", "Final val loss differences at the lrs compared (negative favours "
            "the arm), 95% t interval over the seeds.", "",
            markdown_table(["size", "pair", "seeds", "diff", "95% CI", "p", "Holm p"], rows), ""] if rows else []
