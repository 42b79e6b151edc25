"""The tuning audit as a test: an arm's optimum lr at the audit's size estimated with an interval, and the lr the
ladder ran there judged against it within a stated tolerance.

Input: the audit's grid at one size, losses (B, L, S) of B grids at once (the report: one; the calibration: thousands)
at L >= 3 lrs (log lr (L,)), the same S seeds at every lr. Near its optimum the final loss is a parabola in log lr,
fitted by least squares with one level per seed (a seed's data order and init move its every lr alike, so the seeds'
levels are nuisances, not noise):

    L(lr, seed) = c_seed + b u + a u^2,   u = log lr - the grid's mean log lr,   the optimum u* = -b / (2a).

Its interval is Fieller's for the ratio: the u at which the fitted slope b + 2 a u is not significantly nonzero at
t on the residual degrees of freedom (L S - S - 2), exact under normal errors, where the delta method's symmetric
interval is not (a curvature near 0 makes the ratio's error heavy-tailed). It is bounded only where the curvature a is
significantly positive; else the audit is "not resolved". The verdict on the lr the ladder ran (the pick):
"refuted" where every optimum in the interval lies more than the tolerance from it (a pick within the tolerance of
the true optimum is refuted at most (1 - level) / 2 of the time), "within" where every one lies within it, else "not
resolved". calibrate() measures the interval's coverage and the false refutations by running vertex() on grids drawn
from a known curve, a parabola and a skewed one: the report prints both for its own audit's configuration.
"""
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest
from scipy.stats import t as student

MIN_LRS = 3  # a parabola through fewer points has no residual to scale its interval
# the seeds a plan's audit runs on (sweep/schedule.py): one leaves 4 lrs a single residual degree of freedom (t 12.7)
AUDIT_SEEDS = 2
# calibrate's second curve rises this much faster above its optimum than below (a real lr curve's divergence side);
# gelu's measured curve rose 0.16 and 0.17 nats an octave either side of its best (experiments/lr_transfer.md)
SKEW = 1.3


@dataclass(frozen=True)
class AuditOptions:
    """How the audit judges a pick. tolerance: how far (a factor either way) the lr the ladder ran may lie from the
    audited optimum, the design's stated tolerance; confidence: the vertex interval's level (a pick within the
    tolerance is refuted at most (1 - confidence) / 2 of the time); simulations: the grids calibrate() draws."""
    tolerance: float = 1.4
    confidence: float = 0.95
    simulations: int = 400


def design(log_lr, seeds):
    """The parabola's design matrix (L S, S + 2), rows lr-major: one column per seed's level, u and u^2."""
    u = np.asarray(log_lr, float) - np.mean(log_lr)
    levels = np.tile(np.eye(seeds), (len(u), 1))
    return np.column_stack([levels, np.repeat(u, seeds), np.repeat(u ** 2, seeds)])


