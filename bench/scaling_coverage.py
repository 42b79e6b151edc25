"""The calibration behind stats/scaling.py's intervals: simulated ladders of the shipped CPU configurations fitted
by the report's own code (scaling.simulate), the coverage of the multiplier's interval and the trend's false alarms.

    python bench/scaling_coverage.py                      # 4000 ladders per configuration, seed 0
    python bench/scaling_coverage.py --sims 20000 --level 0.9 --json out.json

Configurations (tests/test_scaling.py SHIPPED runs 300 of each): the former CPU plan, 4 sizes x 3 seeds x 4 arms at
its compute (4.5e10-2.0e12 FLOPs) and its measured seed sd per size (0.03 down to 0.006); the rerun
(experiments/cpu_ladder.md), 6 sizes x 3 seeds x 3 arms at its compute (1.13e10-3.06e11 FLOPs), sd 0.02; and each
with the other noise shape. Truth: E 1.0, alpha 0.2, the arms' multipliers 0.4-1 (a constant multiplier: every trend
verdict is a false alarm). The binomial 95% interval of each rate is printed beside it.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from stats import scaling


CONFIGS = {
    "former plan: 4 sizes x 3 seeds x 4 arms, measured sd": ([4.5e10, 1.6e11, 5.9e11, 2.0e12],
                                                              [0.03, 0.02, 0.01, 0.006], (1.0, 0.8, 0.5, 0.4)),
    "former plan, sd 0.02 at every size": ([4.5e10, 1.6e11, 5.9e11, 2.0e12], [0.02] * 4, (1.0, 0.8, 0.5, 0.4)),
    "rerun: 6 sizes x 3 seeds x 3 arms, sd 0.02": ([1.13e10, 3.84e10, 8.15e10, 1.41e11, 2.15e11, 3.06e11],
                                                   [0.02] * 6, (1.0, 0.8, 0.6)),
    "rerun, sd 0.03 falling to 0.006": ([1.13e10, 3.84e10, 8.15e10, 1.41e11, 2.15e11, 3.06e11],
                                        np.geomspace(0.03, 0.006, 6), (1.0, 0.8, 0.6)),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sims", type=int, default=4000)
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    out = {}
    for name, (compute, noise, multipliers) in CONFIGS.items():
        alpha, log_a = 0.2, np.log(2.2)
        truth = [1.0, alpha, *(log_a - alpha * np.log(m) for m in multipliers)]
        start = time.process_time()
        got = scaling.simulate(truth, "shared", np.log(np.tile(compute, (len(multipliers), 1))), np.array(noise), 3,
                               args.sims, args.level, args.seed)
        got["cpu_s"] = time.process_time() - start
        trials = got["n"] * got["arms"]
        for key in ("coverage", "false_alarm"):
            ci = binomtest(round(got[key] * trials), trials).proportion_ci()
            got[f"{key}_ci"] = [ci.low, ci.high]
        out[name] = got
        print(f"{name}: coverage {got['coverage']:.4f} [{got['coverage_ci'][0]:.4f}, {got['coverage_ci'][1]:.4f}], "
              f"trend false alarms {got['false_alarm']:.4f} [{got['false_alarm_ci'][0]:.4f}, "
              f"{got['false_alarm_ci'][1]:.4f}] ({trials} verdicts of {got['n']} ladders, {got['cpu_s']:.1f} CPU-s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
