"""The generating model of a ladder's losses, and the calibration that draws ladders from it: how often the
estimator's (estimate (stats/scaling.py)) headline interval holds the true multiplier, how often its trend fires on a
constant one, how often Holm declares anything when no arm differs.

The model (LadderTruth names each assumption): every arm's mean loss a sum of power laws in compute, E + sum_i A_i
C^-alpha_i (two terms make the estimator's one-term curve mildly wrong; an arm's own exponent makes its multiplier
change with compute); a run's deviation from it normal, of a per-size sd (seeds vary less as models grow), scaled
per arm (heteroscedastic cells), and split into parts a seed's runs share, because at a seed every arm starts from
the same shared weights and reads the same data order:
    common      the same for every arm and size of the seed (its data order),
    shared      the same for the arms of the seed at one size (the init they share there),
    persistent  one arm's own, the same at every size of the seed,
    the rest    each run's own.
The calibration's unit is the ladder: its Monte-Carlo interval is the binomial (Clopper-Pearson) interval over the
ladders, each counted once whatever its number of arms (its arms' verdicts are not independent draws).
"""
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binomtest, ttest_rel

from stats import scaling
from stats.family import holm


@dataclass(frozen=True)
class LadderTruth:
    """A ladder's true losses and noise. compute: each rung's training FLOPs (the same for every arm); curves: per
    arm, the baseline first, (E, ((A, alpha), ...)) for L = E + sum A C^-alpha; seed_sd: one run's sd at each rung;
    seeds: runs per cell; common, shared, persistent: the fractions of the seed variance shared as the module says;
    arm_scale: each arm's sd over the baseline's (None: all 1)."""
    compute: tuple
    curves: tuple
    seed_sd: tuple
    seeds: int = 3
    common: float = 0.0
    shared: float = 0.0
    persistent: float = 0.0
    arm_scale: tuple | None = None

    @property
    def log_c(self):
        return np.log(np.tile(np.asarray(self.compute, float), (len(self.curves), 1)))

    def loss(self, arm, compute):
        e, terms = self.curves[arm]
        return e + sum(a * np.asarray(compute, float) ** -alpha for a, alpha in terms)

    def draw(self, n, rng):
        """n ladders' losses (n, K, S, seeds)."""
        k, s, r = len(self.curves), len(self.compute), self.seeds
        rng = np.random.default_rng(rng)
        own = 1 - self.common - self.shared - self.persistent
        z = (np.sqrt(self.common) * rng.standard_normal((n, 1, 1, r))
             + np.sqrt(self.shared) * rng.standard_normal((n, 1, s, r))
             + np.sqrt(self.persistent) * rng.standard_normal((n, k, 1, r))
             + np.sqrt(own) * rng.standard_normal((n, k, s, r)))
        scale = np.ones(k) if self.arm_scale is None else np.asarray(self.arm_scale, float)
        sd = scale[:, None] * np.asarray(self.seed_sd, float)[None]
        mean = np.array([self.loss(a, self.compute) for a in range(k)])
        return mean[None, :, :, None] + sd[None, :, :, None] * z

    def log_multiplier(self, compute):
        """Each other arm's true log m (K-1,) at `compute`: the baseline's compute reaching its loss there, over it
        (nan where the baseline never reaches it)."""
        out = []
        for arm in range(1, len(self.curves)):
            target = self.loss(arm, compute)
            if target <= self.curves[0][0]:
                out.append(np.nan)
                continue
            out.append(brentq(lambda u: self.loss(0, np.exp(u)) - target, np.log(compute) - 200,
                              np.log(compute) + 200, xtol=1e-13) - np.log(compute))
        return np.array(out)

    @property
    def constant(self):
        """Whether every arm's multiplier is the same at every compute (one exponent, one floor, one term)."""
        return (len({e for e, _ in self.curves}) == 1 and all(len(t) == 1 for _, t in self.curves)
                and len({t[0][1] for _, t in self.curves}) == 1)

    def assumptions(self):
        terms = max(len(t) for _, t in self.curves)
        exps = sorted({a for _, t in self.curves for _, a in t})
        return (f"{len(self.curves)} arms x {len(self.compute)} sizes x {self.seeds} seeds, each arm's loss "
                f"E + {' + '.join(['A C^-alpha'] * terms)} (exponents {', '.join(f'{a:.3g}' for a in exps)}), "
                f"normal seed noise of sd {', '.join(f'{v:.3g}' for v in self.seed_sd)} by size"
                + ("" if self.arm_scale is None else
                   f" times {', '.join(f'{v:.3g}' for v in self.arm_scale)} by arm")
                + f", of which {self.common:.0%} common to a seed's arms and sizes, {self.shared:.0%} shared by its "
                f"arms at a size, {self.persistent:.0%} one arm's own at every size")


def truth_of(est, i, log_c, form, seeds):
    """The LadderTruth an estimate's ladder i implies: its fit in `form` as the curves, its noise model as the
    noise (the configuration the report states its coverage for); with one seed, which measures no noise, the
    fit's residuals give its sd."""
    f = est["fits"][form]
    e_idx, al, _, _ = scaling.layout(form, log_c.shape[0])
    curves = tuple((float(f["theta"][i, e]), ((float(f["A"][i, a]), float(f["theta"][i, l])),))
                   for a, (e, l) in enumerate(zip(e_idx, al)))
    common, shared, persistent = (float(v) for v in est["fractions"][i])
    return LadderTruth(tuple(float(c) for c in np.exp(log_c.mean(axis=0))), curves,
                       tuple(float(v) * (float(f["residual_scale"][i]) if seeds == 1 else 1.0)
                             for v in est["sd"][i]), seeds, common, shared, persistent)


