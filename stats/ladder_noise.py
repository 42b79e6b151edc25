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
With an lr stage (LrStage) each arm runs at the lr its plan's design gives it at each size (picked at the smallest
size, or interpolated between grids at two horizons), and pays for its distance from an optimum that moves with the
horizon at the arm's own rate; the true multiplier stays the arms' at their optimal lrs. stats/ladder_unseen.py
draws the report's calibration from the fit's twin perturbed by these and the rest of what the fit cannot see.
The calibration's unit is the ladder: its Monte-Carlo interval is the binomial (Clopper-Pearson) interval over the
ladders, each counted once whatever its number of arms (its arms' verdicts are not independent draws).
"""
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq
from scipy.stats import beta, ttest_rel

from stats import lr_audit, scaling
from stats.family import holm
from stats.lr_grid import AUDIT_STEPS, DESIGNS, best_and_vertex


LR_TOLERANCE = 1.4  # an arm's lr this close to its optimum at a size counts as at it


@dataclass(frozen=True)
class LrStage:
    """The lr stage inside a ladder's generating model, by the plan's design (DESIGNS). Each arm's optimum (log2 lr)
    falls by its `shift` over the ladder, linearly in log C (the horizon's tokens at a fixed tokens-per-parameter:
    Bjorck et al. 2024 find the best lr a power of the horizon), and lies, at the smallest rung, anywhere in the grid's
    middle step (uniform, drawn per ladder: where a grid falls on the optimum is luck). A rung's shape moves its
    optimum off the base shape's at that horizon by up to `transfer` x either way (uniform per arm and rung,
    growing in log C from 1 at the base: what the parametrization leaves of the width and depth). Off its optimum an
    arm pays curvature (log2 lr - log2 optimum)^2 nats at that rung (curvature: one number, or the smallest and the
    largest rung's, geometric in log C between). A grid's points are its `seeds` runs' mean, each run of its rung's
    seed sd. The pick is stats/lr_grid.py's rule (best_and_vertex): "smallest" runs every rung at the grid's best
    point at the smallest rung; "horizon" grids the base shape at the smallest and the largest rung's horizons and
    runs rung r at the vertices interpolated in log C (the best point where a grid has no vertex); "ends" the same
    with the grids at the smallest and the largest rung's own shapes, which see the shape's move. The tuning audit
    (audit_seeds of the grid's seeds; 0: none, as the ends design's plan has none) runs each arm at the largest rung
    at the 4 lrs around its lr there (stats/lr_grid.py AUDIT_STEPS, in grid steps), each seed with its own level,
    and judges it as the report does, by the very stats/lr_audit.py vertex() and judge() under `audit` (its
    tolerance and confidence): an arm declares only where its lr is "within"."""
    grid: tuple = tuple(range(6))  # log2 lr, an octave apart as configs/ladder_cpu.toml's grid
    # experiments/lr_transfer.md: gelu completep d4 w64 rises 0.16 and 0.17 nats one octave either side of its best
    curvature: float | tuple = 0.17
    shift: float | tuple = 2.0
    seeds: int = 1
    audit: lr_audit.AuditOptions = lr_audit.AuditOptions()
    design: str = "smallest"
    transfer: float = 1.0
    audit_seeds: int = lr_audit.AUDIT_SEEDS

    def optimum(self, k, log_c, rng, n):
        """(each arm's optimum at the base shape, at its shape) (n, K, S) in log2 lr."""
        grid = np.asarray(self.grid, float)
        middle = len(grid) // 2
        frac = (log_c - log_c[0]) / (log_c[-1] - log_c[0])
        shift = np.broadcast_to(np.asarray(self.shift, float), (k,))
        base = rng.uniform(grid[middle - 1], grid[middle], (n, 1, 1)) - np.log2(shift)[None, :, None] * frac
        shape = np.log2(self.transfer) * rng.uniform(-1, 1, (n, k, len(log_c))) * frac
        return base, base + shape

    def audited(self, picked, optimum, curvature, sd, rng):
        """Whether the audit puts each arm's lr at the largest rung within the tolerance (n, K): picked and optimum
        (n, K) in log2 lr there, curvature in nats per octave^2, sd (K,) of one run there. All True without an
        audit (the report then withholds nothing)."""
        if not self.audit_seeds:
            return np.ones(picked.shape, bool)
        n, k = picked.shape
        steps = np.asarray(AUDIT_STEPS) * float(np.mean(np.diff(self.grid)))  # log2 lr about the pick
        mean = curvature * (picked[..., None] + steps - optimum[..., None]) ** 2
        losses = (mean[..., None] + rng.standard_normal((n, k, 1, self.audit_seeds))
                  + sd[None, :, None, None] * rng.standard_normal((n, k, len(steps), self.audit_seeds)))
        v = lr_audit.vertex(np.log(2) * steps, losses.reshape(n * k, len(steps), -1), self.audit.confidence)
        status = [lr_audit.judge(0.0, low, high, self.audit.tolerance) for low, high in zip(v["low"], v["high"])]
        return (np.array(status) == "within").reshape(n, k)

    def draw(self, truth, n, rng):
        """(penalty (n, K, S) each arm pays at each rung for its lr, whether the arms' lrs at the largest rung
        differ (n,), whether the audit puts each arm's lr within the tolerance (n, K), each arm's lr over its
        optimum (n, K, S) in log2)."""
        if self.design not in DESIGNS:
            raise ValueError(f"lr design {self.design!r}: one of {', '.join(DESIGNS)}")
        k, s = len(truth.curves), len(truth.compute)
        log_c = np.log(np.asarray(truth.compute, float))
        grid = np.asarray(self.grid, float)
        curvature = np.broadcast_to(np.asarray(self.curvature, float), (2,))
        curv = curvature[0] * (curvature[1] / curvature[0]) ** ((log_c - log_c[0]) / (log_c[-1] - log_c[0]))
        base, optimum = self.optimum(k, log_c, rng, n)
        sd = truth.sd()

        def chosen(centre, rung, seeds, vertex):  # an arm's lr from a grid around `centre` (n, K) at that rung
            noise = rng.standard_normal((n, k, len(grid), seeds)).mean(axis=3) * sd[:, rung, None]
            best, top = best_and_vertex(grid, curv[rung] * (grid - centre[..., None]) ** 2 + noise)
            return np.where(np.isfinite(top), top, grid[best]) if vertex else grid[best], top, best

        if self.design == "smallest":
            lr = np.repeat(chosen(base[:, :, 0], 0, self.seeds, False)[0][:, :, None], s, axis=2)
        else:  # the horizon design grids the base shape, the ends design each end's own
            grids = base if self.design == "horizon" else optimum
            low, high = (chosen(grids[:, :, r], r, self.seeds, True)[0] for r in (0, s - 1))
            frac = (log_c - log_c[0]) / (log_c[-1] - log_c[0])
            lr = low[..., None] + (high - low)[..., None] * frac
        within = self.audited(lr[:, :, -1], optimum[:, :, -1], curv[-1], sd[:, -1], rng)
        return (curv * (lr - optimum) ** 2, (np.abs(lr[:, :, -1] - lr[:, :1, -1]) > 1e-9).any(axis=1), within,
                lr - optimum)

    def words(self):
        shift = np.broadcast_to(np.asarray(self.shift, float), (1,)) if np.ndim(self.shift) == 0 else self.shift
        curvature = np.atleast_1d(np.asarray(self.curvature, float))
        return (f"{DESIGNS[self.design]} ({len(self.grid)}-point octave grid{'' if self.design == 'smallest' else 's'}"
                f", {self.seeds} own seed{'s' if self.seeds > 1 else ''}), each arm's optimum falling "
                f"{', '.join(f'{v:g}' for v in shift)}x over the ladder"
                + (f", a size's shape moving it up to {self.transfer:g}x" if self.transfer != 1 else "")
                + f", {'-'.join(f'{v:g}' for v in curvature)} nats per octave^2 off it"
                + (f", the tuning audit on {self.audit_seeds} seed(s) (an arm declaring only where it puts its lr "
                   f"within {self.audit.tolerance:g}x)" if self.audit_seeds else ", no tuning audit"))


@dataclass(frozen=True)
class LadderTruth:
    """A ladder's true losses and noise. compute: each rung's training FLOPs (the same for every arm); curves: per
    arm, the baseline first, (E, ((A, alpha), ...)) for L = E + sum A C^-alpha; seed_sd: one run's sd at each rung;
    seeds: runs per cell; common, shared, persistent: the fractions of the seed variance shared as the module says
    (persistent: one number, or each arm's own); arm_scale: each arm's sd over the baseline's (None: all 1); lr: the
    lr stage (LrStage), None for lrs at each arm's optimum at every rung; size_effect_sd: the sd of each rung's own
    deviation from the curves, the same for every arm and seed there (a rung's shape: its depth, width and steps),
    drawn anew per ladder."""
    compute: tuple
    curves: tuple
    seed_sd: tuple
    seeds: int = 3
    common: float = 0.0
    shared: float = 0.0
    persistent: float | tuple = 0.0
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
        """n ladders' losses (n, K, S, seeds); with lr_stage, and {"differ" (n,): whether the arms' lr picks
        differ, "within" (n, K): whether the tuning audit puts each arm's lr within its tolerance (all True without
        an lr stage or an audit), "off" (n, K, S): each arm's lr over its optimum in log2 (0 without one)}."""
        k, s, r = len(self.curves), len(self.compute), self.seeds
        rng = np.random.default_rng(rng)
        persistent = np.broadcast_to(np.asarray(self.persistent, float), (k,))[None, :, None, None]
        own = 1 - self.common - self.shared - persistent
        z = (np.sqrt(self.common) * rng.standard_normal((n, 1, 1, r))
             + np.sqrt(self.shared) * rng.standard_normal((n, 1, s, r))
             + np.sqrt(persistent) * rng.standard_normal((n, k, 1, r))
             + np.sqrt(own) * rng.standard_normal((n, k, s, r)))
        mean = np.array([self.loss(a, self.compute) for a in range(k)])[None]
        if self.size_effect_sd > 0:
            mean = mean + self.size_effect_sd * rng.standard_normal((n, 1, s))
        differ, within, off = np.zeros(n, bool), np.ones((n, k), bool), np.zeros((n, k, s))
        if self.lr is not None:
            penalty, differ, within, off = self.lr.draw(self, n, rng)
            mean = mean + penalty
        losses = mean[..., None] + self.sd()[None, :, :, None] * z
        return (losses, {"differ": differ, "within": within, "off": off}) if lr_stage else losses

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
                f"arms at a size, {'/'.join(f'{v:.0%}' for v in np.atleast_1d(self.persistent))} one arm's own at "
                "every size"
                + ("" if not self.size_effect_sd else
                   f"; each size off the curves by a normal deviation of sd {self.size_effect_sd:.3g} its arms share")
                + ("" if self.lr is None else f"; {self.lr.words()}"))


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
    k = int(round(share * n))
    # Clopper-Pearson from the beta quantiles (binomtest's proportion_ci, without its per-call cost)
    low = beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
    high = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return {"rate": share, "ci": [float(low), float(high)]}


def calibrate(truth, options, n, rng):
    """Draws n ladders from `truth` and runs the estimator on each with `options`: {"coverage": share of the
    headline intervals holding the true log m at the reference compute (each ladder's arms averaged, then ladders
    counted), "E_coverage" and "alpha_coverage" (a truth of one term and one floor: the headline fit's E and the
    baseline's alpha), "false_alarm" (a truth of constant multipliers): share of trend verdicts fired, "family_wise" (a
    truth where no arm differs): share of ladders where Holm over the report's family (each size's pair paired by
    seed, the headline multipliers, the trends) declares anything, "n", "assumptions"}. The verdicts are the report's:
    an arm whose lr the tuning audit does not put within its tolerance (every arm, where it is the baseline's)
    leaves the family with its multiplier, its trend and its pairs but at the smallest rung (where its lr was picked
    on a grid of that size), and its trend fires no alarm (analysis/ladder_audit.py withheld). With an lr stage (the
    true m is the arms' at their optimal lrs) also "picks_differ", "declared" (the share of arms the audit lets
    declare), "coverage_declared" (the coverage of those arms' intervals), "audit_clean" (it lets every arm declare)
    and each rate over those ladders ("coverage_audit_clean", ...), "lr_within_tolerance" (every arm's lr at the
    largest rung within LR_TOLERANCE x of its optimum there) and "lr_off_top" (the median factor off it)."""
    losses, lr = truth.draw(n, rng, lr_stage=True)
    declared = lr["within"][:, 1:] & lr["within"][:, :1]  # (n, K-1): each comparison rests on both lrs
    # the headline's form only: no rate below reads the shared fit's ladder average (the trend's where the sizes
    # identify it, as in the report)
    k, sizes = len(truth.curves), len(truth.compute)
    head = "trend" if sizes >= scaling.MIN_SIZES["trend"] and k * sizes > scaling.layout("trend", k)[3] else "shared"
    est = scaling.estimate(losses, truth.log_c, options, forms=(head,), report=False)
    head = est["headline"]
    low_head, high_head = scaling.interval(head["value"], head["se"], head["dof"], options.confidence)
    true_head = truth.log_multiplier(est["reference"])
    hits = {"coverage": ((low_head <= true_head) & (true_head <= high_head)).mean(axis=1)}
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
        hits["false_alarm"] = (((low > 0) | (high < 0)) & declared).mean(axis=1)
    if truth.constant and len({c for c in truth.curves}) == 1:
        base = np.broadcast_to(losses[:, :1], losses[:, 1:].shape)
        pairs = np.nan_to_num(ttest_rel(losses[:, 1:], base, axis=-1).pvalue, nan=1.0)  # (n, K-1, S)
        # a withheld verdict is no member of the family (holm's nan)
        pairs[~declared[:, :, None] & (np.arange(sizes) > 0)] = np.nan
        p = [pairs.reshape(n, -1), np.where(declared, scaling.p_value(head["value"], head["se"], head["dof"]), np.nan)]
        if slope is not None:
            p.append(np.where(declared, scaling.p_value(slope["value"], slope["se"], slope["dof"]), np.nan))
        adjusted = holm(np.concatenate(p, axis=1))
        hits["family_wise"] = (adjusted < 1 - options.confidence).any(axis=1)
    out.update({key: rate(h) for key, h in hits.items()})
    if truth.lr is not None:
        clean = declared.all(axis=1)
        some = declared.any(axis=1)
        covered = (low_head <= true_head) & (true_head <= high_head)
        out.update({"picks_differ": rate(lr["differ"]), "audit_clean": rate(clean),
                    "declared": rate(declared.mean(axis=1)),
                    **({"coverage_declared": rate((covered & declared)[some].sum(axis=1)
                                                  / declared[some].sum(axis=1))} if some.any() else {}),
                    "lr_within_tolerance": rate((np.abs(lr["off"][:, :, -1]) <= np.log2(LR_TOLERANCE)).all(axis=1)),
                    "lr_off_top": float(np.median(2 ** np.abs(lr["off"][:, :, -1])))})
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
    (LrStage's defaults: the optimum falling 2x over the ladder), with no tuning audit."""
    null = configurations()["null: three identical arms"]
    return {LR_STAGE: replace(null, curves=null.curves[:2], lr=LrStage(audit_seeds=0))}


# experiments/cpu_ladder.md's ladder (sizes A-D, 6 seeds): its FLOPs, gelu's fit (E 0.87, alpha 0.18, 1.931 at A),
# the report's seed sd by size, and the loss's bend in log2 lr at A (the grid) and at D (the audit)
CPU_LADDER = {"compute": (1.53e11, 6.36e11, 1.37e12, 3.88e12, 6.77e12), "E": 0.87, "alpha": 0.18, "first": 1.931,
              "seed_sd": (0.014, 0.029, 0.011, 0.007, 0.008), "seeds": 6, "curvature": (0.06, 0.01)}


def cpu_ladder(multipliers, shift, design, lr_seeds, transfer=1.21, audit_seeds=None):
    """The CPU ladder's truth with arms at these compute multipliers over the first (constant), each arm's optimum
    falling by its `shift` over the ladder, the lr stage by `design` on `lr_seeds` seeds, a size's shape moving the
    optimum up to `transfer` x (experiments/lr_transfer.md: the most it moved over 4x width and depth), the tuning
    audit on `audit_seeds` (None: the plan's, the first AUDIT_SEEDS of the lr seeds; none under the ends design)."""
    if audit_seeds is None:
        audit_seeds = 0 if design == "ends" else min(lr_audit.AUDIT_SEEDS, lr_seeds)
    c = CPU_LADDER
    a = (c["first"] - c["E"]) * c["compute"][0] ** c["alpha"]
    curves = tuple((c["E"], ((a * m ** -c["alpha"], c["alpha"]),)) for m in multipliers)
    return LadderTruth(c["compute"], curves, c["seed_sd"], c["seeds"],
                       lr=LrStage(curvature=c["curvature"], shift=shift, seeds=lr_seeds, design=design,
                                  transfer=transfer, audit_seeds=audit_seeds))
