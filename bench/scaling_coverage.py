"""The calibration behind a ladder report's intervals at scale: the configurations of stats/ladder_noise.py (the
CPU ladder's rungs, equal or falling seed noise, a seed effect shared by the arms and an arm's own persisting across
sizes, two power-law terms, an arm exponent above the baseline's, sizes off the curves by an amount their arms
share, three identical arms), the lr stage (f: two
identical arms at lrs picked at the smallest size, the optimum moving 2x; its rates also over the ladders whose
tuning audit at the largest size is clean, and how often the picks differ) and, with --sweep, the shared
and persistent fractions and the seeds varied; every ladder through the report's own estimator (estimate in
stats/scaling.py, with the report's default options) by calibrate in stats/ladder_noise.py.

    python bench/scaling_coverage.py                      # 4000 ladders per configuration, seed 0
    python bench/scaling_coverage.py --sims 20000 --sweep --json out.json
    python bench/scaling_coverage.py --no-size-effect     # the estimator before the sizes' random effect

Each rate is printed with its 95% Monte-Carlo interval over the ladders (tests/test_scaling.py runs 2,000 of each
configuration; BENCHMARKS.md has these runs).
"""
import argparse
import dataclasses
import json
import time
from pathlib import Path

from stats import scaling
from stats.ladder_noise import calibrate, configurations, lr_stage

RATES = ("coverage", "E_coverage", "alpha_coverage", "false_alarm", "family_wise", "picks_differ", "audit_clean",
         "coverage_audit_clean", "false_alarm_audit_clean", "family_wise_audit_clean")


def sweep():
    """The persistent fraction, the shared one and the seeds varied around configuration c."""
    base = configurations()["c: 50% of the seed variance shared by the arms, 15% an arm's own at every size"]
    out = {}
    for seeds in (3, 5):
        for shared, persistent in ((0.5, 0.0), (0.0, 0.15), (0.0, 0.3), (0.35, 0.3), (0.3, 0.15)):
            out[f"shared {shared:.0%}, persistent {persistent:.0%}, {seeds} seeds"] = dataclasses.replace(
                base, shared=shared, persistent=persistent, seeds=seeds)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sims", type=int, default=4000)
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also the shared and persistent fractions and the seeds")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--no-size-effect", action="store_true",
                   help="the estimator before the sizes' random effect (the residual variance alone scales every "
                        "interval), for comparison")
    args = p.parse_args()
    out = {}
    for name, truth in {**configurations(), **lr_stage(), **(sweep() if args.sweep else {})}.items():
        start = time.process_time()
        got = calibrate(truth, scaling.Options(confidence=args.level, size_effect=not args.no_size_effect),
                        args.sims, args.seed)
        got["cpu_s"] = time.process_time() - start
        out[name] = got
        rates = ", ".join(f"{key.replace('_', ' ')} {got[key]['rate']:.4f} [{got[key]['ci'][0]:.4f}, "
                          f"{got[key]['ci'][1]:.4f}]" for key in RATES if key in got)
        print(f"{name}: {rates} ({got['n']} ladders, {got['cpu_s']:.1f} CPU-s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