def vertex(log_lr, losses, confidence=0.95):
    """The audited optimum of a batch of grids losses (B, L, S) at log lr (L,): {"vertex", "low", "high" (B,) in log
    lr (low and high nan where not resolved), "resolved" (B,), "curvature" (B,) in nats per (log lr)^2, "sd" (B,) of
    one run about the curve, "dof"}."""
    b, n_lrs, seeds = losses.shape
    x = design(log_lr, seeds)
    dof = n_lrs * seeds - x.shape[1]
    if n_lrs < MIN_LRS or dof < 1:
        raise ValueError(f"an audit of {n_lrs} lrs x {seeds} seeds leaves no residual degree of freedom")
    y = losses.reshape(b, -1)
    inverse = np.linalg.inv(x.T @ x)
    coef = y @ (inverse @ x.T).T
    var = ((y - coef @ x.T) ** 2).sum(axis=1) / dof
    slope, curve = coef[:, -2], coef[:, -1]
    t2 = student.ppf(0.5 + confidence / 2, dof) ** 2
    # Fieller: (b + 2 a u)^2 <= t^2 var(b + 2 a u) is 4 A u^2 + 4 B u + C <= 0 with these A, B, C
    qa = curve ** 2 - t2 * var * inverse[-1, -1]
    qb = slope * curve - t2 * var * inverse[-2, -1]
    qc = slope ** 2 - t2 * var * inverse[-2, -2]
    resolved = (curve > 0) & (qa > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(np.maximum(qb ** 2 - qa * qc, 0.0))
        low, high = (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)
        centre = np.mean(log_lr)
        return {"vertex": centre - slope / (2 * curve), "low": np.where(resolved, centre + low, np.nan),
                "high": np.where(resolved, centre + high, np.nan), "resolved": resolved, "curvature": curve,
                "sd": np.sqrt(var), "dof": dof}


def judge(picked, low, high, tolerance):
    """"refuted", "within" or "not resolved": the pick's log lr against the optimum's interval [low, high]."""
    margin = np.log(tolerance)
    if not (np.isfinite(low) and np.isfinite(high)):
        return "not resolved"
    if low > picked + margin or high < picked - margin:
        return "refuted"
    return "within" if picked - margin <= low and high <= picked + margin else "not resolved"


def audit(picked, grid, options=AuditOptions()):
    """One arm's audit: the lr it ran at the audit's size `picked` against its audit grid {lr: {seed: loss}} (the
    seeds every lr has): {"picked", "optimum", "ci" (lrs; None where not resolved), "ratio" (the pick over the
    optimum) and "ratio_ci", "status" (judge's), "seeds", "lrs", "curvature", "sd", "dof", "calibration"}; None
    where the grid has fewer than MIN_LRS lrs or no residual degree of freedom."""
    lrs = sorted(grid)
    seeds = sorted(set.intersection(*(set(grid[lr]) for lr in lrs)), key=str) if lrs else []
    log_lr = np.log(lrs)
    if len(lrs) < MIN_LRS or not seeds or len(lrs) * len(seeds) - len(seeds) - 2 < 1:
        return None
    losses = np.array([[[grid[lr][s] for s in seeds] for lr in lrs]], float)
    if not np.isfinite(losses).all():
        return None
    v = {k: (w[0] if isinstance(w, np.ndarray) else w) for k, w in vertex(log_lr, losses, options.confidence).items()}
    ci = [float(np.exp(v["low"])), float(np.exp(v["high"]))] if v["resolved"] else None
    optimum = float(np.exp(v["vertex"])) if v["curvature"] > 0 else None
    return {"picked": picked, "optimum": optimum, "ci": ci,
            "ratio": None if optimum is None else picked / optimum,
            "ratio_ci": None if ci is None else [picked / ci[1], picked / ci[0]],
            "status": judge(np.log(picked), v["low"], v["high"], options.tolerance), "tolerance": options.tolerance,
            "confidence": options.confidence, "seeds": seeds, "lrs": lrs, "curvature": float(v["curvature"]),
            "sd": float(v["sd"]), "dof": int(v["dof"]),
            "calibration": calibrate(log_lr, len(seeds), float(v["curvature"]), float(v["sd"]), options)
            if v["curvature"] > 0 and v["sd"] > 0 else None}


def draw(log_lr, seeds, curvature, sd, optimum, n, rng, skew=1.0):
    """n audit grids (n, L, S) from a known curve: curvature (log lr - optimum)^2, times `skew` above the optimum,
    plus a level per seed and normal noise of sd."""
    d = np.asarray(log_lr, float)[None, :, None] - np.asarray(optimum, float).reshape(-1, 1, 1)
    mean = curvature * d ** 2 * np.where(d > 0, skew, 1.0)
    return mean + rng.standard_normal((n, 1, seeds)) + sd * rng.standard_normal((n, len(log_lr), seeds))


def calibrate(log_lr, seeds, curvature, sd, options=AuditOptions(), rng=0):
    """The audit's measured rates on grids like this one (these lrs and seeds, this curvature and noise, the optimum
    anywhere in the grid's middle half): {"parabola": on the curve the fit assumes, "skewed": on one SKEW x steeper
    above its optimum than below (which the parabola cannot see, and which biases its vertex towards the gentle
    side)}, each {"coverage": share of intervals holding the true optimum, "false_refutation": share of picks
    refuted while the true optimum lies at the tolerance from them (a false refutation's worst case)}, each
    {"rate", "ci"} (Clopper-Pearson over the grids), and "n", "assumptions"."""
    rng = np.random.default_rng(rng)
    n = options.simulations
    lo, hi = np.quantile(log_lr, [0.25, 0.75])
    out = {"n": n, "assumptions": f"{seeds} seed(s) x {len(log_lr)} lrs, curvature {curvature:.3g} nats per "
                                  f"(log lr)^2 and noise sd {sd:.3g} (this audit's), the optimum anywhere in the "
                                  "grid's middle half"}
    for name, skew in (("parabola", 1.0), ("skewed", SKEW)):
        optimum = rng.uniform(lo, hi, n)
        # a skewed curve of the same mean curvature on its two sides, which is what the parabola measures
        v = vertex(log_lr, draw(log_lr, seeds, 2 * curvature / (1 + skew), sd, optimum, n, rng, skew),
                   options.confidence)
        covered = (v["low"] <= optimum) & (optimum <= v["high"])
        picked = optimum + np.log(options.tolerance) * rng.choice([-1, 1], n)  # at the tolerance, either side
        refuted = np.array([judge(p, low, high, options.tolerance) == "refuted"
                            for p, low, high in zip(picked, v["low"], v["high"])])
        out[name] = {key: {"rate": float(hits.mean()),
                           "ci": [float(c) for c in binomtest(int(hits.sum()), n).proportion_ci()]}
                     for key, hits in (("coverage", covered), ("false_refutation", refuted))}
    return out
