"""The lr stage inside the calibration, at counts too large for the tests (tests/test_lr_design.py runs 100 ladders):
ladders in the CPU ladder's shape (stats/ladder_noise.py cpu_ladder: sizes A-D, 6 seeds, gelu's fitted law) whose
arms' lr optima fall with the horizon at their own rates, every ladder through the report's estimator
(stats/scaling.py estimate) by stats/ladder_noise.py calibrate, and the rates the report prints
(stats/ladder_unseen.py, the worst over perturbed truths) beside the real ones.

    python bench/lr_design.py                       # 2000 ladders per design, 8 ladders per printed check
    python bench/lr_design.py --sims 4000 --reports 20 --json out.json

designs: each design (ladder_noise.DESIGNS), lr seeds and audit seeds with no activation effect (Holm's family-wise
error, the trend's false alarm, each verdict gated by the tuning audit as the report gates it: only an arm whose lr
the audit puts within 1.4x declares) and with the CPU ladder's headline multipliers planted (coverage, of every arm's
interval and of the declared arms'; the share of arms declared), how far each arm's lr lies from its optimum at the
largest size; printed: the coverage a report prints for ladders drawn from truths that break the
fit, against the truth's real coverage; curve_free: the curve-free intervals' coverage with the sizes' own deviations
in their covariance and without (the estimator before).
"""
import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from stats import ladder_fit, scaling
from stats.curve_free import curve_free
from stats.ladder_noise import calibrate, configurations, cpu_ladder

DRIFT = (1.6, 1.6, 3.0)  # gelu's, aglu's and relu2's optima's fall over the CPU ladder (experiments/cpu_ladder.md)
PLANTED = (1.0, 0.958, 0.892)  # experiments/cpu_ladder.md's headline multipliers
# (design, the grids' seeds, the audit's seeds: None the plan's, the first 2 of the grid's; none under ends)
DESIGNS = (("smallest", 6, None), ("horizon", 6, None), ("horizon", 2, None), ("horizon", 1, None),
           ("ends", 2, None), ("ends", 1, None), ("horizon", 6, 6), ("horizon", 2, 4), ("horizon", 2, 6),
           ("horizon", 6, 12))


def designs(sims, seed, smoke=False):
    """Each design, grid seeds and audit seeds, the shape moving the optimum or not: the null's and the planted
    truth's rates, every verdict gated by the audit as the report gates it (ladder_noise.calibrate)."""
    out = {}
    for design, lr_seeds, audit_seeds in DESIGNS[1:2] if smoke else DESIGNS:
        for transfer in (1.21,) if smoke or audit_seeds else (1.0, 1.21, 2.0):
            truths = [cpu_ladder(m, DRIFT, design, lr_seeds, transfer, audit_seeds) for m in ((1.0,) * 3, PLANTED)]
            null, planted = (calibrate(t, scaling.Options(), sims, seed) for t in truths)
            row = {"family_wise": null["family_wise"], "false_alarm": null["false_alarm"],
                   "declared_null": null["declared"], "coverage": planted["coverage"],
                   "coverage_declared": planted.get("coverage_declared"), "declared": planted["declared"],
                   "lr_within_1.4x": planted["lr_within_tolerance"], "lr_off_top": planted["lr_off_top"]}
            audit = truths[0].lr.audit_seeds
            out[f"{design}, {lr_seeds} lr seed(s), audit on {audit or 'none'}, shape moving the optimum up to "
                f"{transfer}x"] = {k: v for k, v in row.items() if v is not None}
    return out


def breaking_truths():
    """Truths in the CPU ladder's shape that break the one-term fit or its lr assumption."""
    planted = cpu_ladder(PLANTED, DRIFT, "smallest", 6)
    e, ((a, alpha),) = cpu_ladder((1.0,) * 3, DRIFT, "smallest", 6).curves[0]
    top = planted.compute[-1]
    second = (a * top ** (-alpha / 2), alpha / 2)  # as large as the first term at D
    return {
        "smallest design, relu2's optimum 3x": planted,
        "horizon design, relu2's optimum 3x": replace(planted, lr=replace(planted.lr, design="horizon")),
        "a second power term (half the exponent, as large as the first at D) in every arm, lrs at the optima":
            replace(planted, lr=None, curves=tuple((e, t + (second,)) for e, t in planted.curves)),
        "a second power term (half the exponent, as large as the first at D) in relu2's law alone, lrs at the "
        "optima": replace(planted, lr=None, curves=(*planted.curves[:2], (e, planted.curves[2][1] + (second,)))),
        "relu2's floor E 0.05 lower, lrs at the optima": replace(
            planted, lr=None, curves=(*planted.curves[:2], (e - 0.05, planted.curves[2][1]))),
    }


