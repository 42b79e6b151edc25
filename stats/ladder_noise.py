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
Each rung may sit off the curves by its own normal deviation (size_effect_sd), the same for every arm and seed
there: a rung's shape, not its seeds (configuration g).
With an lr stage (LrStage) each arm runs at the lr its grid picked at the smallest size, and pays for its distance
from an optimum that moves with size; the true multiplier stays the arms' at their optimal lrs.
The calibration's unit is the ladder: its Monte-Carlo interval is the binomial (Clopper-Pearson) interval over the
ladders, each counted once whatever its number of arms (its arms' verdicts are not independent draws).
"""
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binomtest, ttest_rel

from stats import scaling
from stats.family import holm


@dataclass(frozen=True)
class LrStage:
    """The lr stage inside a ladder's generating model. Each arm's lr is picked on a grid at the smallest rung, on
    the grid's own seeds, by stats/lr_grid.py's rule (the grid point of the lowest mean loss), and run at every rung.
    Off its optimum an arm pays curvature (log2 lr - log2 optimum)^2 nats at that rung; the optimum, the same for
    every arm, falls by `shift` over the ladder (linearly in log C) and lies, at the smallest rung, anywhere in the
    grid's middle step (uniform, drawn per ladder: where a grid falls on the optimum is luck). The grid's noise is
    each rung's seed sd, independent between its runs. The tuning audit re-grids at the largest rung on fresh seeds
    and flags an arm whose pick lies more than `audit` x from the vertex of the parabola through that grid's best
    point and its neighbours (lr_grid's interpolation), or whose best point there is an edge or no minimum."""
    grid: tuple = tuple(range(6))  # log2 lr, an octave apart as configs/ladder_cpu.toml's grid
    # experiments/lr_transfer.md: gelu completep d4 w64 rises 0.16 and 0.17 nats one octave either side of its best
    curvature: float = 0.17
    shift: float = 2.0
    seeds: int = 1
    audit: float = 2.0

    def draw(self, truth, n, rng):
        """(penalty (n, K, S) each arm pays at each rung for its pick, whether the arms' picks differ (n,), whether
        the audit flags any arm (n,))."""
        k, s = len(truth.curves), len(truth.compute)
        log_c = np.log(np.asarray(truth.compute, float))
        grid = np.asarray(self.grid, float)
        middle = len(grid) // 2
        optimum = (rng.uniform(grid[middle - 1], grid[middle], (n, 1, 1))
                   - np.log2(self.shift) * (log_c - log_c[0]) / (log_c[-1] - log_c[0]))  # (n, 1, S)
        sd = truth.sd()

        def grid_means(rung):  # (n, K, grid) each arm's mean over the grid's seeds; its curve's loss drops out
            noise = rng.standard_normal((n, k, len(grid), self.seeds)).mean(axis=3) * sd[:, rung, None]
            return self.curvature * (grid - optimum[:, :, rung, None]) ** 2 + noise

        pick = grid[np.argmin(grid_means(0), axis=2)]  # (n, K)
        top = grid_means(s - 1)
        best = np.argmin(top, axis=2)
        inner = np.clip(best, 1, len(grid) - 2)[..., None]
        y0, y1, y2 = (np.take_along_axis(top, inner + d, axis=2)[..., 0] for d in (-1, 0, 1))
        bend = y0 - 2 * y1 + y2
        with np.errstate(divide="ignore", invalid="ignore"):
            vertex = grid[inner[..., 0]] + (grid[1] - grid[0]) * (y0 - y2) / (2 * bend)
        flag = (best != inner[..., 0]) | (bend <= 0) | (np.abs(pick - vertex) > np.log2(self.audit))
        return (self.curvature * (pick[:, :, None] - optimum) ** 2, (pick != pick[:, :1]).any(axis=1),
                flag.any(axis=1))


@dataclass(frozen=True)
class LadderTruth:
    """A ladder's true losses and noise. compute: each rung's training FLOPs (the same for every arm); curves: per
    arm, the baseline first, (E, ((A, alpha), ...)) for L = E + sum A C^-alpha; seed_sd: one run's sd at each rung;
    seeds: runs per cell; common, shared, persistent: the fractions of the seed variance shared as the module says;
    arm_scale: each arm's sd over the baseline's (None: all 1); lr: the lr stage (LrStage), None for lrs at each
    arm's optimum at every rung; size_effect_sd: the sd of each rung's own deviation from the curves, the same for
    every arm and seed there (a rung's shape: its depth, width and steps), drawn anew per ladder."""
    compute: tuple
    curves: tuple
    seed_sd: tuple
    seeds: int = 3
    common: float = 0.0
    shared: float = 0.0
    persistent: float = 0.0
    arm_scale: tuple | None = None
    lr: LrStage | None = None
    size_effect_sd: float = 0.0

    @property
    def log_c(self):
        return np.log(np.tile(np.asarray(self.compute, float), (len(self.curves), 1)))

    def loss(self, arm, compute):
        e, terms = self.curves[arm]
        return e + sum(a * np.asarray(compute, float) ** -alpha for a, alpha in terms)

    def sd(self):
        """One run's sd (K, S) in each cell."""
        scale = np.ones(len(self.curves)) if self.arm_scale is None else np.asarray(self.arm_scale, float)
        return scale[:, None] * np.asarray(self.seed_sd, float)[None]

    def draw(self, n, rng, lr_stage=False):
        """n ladders' losses (n, K, S, seeds); with lr_stage, and {"differ", "flagged"} (n,): whether the arms'
        lr picks differ and whether the tuning audit flags one (all False without an lr stage)."""
        k, s, r = len(self.curves), len(self.compute), self.seeds
        rng = np.random.default_rng(rng)
        own = 1 - self.common - self.shared - self.persistent
        z = (np.sqrt(self.common) * rng.standard_normal((n, 1, 1, r))
             + np.sqrt(self.shared) * rng.standard_normal((n, 1, s, r))
             + np.sqrt(self.persistent) * rng.standard_normal((n, k, 1, r))
             + np.sqrt(own) * rng.standard_normal((n, k, s, r)))
        mean = np.array([self.loss(a, self.compute) for a in range(k)])[None]
        if self.size_effect_sd > 0:
            mean = mean + self.size_effect_sd * rng.standard_normal((n, 1, s))
        differ, flagged = np.zeros(n, bool), np.zeros(n, bool)
        if self.lr is not None:
            penalty, differ, flagged = self.lr.draw(self, n, rng)
            mean = mean + penalty
        losses = mean[..., None] + self.sd()[None, :, :, None] * z
        return (losses, {"differ": differ, "flagged": flagged}) if lr_stage else losses

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
                f"arms at a size, {self.persistent:.0%} one arm's own at every size"
                + ("" if not self.size_effect_sd else
                   f"; each size off the curves by a normal deviation of sd {self.size_effect_sd:.3g} its arms share")
                + ("" if self.lr is None else
                   f"; each arm's lr picked on a {len(self.lr.grid)}-point octave grid at the smallest size "
                   f"({self.lr.seeds} own seed{'s' if self.lr.seeds > 1 else ''}), the optimum falling "
                   f"{self.lr.shift:g}x over the ladder, {self.lr.curvature:g} nats per octave^2 off it"))


def truth_of(est, i, log_c, form, seeds):
    """The LadderTruth an estimate's ladder i implies: its fit in `form` as the curves, its noise model as the
    noise and the fit's size effect as the rungs' own deviations (the configuration the report states its coverage
    for); with one seed, which measures no noise, the
    fit's residuals give its sd."""
    f = est["fits"][form]
    e_idx, al, _, _ = scaling.layout(form, log_c.shape[0])
    curves = tuple((float(f["theta"][i, e]), ((float(f["A"][i, a]), float(f["theta"][i, l])),))
                   for a, (e, l) in enumerate(zip(e_idx, al)))
    common, shared, persistent = (float(v) for v in est["fractions"][i])
    return LadderTruth(tuple(float(c) for c in np.exp(log_c.mean(axis=0))), curves,
                       tuple(float(v) * (float(f["residual_scale"][i]) if seeds == 1 else 1.0)
                             for v in est["sd"][i]), seeds, common, shared, persistent,
                       size_effect_sd=float(f["size_effect_sd"][i]))


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
    seed, the headline multipliers, the trends) declares anything, "n", "assumptions"}; with an lr stage (the true m
    is the arms' at their optimal lrs) also "picks_differ", "audit_clean" (the tuning audit flags no arm) and each
    rate over the ladders whose audit is clean ("coverage_audit_clean", ...)."""
    losses, lr = truth.draw(n, rng, lr_stage=True)
    # the headline's form only: no rate below reads the shared fit's ladder average (the trend's where the sizes
    # identify it, as in the report)
    k, sizes = len(truth.curves), len(truth.compute)
    head = "trend" if sizes >= scaling.MIN_SIZES["trend"] and k * sizes > scaling.layout("trend", k)[3] else "shared"
    est = scaling.estimate(losses, truth.log_c, options, forms=(head,), report=False)
    head = est["headline"]
    low, high = scaling.interval(head["value"], head["se"], head["dof"], options.confidence)
    true = truth.log_multiplier(est["reference"])
    hits = {"coverage": ((low <= true) & (true <= high)).mean(axis=1)}
    out = {"n": n, "assumptions": truth.assumptions(), "headline_form": head["form"], "reference": est["reference"]}
    if all(len(terms) == 1 for _, terms in truth.curves) and len({e for e, _ in truth.curves}) == 1:
        f = est["fits"][head["form"]]  # one term and one floor: the fit's E and the baseline's alpha have a truth
        for name, (value, se), true in (("E", f["E"], truth.curves[0][0]), ("alpha", f["alpha"],
                                                                            truth.curves[0][1][0][1])):
            low, high = scaling.interval(value[:, 0], se[:, 0], f["level_dof"], options.confidence)
            hits[f"{name}_coverage"] = (low <= true) & (true <= high)
    slope = est["slope"]
    if slope is not None and truth.constant:
        low, high = scaling.interval(slope["value"], slope["se"], slope["dof"], options.confidence)
        hits["false_alarm"] = ((low > 0) | (high < 0)).mean(axis=1)
    if truth.constant and len({c for c in truth.curves}) == 1:
        base = np.broadcast_to(losses[:, :1], losses[:, 1:].shape)
        p = [ttest_rel(losses[:, 1:], base, axis=-1).pvalue.reshape(n, -1),
             scaling.p_value(head["value"], head["se"], head["dof"])]
        if slope is not None:
            p.append(scaling.p_value(slope["value"], slope["se"], slope["dof"]))
        adjusted = holm(np.nan_to_num(np.concatenate(p, axis=1), nan=1.0))
        hits["family_wise"] = (adjusted < 1 - options.confidence).any(axis=1)
    out.update({key: rate(h) for key, h in hits.items()})
    if truth.lr is not None:
        clean = ~lr["flagged"]
        out.update({"picks_differ": rate(lr["differ"]), "audit_clean": rate(clean)})
        if clean.any():
            out.update({f"{key}_audit_clean": rate(h[clean]) for key, h in hits.items()})
    return out


def configurations():
    """The configurations the tests (2,000 ladders each) and bench/scaling_coverage.py calibrate: the CPU
    ladder's rungs (the 2026-11-26 depth ladder, in experiments/cpu_ladder.md's history: 6 sizes x 3 seeds x 3
    arms, gelu's widest gap first), its loss scale (E 1.0, alpha 0.2, the baseline's loss 2.2 above E at the
    ladder's centre), the arms' multipliers 1, 0.8 and 0.6 at the centre; g: its sizes off the curves as a real
    ladder's shapes put them (sd 0.02, the seed sd of one run); "null": three identical arms (Holm's family-wise
    error)."""
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
        "g: each size off the curves by sd 0.02, shared by its arms": LadderTruth(compute, arms(three), flat,
                                                                                 size_effect_sd=0.02),
        "null: three identical arms": LadderTruth(compute, arms((1.0, 1.0, 1.0)), flat),
    }


LR_STAGE = "f: two identical arms, each at its lr picked at the smallest size, the optimum falling 2x over the ladder"


def lr_stage():
    """Configuration f, which the calibrated claim excludes (BENCHMARKS.md, "Ladder estimator calibration"): the
    null's truth with two identical arms, each run at its lr picked on a one-seed grid at the smallest rung
    (LrStage's defaults: the optimum falling 2x over the ladder)."""
    null = configurations()["null: three identical arms"]
    return {LR_STAGE: replace(null, curves=null.curves[:2], lr=LrStage())}
