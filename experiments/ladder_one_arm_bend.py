"""A second power term in one arm's law alone (relu2's), on the CPU ladder's truth (stats/ladder_noise.py cpu_ladder:
multipliers 1, 0.958, 0.892, the horizon design on 6 grid seeds): the headline's real coverage (calibrate over
--ladders ladders), how often the headline fit's residual chi^2 test at 5% sees the bend, and the coverage the report
prints for --draws ladders drawn from it (ladder_fit.fit_ladder, --sims per truth): how often it falls below 0.90,
with the one-arm bend among the report's truths (stats/ladder_unseen.py bend_perturbations) and without it.

    python experiments/ladder_one_arm_bend.py --amplitude -1 --draws 40 --sims 200
    python experiments/ladder_one_arm_bend.py --amplitude 0 --draws 40 --sims 200   # no bend
"""
import argparse
from dataclasses import replace

import numpy as np
from scipy.stats import chi2

from stats import ladder_fit, scaling
from stats.ladder_noise import calibrate, cpu_ladder
from stats.ladder_unseen import one_arm_bends

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
    amplitude, se = (v[:, -1] for v in one_arm_bends(est, truth.log_c, est["headline"]["form"]))
    print(f"relu2's bend as one_arm_bends reads it: amplitude {np.mean(amplitude):.3f} (sd {np.std(amplitude):.3f}, "
          f"median se {np.median(se):.3f}); |z| > 1.96 in {np.mean(np.abs(amplitude / se) > 1.96):.3f}, planted "
          f"(|amplitude| > se) in {np.mean(np.abs(amplitude) > se):.3f} of the ladders")
    below = without = 0
    for draw in range(args.draws):
        losses = truth.draw(1, 10 + draw)[0]
        ladder = {arm: {c: dict(enumerate(losses[i, s])) for s, c in enumerate(truth.compute)}
                  for i, arm in enumerate(ARMS)}
        cal = ladder_fit.fit_ladder(ladder, "gelu", n_sims=args.sims, lr_design=("horizon", 6))["calibration"]
        bend = {name: got["coverage"]["rate"] for name, got in cal["truths"].items() if "law alone" in name}
        # the set before the one-arm bend joined it: the worst over the other coverage truths
        rest = min(got["coverage"]["rate"] for name, got in cal["truths"].items()
                   if name.startswith("coverage") and name not in bend)
        below += cal["coverage"]["rate"] < 0.9
        without += rest < 0.9
        print(f"draw {draw}: printed coverage {cal['coverage']['rate']:.3f} ({rest:.3f} without the one-arm bend; "
              f"the twin's {cal['twin']['coverage']['rate']:.3f}; the one-arm bend's "
              f"{', '.join(f'{v:.3f}' for v in bend.values()) or 'none planted'}; the worst truth: "
              f"{cal['worst'].get('coverage')})", flush=True)
    if args.draws:
        print(f"printed below 0.90 on {below} of {args.draws} drawn ladders ({without} without the one-arm bend)")


if __name__ == "__main__":
    main()
