"""A second power term in one arm's law alone (relu2's), on the CPU ladder's truth (stats/ladder_noise.py cpu_ladder:
multipliers 1, 0.958, 0.892, the horizon design on 6 grid seeds): the headline's real coverage (calibrate over
--ladders ladders), the coverage the report prints for ladders drawn from it (ladder_fit.fit_ladder, --sims per
truth), and how often the headline fit's residual chi^2 test at 5% sees the bend.

    python experiments/ladder_one_arm_bend.py --amplitude -1 --draws 4 --sims 400
    python experiments/ladder_one_arm_bend.py --amplitude 0      # no bend: the residual test's own rate
"""
import argparse
from dataclasses import replace

import numpy as np
from scipy.stats import chi2

from stats import ladder_fit, scaling
from stats.ladder_noise import calibrate, cpu_ladder

ARMS = ("gelu", "aglu", "relu2")


def bent(amplitude):
    """The truth with relu2's law plus amplitude x (gelu's first term at the top rung) at half gelu's exponent."""
    truth = cpu_ladder((1.0, 0.958, 0.892), (1.0, 1.0, 1.0), "horizon", 6)
    a, alpha = truth.curves[0][1][0]
    term = (amplitude * a * float(truth.compute[-1]) ** (-alpha / 2), alpha / 2)
    floor, own = truth.curves[2]
    return replace(truth, curves=(*truth.curves[:2], (floor, own + (term,))))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--amplitude", type=float, default=-1.0, help="the term's size; < 0: relu2 falls faster")
    p.add_argument("--ladders", type=int, default=400, help="ladders for the real coverage and the residual test")
    p.add_argument("--draws", type=int, default=4, help="ladders reported as the report would")
    p.add_argument("--sims", type=int, default=400, help="the report's ladders per truth (fit_ladder's n_sims)")
    args = p.parse_args()
    truth = bent(args.amplitude)
    real = calibrate(truth, scaling.Options(), args.ladders, 0)["coverage"]
    print(f"amplitude {args.amplitude:g}: real headline coverage {real['rate']:.3f} "
          f"[{real['ci'][0]:.3f}, {real['ci'][1]:.3f}]")
    est = scaling.estimate(truth.draw(args.ladders, 5), truth.log_c, scaling.Options(), report=False)
    fit = est["fits"][est["headline"]["form"]]
    p_values = chi2.sf(fit["residual_scale"] ** 2 * fit["dof"], fit["dof"])
    print(f"residual chi^2 test at 5% ({fit['dof']} dof) rejects {np.mean(p_values < 0.05):.3f} of the ladders")
    for draw in range(args.draws):
        losses = truth.draw(1, 10 + draw)[0]
        ladder = {arm: {c: dict(enumerate(losses[i, s])) for s, c in enumerate(truth.compute)}
                  for i, arm in enumerate(ARMS)}
        cal = ladder_fit.fit_ladder(ladder, "gelu", n_sims=args.sims, lr_design=("horizon", 6))["calibration"]
        print(f"draw {draw}: printed coverage {cal['coverage']['rate']:.3f} (the twin's "
              f"{cal['twin']['coverage']['rate']:.3f}; the worst truth: {cal['worst'].get('coverage')})")


if __name__ == "__main__":
    main()