def rate(hits):
    """{"rate", "ci"}: a share of ladders (hits (B,) in [0, 1], one per ladder) with its 95% Clopper-Pearson
    interval over the ladders."""
    n = len(hits)
    share = float(np.mean(hits))
    ci = binomtest(int(round(share * n)), n).proportion_ci()
    return {"rate": share, "ci": [float(ci.low), float(ci.high)]}


def calibrate(truth, options, n, rng):
    """Draws n ladders from `truth` and runs the estimator on each with `options`: {"coverage": share of the
    headline intervals holding the true log m at the reference compute (each ladder's arms averaged, then ladders
    counted), "E_coverage" and "alpha_coverage" (a truth of one term and one floor: the headline fit's E and the
    baseline's alpha), "false_alarm" (a truth of constant multipliers): share of trend verdicts fired, "family_wise" (a
    truth where no arm differs): share of ladders where Holm over the report's family (each size's pair paired by
    seed, the headline multipliers, the trends) declares anything, "n", "assumptions"}."""
    losses = truth.draw(n, rng)
    est = scaling.estimate(losses, truth.log_c, options, forms=("shared", "trend"), report=False)
    head = est["headline"]
    low, high = scaling.interval(head["value"], head["se"], head["dof"], options.confidence)
    true = truth.log_multiplier(est["reference"])
    out = {"coverage": rate(((low <= true) & (true <= high)).mean(axis=1)), "n": n,
           "assumptions": truth.assumptions(), "headline_form": head["form"], "reference": est["reference"]}
    if all(len(terms) == 1 for _, terms in truth.curves) and len({e for e, _ in truth.curves}) == 1:
        f = est["fits"][head["form"]]  # one term and one floor: the fit's E and the baseline's alpha have a truth
        for name, (value, se), true in (("E", f["E"], truth.curves[0][0]), ("alpha", f["alpha"],
                                                                            truth.curves[0][1][0][1])):
            low, high = scaling.interval(value[:, 0], se[:, 0], f["dof"], options.confidence)
            out[f"{name}_coverage"] = rate((low <= true) & (true <= high))
    slope = est["slope"]
    if slope is not None and truth.constant:
        low, high = scaling.interval(slope["value"], slope["se"], slope["dof"], options.confidence)
        out["false_alarm"] = rate(((low > 0) | (high < 0)).mean(axis=1))
    if truth.constant and len({c for c in truth.curves}) == 1:
        base = np.broadcast_to(losses[:, :1], losses[:, 1:].shape)
        p = [ttest_rel(losses[:, 1:], base, axis=-1).pvalue.reshape(n, -1),
             scaling.p_value(head["value"], head["se"], head["dof"])]
        if slope is not None:
            p.append(scaling.p_value(slope["value"], slope["se"], slope["dof"]))
        adjusted = holm(np.nan_to_num(np.concatenate(p, axis=1), nan=1.0))
        out["family_wise"] = rate((adjusted < 1 - options.confidence).any(axis=1))
    return out


def configurations():
    """The configurations the tests (2,000 ladders each) and bench/scaling_coverage.py calibrate: the CPU
    ladder's rungs (experiments/cpu_ladder.md: 6 sizes x 3 seeds x 3 arms, gelu's widest gap first), its loss scale
    (E 1.0, alpha 0.2, the baseline's loss 2.2 above E at the ladder's centre), the arms' multipliers 1, 0.8 and 0.6
    at the centre; "null": three identical arms (Holm's family-wise error)."""
    compute = (1.13e10, 3.84e10, 8.15e10, 1.41e11, 2.15e11, 3.06e11)
    centre = float(np.sqrt(compute[0] * compute[-1]))
    alpha = 0.2

    def arms(multipliers, ratio=1.0, second=None):
        out = []
        for i, m in enumerate(multipliers):
            own = alpha * (ratio if i else 1.0)  # the arm's exponent; A keeps its multiplier m at the centre
            terms = ((2.2 * centre ** own * m ** -alpha, own),) + ((second,) if second else ())
            out.append((1.0, terms))
        return tuple(out)

    three, flat = (1.0, 0.8, 0.6), (0.02,) * 6
    return {
        "a: equal noise, sd 0.02": LadderTruth(compute, arms(three), flat),
        "b: seed sd falling 0.03 -> 0.006": LadderTruth(compute, arms(three), tuple(np.geomspace(0.03, 0.006, 6))),
        "c: 50% of the seed variance shared by the arms, 15% an arm's own at every size":
            LadderTruth(compute, arms(three), flat, shared=0.5, persistent=0.15),
        "d: two power-law terms": LadderTruth(compute, arms(three, second=(50.0, 0.12)), flat),
        "e: the arms' exponents 1.1x the baseline's": LadderTruth(compute, arms(three, ratio=1.1), flat),
        "null: three identical arms": LadderTruth(compute, arms((1.0, 1.0, 1.0)), flat),
    }
