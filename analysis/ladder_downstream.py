"""A ladder's downstream metrics fitted against compute like its val loss: each arm's multiplier on a continuous
downstream score beside its val-loss multiplier, in the report's one Holm family.

Which metrics: every in-loop metric the compared runs declare lower-is-better (training/in_loop.py's Metric with
higher_is_better False: HellaSwag's gold bits per byte, hellaswag_bpb; CORE's, core_bpb) and log at their final
evaluation. Such a score falls as the models learn, like a loss, so L = E + A C^-alpha describes it and its
multiplier reads as the val loss's does: the compute the baseline needs to reach the arm's value of it. Accuracies
(hellaswag_acc, CORE's centered accuracy) are not fitted: at the sizes a ladder affords they sit at chance, flat
in compute (docs/evaluation.md).

Nothing here estimates: each metric goes through stats/ladder_fit.py's fit_ladder with the val loss's sizes, seeds,
lrs and options (analysis/ladder_report.py's fit_cells and fit_input pick them), so its interval comes with its
coverage measured by the same estimator on ladders drawn from the configuration that metric's own fit implies.
Its multipliers and trends join the family as the val loss's do: exploratory where a fitted size's lr was picked on
the compared runs, withheld where the tuning audit refutes an lr (analysis/ladder_audit.py). A ladder whose runs
log no such metric reads as before.
"""
from analysis.ladder_audit import ci_text, rate_text, size_label, withhold
from analysis.runs import markdown_table
from stats import ladder_fit, scaling


def _cell_points(cells):
    """The points the fits read: every arm's at the complete sizes on the shared seeds; none where the val loss is
    not fitted (too few complete sizes, no shared seed)."""
    compared, complete, shared = cells
    if len(complete) < scaling.MIN_SIZES["shared"] or not shared:
        return []
    return [p for (s, _), seeds in compared.items() if s in complete for seed, p in (seeds or {}).items()
            if seed in shared]


def declared(points):
    """{name: Metric} of the lower-is-better in-loop metrics the points' runs declare."""
    return {name: m for p in points for name, m in p["declared"].items() if not m.higher_is_better}


def fittable(cells):
    """The declared lower-is-better metrics every fitted run logged at its final evaluation."""
    points = _cell_points(cells)
    return [name for name in declared(points) if all(name in p["metrics"] for p in points)]


def fit_metrics(inputs, ladder, cells, cursed, opts, result, family):
    """Fits each metric of `inputs` ({metric: {arm: {compute: {seed: value}}}}, fit_input's) into
    result["downstream_fit"], its verdicts appended to `family` (kind, claim, p, the dict its Holm p goes into);
    a declared metric some fitted runs lack is named as not fitted. Returns {metric: fit or {"not_fitted"}}."""
    _, complete, _ = cells
    fits = {}
    for metric, values in inputs.items():
        fit = ladder_fit.fit_ladder(values, ladder.baseline, opts.estimator(), n_sims=opts.resamples, rng=opts.seed,
                                    lr_design=(ladder.lr_design, max(len(ladder.lr_seeds), 1)))
        if isinstance(fit, ladder_fit.NotFitted):
            fits[metric] = {"not_fitted": fit.reason}
            continue
        fit["exploratory"] = [size_label(s) for s in complete if s in cursed]
        for a, m in fit["multipliers"].items():
            claims = [("multiplier", f"{a}'s {metric} multiplier over {ladder.baseline}", m["headline"])] + (
                [("trend", f"{a}'s {metric} trend", m["trend"])] if m["trend"] else [])
            for kind, claim, where in claims:
                if not fit["exploratory"] and not withhold(result, a, None, (kind, claim, where)):
                    family.append((kind, claim, where["p"], where))
        fits[metric] = fit
    points = _cell_points(cells)
    for metric in declared(points):
        missing = [p["path"] for p in points if metric not in p["metrics"]]
        if metric not in fits and len(missing) < len(points):
            fits[metric] = {"not_fitted": f"{len(missing)} fitted run(s) do not log it at their final evaluation "
                                          f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"}
    if fits:
        result["downstream_fit"] = fits
    return fits


def _holm_cell(where, exploratory):
    if exploratory:
        return "exploratory"
    if "not_declared" in where:
        return "not declared (audit)"
    return "-" if where.get("p_holm") is None else f"{where['p_holm']:.3g}"


def _m(h):
    return f"{h['multiplier']:.3g} {ci_text(*h['ci'])}"


def section(fits, result, opts):
    """The markdown: per metric its fit, its measured coverage, and each arm's multiplier beside the val loss's."""
    if not fits:
        return []
    level = f"{opts.level:.0%}"
    loss_fit = (result.get("fit") or {}).get("multipliers") or {}
    md = ["## Downstream multipliers", "", "Each declared lower-is-better downstream metric the fitted runs log at "
          "their final evaluation, fitted against compute as the val loss is (the same sizes, seeds, lrs and "
          "estimator, stats/ladder_fit.py): the compute the baseline needs to reach the arm's value of it, beside "
          f"the val loss's multiplier; {level} intervals; its multipliers and trends join the Holm family below.", ""]
    rows = []
    for metric, fit in fits.items():
        if "not_fitted" in fit:
            md.append(f"- {metric}: no fit: {fit['not_fitted']}.")
            continue
        cal = fit["calibration"]
        md.append(f"- {metric}: {fit['form_text']}; coverage measured: {rate_text(cal['coverage'])} of the {level} "
                  f"headline intervals held the true multiplier, the worst over {len(cal.get('truths', [])) or 1} "
                  f"truths of {cal['n']} ladders each drawn from this metric's own fit (Monte-Carlo 95% interval; "
                  f"simulation seed {cal['seed']})"
                  + ("; below 90%: read its multipliers as conditional on that truth not being the real one"
                     if cal["coverage"]["rate"] < 0.9 else "")
                  + (f"; exploratory: the lr at {', '.join(fit['exploratory'])} was picked on the compared runs"
                     if fit["exploratory"] else "") + ".")
        for a, m in fit["multipliers"].items():
            loss = loss_fit.get(a, {}).get("headline")
            trend = m["trend"]
            rows.append([metric, a, _m(loss) if loss else "-", _m(m["headline"]),
                         _holm_cell(m["headline"], fit["exploratory"]),
                         "-" if trend is None else f"{trend['slope']:+.3g} {ci_text(*trend['ci'], fmt='{:+.3g}')}",
                         "-" if trend is None else _holm_cell(trend, fit["exploratory"])])
    md.append("")
    if rows:
        md += [markdown_table(["metric", "arm", f"val-loss m over {result['baseline']}", "metric m", "Holm p",
                               "trend (slope of log m)", "Holm p"], rows), ""]
    return md