def printed(sims, reports, report_sims, seed, smoke=False):
    """Each breaking truth's real coverage and the coverage reports of ladders drawn from it print (report_sims
    ladders per truth of each report's calibration)."""
    out = {}
    for name, truth in list(breaking_truths().items())[:1 if smoke else None]:
        real = calibrate(truth, scaling.Options(), sims, seed)
        losses = truth.draw(reports, seed + 1)
        design = (truth.lr.design, truth.lr.seeds) if truth.lr else (None, 1)
        shown = []
        for i in range(reports):
            ladder = {arm: {c: dict(enumerate(losses[i, a, s])) for s, c in enumerate(truth.compute)}
                      for a, arm in enumerate(("gelu", "aglu", "relu2"))}
            cal = ladder_fit.fit_ladder(ladder, "gelu", n_sims=report_sims, rng=seed, lr_design=design)["calibration"]
            shown.append({"coverage": cal["coverage"]["rate"], "twin": cal["twin"]["coverage"]["rate"],
                          "worst": cal["worst"]["coverage"]})
        out[name] = {"real_coverage": real["coverage"], "printed": shown}
    return out


def curve_free_coverage(sims, seed):
    """Configuration g (each size off the curves by sd 0.02): the curve-free intervals' coverage of the true
    multiplier at each size, with the fit's size effect in the means' covariance and without."""
    truth = configurations()["g: each size off the curves by sd 0.02, shared by its arms"]
    losses = truth.draw(sims, seed)
    est = scaling.estimate(losses, truth.log_c, scaling.Options(), report=False)
    k, s = len(truth.curves), len(truth.compute)
    true = np.array([truth.log_multiplier(c) for c in truth.compute]).T  # (K-1, S)
    f = est["fits"][est["headline"]["form"]]
    hits = {"with the size effect": [], "without": []}
    size = np.tile(np.arange(s), k)
    same_size = np.equal.outer(size, size)
    for i in range(sims):
        def baseline(u, i=i):
            return f["E"][0][i, 0] + f["A"][i, 0] * np.exp(-f["alpha"][0][i, 0] * u)

        sizes = f["size_effect_sd"][i] ** 2 * same_size
        for key, cov in (("with the size effect", est["cov_means"][i] + sizes), ("without", est["cov_means"][i])):
            (value, low, high), status = curve_free(truth.log_c, est["means"][i], cov, baseline,
                                                    k * s * (truth.seeds - 1), 0.95)
            ok = status == "ok"
            hits[key].append(np.where(ok, (low <= true) & (true <= high), np.nan))
    out = {}
    for key, h in hits.items():
        h = np.array(h)  # (ladders, K-1, S), nan where the reading is not resolved
        by_size = [h[:, :, i][np.isfinite(h[:, :, i])] for i in range(s)]
        out[key] = {"all sizes": float(np.nanmean(h)), "resolved": float(np.isfinite(h).mean()),
                    "by size": [float(v.mean()) if v.size else None for v in by_size]}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sims", type=int, default=2000)
    p.add_argument("--reports", type=int, default=8, help="ladders whose report's printed coverage is shown")
    p.add_argument("--report-sims", type=int, default=200, help="each printed report's ladders per truth")
    p.add_argument("--curve-free-sims", type=int, default=400)
    p.add_argument("--smoke", action="store_true", help="one design, one truth: that the script runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    start = time.process_time()
    out = {"designs": designs(args.sims, args.seed, args.smoke)}
    for name, row in out["designs"].items():
        print(f"{name}: " + ", ".join(f"{k} {v['rate']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" if isinstance(v, dict)
                                      else f"{k} {v:.2f}x" for k, v in row.items()))
    out["printed"] = printed(args.sims, args.reports, args.report_sims, args.seed, args.smoke)
    for name, row in out["printed"].items():
        r = row["real_coverage"]
        shown = [x["coverage"] for x in row["printed"]]
        print(f"{name}: real coverage {r['rate']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]; printed "
              f"{min(shown):.3f}-{max(shown):.3f} (median {np.median(shown):.3f}; the twin alone "
              f"{np.median([x['twin'] for x in row['printed']]):.3f}); worst truths: "
              f"{sorted({x['worst'] for x in row['printed']})}")
    out["curve_free"] = curve_free_coverage(args.curve_free_sims, args.seed)
    for key, row in out["curve_free"].items():
        print(f"curve-free, {key}: coverage {row['all sizes']:.3f} over all sizes, by size "
              f"{', '.join('-' if v is None else f'{v:.2f}' for v in row['by size'])} "
              f"({row['resolved']:.0%} of readings resolved)")
    out["cpu_s"] = time.process_time() - start
    print(f"{out['cpu_s']:.0f} CPU-s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
