"""What is X worth in compute: the estimator of a ladder report. The arms' losses against training compute fitted
together over a ladder of sizes, X's gain as a compute multiplier over the baseline at a stated compute, whether it
changes as the models grow, the loss floor E and exponent alpha, each with its interval. `estimate` is the one
function that gives them: stats/ladder_fit.py formats its output for the report, stats/ladder_noise.py calibrates
it, bench/scaling_coverage.py and tests/test_scaling.py call it with the report's options.

Input: losses (B, K, S, seeds) of B ladders at once (the report: one; the calibration: thousands), K arms with the
baseline first, S sizes, the same seeds at every point, at log C (K, S). The means over seeds are fitted in one of
three forms of L = E + A C^-alpha:

    shared   E and alpha shared by the arms, A per arm: K + 2 parameters. X's multiplier over the baseline is one
             number, m = (A_base / A_X)^(1/alpha), at every C: the ladder average, assuming m constant.
    trend    E shared, A and alpha per arm: 2K + 1 parameters. m changes with C; the slope of log m on log C is
             alpha_X / alpha_base - 1 exactly (the trend verdict). The headline, m at the reference compute (the
             largest rung unless stated), comes from this fit where the ladder has the sizes for it.
    per_arm  E, A and alpha per arm (Hoffmann et al.'s floor per arm), from MIN_SIZES["per_arm"] sizes.

Noise (noise_model): a run's deviation has a per-size sd and is correlated between the cells of a seed (every
arm starts from the same shared weights and reads the same data order); each size also sits off the smooth law by
its own amount, a random effect of the sizes (fit, size_effect_variance). The means are fitted by generalised least
squares under that covariance, with t intervals scaled by the whitened residual variance (Hartung and Knapp) and
the delta method for log m and the slope. What each part is, and why: docs/comparing_runs.md ("Weighting, decided
once").
"""
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.special import digamma, polygamma
from scipy.stats import t as student

from errors import ConfigError
from stats.curve_free import curve_free

FORMS = {"shared": "L = E + A_arm C^-alpha, E and alpha shared by the arms, A per arm",
         "trend": "L = E + A_arm C^-alpha_arm, E shared, A and alpha per arm",
         "per_arm": "L = E_arm + A_arm C^-alpha_arm, every parameter per arm"}
# the fewest sizes each form needs: the shared form 3 (E, alpha and the baseline's A from its own points), the trend
# form 4 (2 residual degrees of freedom per pair of arms), the per-arm form 5 (2 per arm)
MIN_SIZES = {"shared": 3, "trend": 4, "per_arm": 5}
# GPT-2 124M (configs/gpt2_124m.toml) for 19,073 steps of 2**19 tokens (~10B) on GPT-2's 50,304-token vocabulary:
# model.py's flops_per_token(1024), 855,383,040 FLOPs per token; tests/test_scaling.py checks it against model.py.
GPT2_124M_10B = ("GPT-2 124M at 10B tokens", 855_383_040 * 19_073 * 2 ** 19, 50_304)
MAX_CORRELATED = 0.9  # the most of the seed variance the noise model lets be shared between cells: a covariance
# with all of it shared would be singular, and 3 seeds never measure a correlation that close to 1
SIZE_EFFECT_LIMIT = 1e6  # the largest size-effect variance fit allows, over the mean seed variance of a cell mean
PER_SEED_FLAG = 1.5  # the seeds' own fits spread over the model's sd by more than this: the noise model misses some


def check_ladder(ladder, baseline):
    """(arms, log C (K, S), losses (K, S, seeds), seeds) with the baseline first; bad input is a ConfigError."""
    if baseline not in ladder:
        raise ConfigError(f"baseline {baseline!r} has no ladder; name one of {', '.join(ladder)}")
    arms = [baseline] + [a for a in ladder if a != baseline]
    seeds = sorted(next(iter(ladder[baseline].values())), key=str)
    sizes = len(ladder[baseline])
    for arm in arms:
        computes = sorted(ladder[arm])
        if bad := [c for c in computes if not c > 0]:
            raise ConfigError(f"{arm}: compute {bad[0]} is not positive; give each ladder point's training FLOPs")
        if len(computes) != sizes:
            raise ConfigError(f"{arm} has {len(computes)} sizes, {baseline} {sizes}; every arm needs every size")
        for c in computes:
            if sorted(ladder[arm][c], key=str) != seeds:
                raise ConfigError(f"{arm} at C={c:.3g}: seeds {sorted(ladder[arm][c], key=str)}, {baseline}'s first "
                                  f"point {seeds}; every point needs the same seeds")
            if not all(math.isfinite(ladder[arm][c][s]) for s in seeds):
                raise ConfigError(f"{arm} at C={c:.3g}: a non-finite loss (a diverged run); rerun it at a lower lr")
    if sizes < MIN_SIZES["shared"]:
        raise ConfigError(f"a ladder of {sizes} sizes identifies no E and alpha; train at least "
                          f"{MIN_SIZES['shared']} sizes ({MIN_SIZES['trend']} for the trend, {MIN_SIZES['per_arm']} "
                          "for a curve per arm)")
    log_c = np.log([sorted(ladder[a]) for a in arms])
    losses = np.array([[[ladder[a][c][s] for s in seeds] for c in sorted(ladder[a])] for a in arms])
    return arms, log_c, losses, seeds


def layout(form, k):
    """Indices into the parameter vector of each arm's E, alpha and log A (arm 0 the baseline), and its length."""
    arms = np.arange(k)
    if form == "shared":
        return np.zeros(k, int), np.ones(k, int), 2 + arms, k + 2
    if form == "trend":
        return np.zeros(k, int), 1 + arms, 1 + k + arms, 2 * k + 1
    return arms, k + arms, 2 * k + arms, 3 * k


def _curve(theta, x, idx):
    """Fitted means (B, K, S) at parameters theta (B, p), and their power-law part; x: centred log C (K, S)."""
    e, al, la, _ = idx
    g = np.exp(theta[:, la, None] - theta[:, al, None] * x)
    return theta[:, e, None] + g, g


def _model(theta, x, idx):
    """Fitted means (B, K, S) and their Jacobian (B, K*S, p) at parameters theta (B, p); x: centred log C (K, S)."""
    e, al, la, p = idx
    fitted, g = _curve(theta, x, idx)
    arms = np.arange(g.shape[1])
    jac = np.zeros((*g.shape, p))
    # an arm's E, alpha and log A are three different columns: each arm's cells are set once per column
    jac[:, arms, :, e] = 1.0
    jac[:, arms, :, la] = g.transpose(1, 0, 2)
    jac[:, arms, :, al] = (-x * g).transpose(1, 0, 2)
    return fitted, jac.reshape(len(theta), -1, p)


def _start(y, x, idx, form):
    """Starting parameters (B, p): E at a fraction of the lowest loss (the fraction whose log-linear fit leaves the
    smallest residual), alpha and log A from lines of log(y - E) on x."""
    e_idx, al, la, p = idx
    b, k, s = y.shape
    floor = (y.min(axis=2) if form == "per_arm" else y.min(axis=(1, 2))[:, None].repeat(k, 1))
    best, best_cost = None, np.full(b, np.inf)
    for frac in (0.0, 0.5, 0.8, 0.9, 0.95):
        e = floor - (1 - frac) * np.abs(floor)  # frac x floor, below it for a drawn ladder's negative floor too
        z = np.log(y - e[:, :, None])
        xc = x - x.mean(axis=1, keepdims=True)
        slope = (z * xc).sum(2) / (xc ** 2).sum(1)  # per arm (B, K)
        if form == "shared":
            slope = np.repeat(slope.mean(axis=1, keepdims=True), k, axis=1)
        alpha = np.clip(-slope, 1e-3, 5.0)
        log_a = (z + alpha[:, :, None] * x).mean(axis=2)
        theta = np.zeros((b, p))
        theta[:, e_idx], theta[:, al], theta[:, la] = e, alpha, log_a
        cost = ((_curve(theta, x, idx)[0] - y) ** 2).sum(axis=(1, 2))
        better = cost < best_cost
        best = theta if best is None else np.where(better[:, None], theta, best)
        best_cost = np.where(better, cost, best_cost)
    return best


def noise_model(losses, log_c):
    """The seed noise of a batch of ladders' runs (B, K, S, seeds), as the fit and the calibration model it: (sd (B, S)
    of one run's loss at each size, fractions (B, 3) of its variance common to a seed's arms and sizes (its data
    order), shared by a seed's arms at one size (the init they share), and persisting across sizes for one arm and
    seed). The sd: the seed variance pooled over the arms at each size, smoothed by size_sd (3 seeds estimate a
    variance too roughly to weigh each size by its own alone). The fractions:
    the standardised deviations' pooled correlations between cells that share a seed, clipped to a valid
    covariance. One seed: unit sd and no correlation (the residuals then give the scale alone)."""
    b, k, s, n = losses.shape
    if n < 2:
        return np.ones((b, s)), np.zeros((b, 3))
    dev = losses - losses.mean(axis=3, keepdims=True)
    sd = size_sd((dev ** 2).sum(axis=(1, 3)) / (k * (n - 1)), k * (n - 1), log_c.mean(axis=0))
    z = (dev / sd[:, None, :, None]).reshape(b, k * s, n)
    cov = np.einsum("bin,bjn->bij", z, z) / (n - 1)
    same_arm, same_size = _cell_masks(k, s)
    scale = np.einsum("bii->b", cov) / (k * s)

    def pooled(mask):  # 0 where the seeds do not differ at all (no correlation to measure)
        return np.divide(cov[:, mask].mean(axis=1), scale, out=np.zeros(b), where=scale > 0) if mask.any() \
            else np.zeros(b)

    # each part from the raw correlations before any is clipped: subtracting a common part clipped at 0 (its noise
    # made positive) took a quarter off the persistent one
    common = pooled(~same_arm & ~same_size)
    shared = pooled(~same_arm & same_size) - common
    persistent = pooled(same_arm & ~same_size) - common
    fractions = np.clip(np.stack([common, shared, persistent], axis=1), 0, 1)
    return sd, fractions * np.minimum(1, MAX_CORRELATED / np.maximum(fractions.sum(axis=1), 1e-12))[:, None]


def size_sd(variance, nu, log_c):
    """The seed sd (B, S) at each size from the pooled variances (B, S) on nu degrees of freedom each: their logs
    (made unbiased for the log's chi-square bias) shrunk towards a line in log C by empirical Bayes. A log variance
    from nu degrees of freedom has the known sampling variance trigamma(nu / 2); the sizes' spread about the line
    beyond it (tau^2, by moments over S - 2 degrees of freedom) is how far the line misses, and each size keeps
    tau^2 / (tau^2 + trigamma) of its own deviation. A line alone misweighs the ends of a ladder whose sd falls
    evenly by rung (not by log C); each size on its own, from few degrees of freedom, makes the weights noisy
    (both measured: experiments/ladder_calibration.md)."""
    log_var = np.log(np.maximum(variance, 1e-24)) - (digamma(nu / 2) - np.log(nu / 2))
    xs = log_c - log_c.mean()
    slope = (log_var * xs).sum(axis=1, keepdims=True) / (xs ** 2).sum()
    line = log_var.mean(axis=1, keepdims=True) + slope * xs
    sampling = polygamma(1, nu / 2)
    spread = ((log_var - line) ** 2).sum(axis=1, keepdims=True) / (len(xs) - 2) - sampling if len(xs) > 2 else 0.0
    tau2 = np.maximum(spread, 0.0)
    return np.exp((line + tau2 / (tau2 + sampling) * (log_var - line)) / 2)


def _cell_masks(k, s):
    """(same arm, same size) boolean (K*S, K*S) masks over the cells, arm-major."""
    arm, size = np.repeat(np.arange(k), s), np.tile(np.arange(s), k)
    return arm[:, None] == arm[None], size[:, None] == size[None]


def mean_covariance(sd, fractions, k, n_seeds):
    """(B, K*S, K*S) covariance of the cells' means over n_seeds seeds under noise_model's model."""
    s = sd.shape[1]
    same_arm, same_size = _cell_masks(k, s)
    common, shared, persistent = (fractions[:, i, None, None] for i in range(3))
    corr = (common + shared * same_size + persistent * same_arm
            + (1 - common - shared - persistent) * np.eye(k * s))
    cell_sd = np.tile(sd, (1, k))
    return corr * cell_sd[:, :, None] * cell_sd[:, None, :] / n_seeds


def _solve(flat, x, idx, whiten, start, lower, upper):
    """One ladder's generalised least-squares parameters: its means `flat` (K*S,) whitened by `whiten` (the inverse
    Cholesky factor of their covariance), Levenberg-Marquardt from `start` first (fast), redone by the trust-region
    reflective method inside the bounds only where the free optimum leaves them."""
    def residual(t):
        return whiten @ (_curve(t[None], x, idx)[0][0].ravel() - flat)

    def jacobian(t):
        return whiten @ _model(t[None], x, idx)[1][0]

    free = least_squares(residual, start, jac=jacobian, method="lm", xtol=1e-10, ftol=1e-10).x
    return free if np.all((free >= lower) & (free <= upper)) else least_squares(
        residual, start, jac=jacobian, bounds=(lower, upper), xtol=1e-10, ftol=1e-10).x


def _whitened(theta, y, x, idx, whiten):
    """Whitened residuals (B, K*S) and Jacobian (B, K*S, p) at parameters theta (B, p)."""
    fitted, jac = _model(theta, x, idx)
    r = np.einsum("bij,bj->bi", whiten, (fitted - y).reshape(len(y), -1))
    return r, np.einsum("bij,bjp->bip", whiten, jac)


def whitened_fit(est, log_c, form):
    """An estimate's fit in `form` of its ladders at log C (K, S) as generalised least squares sees it: (whitened
    residuals fitted - means (B, K*S), whitened Jacobian (B, K*S, p), the whitening (B, K*S, K*S), the inverse
    Cholesky factor of the means' seed covariance plus the fit's size effect)."""
    f = est["fits"][form]
    b, k, s = est["means"].shape
    cov = est["cov_means"] + f["size_effect_sd"][:, None, None] ** 2 * _cell_masks(k, s)[1]
    whiten = np.linalg.inv(np.linalg.cholesky(cov))
    return (*_whitened(f["theta"], est["means"], log_c - est["centre"], layout(form, k), whiten), whiten)


def size_effect_variance(r, jac, whiten, k, s):
    """The variance (B,) of a size's own deviation from the curve, shared by the arms there, by moments
    (DerSimonian and Laird's estimator, in its meta-regression form): the whitened residual sum of squares Q has
    expectation N - p + tau^2 tr(P Z Z') under the seed noise plus such deviations, P the residual projection of the
    generalised least-squares fit and Z the cells' size indicators, so tau^2 = max(0, (Q - (N - p)) / tr(P Z Z'))."""
    z = np.einsum("bij,jl->bil", whiten, np.tile(np.eye(s), (k, 1)))  # whitened size indicators (B, K*S, S)
    hat_z = jac @ np.linalg.pinv(np.einsum("bnp,bnq->bpq", jac, jac)) @ np.einsum("bnp,bnl->bpl", jac, z)
    trace = ((z - hat_z) * z).sum(axis=(1, 2))
    dof = r.shape[1] - jac.shape[2]
    return np.maximum(((r ** 2).sum(axis=1) - dof) / np.maximum(trace, 1e-300), 0.0)


def bounds(y, form, p, idx):
    """(lower, upper) (B, p) of the parameters of a batch of ladders' means y (B, K, S): a loss floor between 0 and
    the lowest loss it bounds, an exponent between 0 and 5; outside, the curve is no longer a loss (a ladder too noisy
    to identify E would otherwise send it to -infinity with alpha to 0). A simulated ladder's lowest loss may lie at
    or below 0 (normal noise on a steep curve): E then stays below it, down to twice it, so that the bounds are never
    empty (scipy would refuse them, and the calibration with them)."""
    e_idx, al, _, _ = idx
    b, k, _ = y.shape
    floor = y.min(axis=2) if form == "per_arm" else y.min(axis=(1, 2))[:, None].repeat(k, 1)
    lower, upper = np.full((b, p), -np.inf), np.full((b, p), np.inf)
    lower[:, e_idx] = np.minimum(0.0, 2 * floor - 1e-6)
    upper[:, e_idx] = floor - 1e-6 * np.maximum(np.abs(floor), 1e-12)
    lower[:, al], upper[:, al] = 1e-4, 5.0
    return lower, upper


def fit(y, x, form, cov_means, size_effect=True):
    """Generalised least-squares fits of a batch of ladders' means y (B, K, S) at centred log C x (K, S) in one
    form, one scipy.optimize.least_squares per ladder (analytic Jacobian): (theta (B, p), covariance (B, p, p),
    residual degrees of freedom, the size effect's variance (B,)). cov_means (B, K*S, K*S): the means' covariance
    under the seed noise (mean_covariance).
    The size effect: a ladder's sizes differ in shape (depth, width, heads, steps), and each size's loss sits off
    the smooth law by an amount its arms share; seeds do not see it and do not shrink it. With size_effect it is a
    random effect of variance tau^2 (size_effect_variance, by moments from the first fit's residuals) added to cov_means
    for every pair of cells at one size, and the means are fitted again under that covariance: what the arms share
    at a size then moves the curve's level, not the comparison between the arms. The parameters' covariance is
    (J' Sigma^-1 J)^-1 times the whitened residual variance over N - p degrees of freedom (Hartung and Knapp's
    scaling), so a curve that still misses its points widens every interval. A parameter held at its bound keeps
    its column in J: its interval is then the one the data alone would give."""
    idx = layout(form, y.shape[1])
    p = idx[3]
    b, k, s = y.shape
    whiten = np.linalg.inv(np.linalg.cholesky(cov_means))
    lower, upper = bounds(y, form, p, idx)
    flat = y.reshape(b, -1)
    # strictly inside the bounds: scipy refuses a start on or outside them
    inside = upper.copy()
    finite = np.isfinite(upper)
    inside[finite] -= 1e-6 * np.maximum(np.abs(upper[finite]), 1e-12)
    theta = np.clip(np.nan_to_num(_start(y, x, idx, form)), lower, inside)
    for i in range(b):
        theta[i] = _solve(flat[i], x, idx, whiten[i], theta[i], lower[i], upper[i])
    r, jac = _whitened(theta, y, x, idx, whiten)
    tau2 = size_effect_variance(r, jac, whiten, k, s) if size_effect else np.zeros(b)
    # at most 1e6 times the seed variance: beyond it the covariance is singular in floating point (seeds that agree to
    # the last digit, a ladder drawn without noise)
    tau2 = np.minimum(tau2, SIZE_EFFECT_LIMIT * np.einsum("bii->b", cov_means) / (k * s))
    if (again := np.flatnonzero(tau2 > 0)).size:
        same_size = _cell_masks(k, s)[1]
        whiten[again] = np.linalg.inv(np.linalg.cholesky(cov_means[again] + tau2[again, None, None] * same_size))
        for i in again:
            theta[i] = _solve(flat[i], x, idx, whiten[i], theta[i], lower[i], upper[i])
        r[again], jac[again] = _whitened(theta[again], y[again], x, idx, whiten[again])
    dof = k * s - p
    sigma2 = (r ** 2).sum(axis=1) / max(dof, 1)
    cov = np.linalg.pinv(np.einsum("bnp,bnq->bpq", jac, jac)) * sigma2[:, None, None]
    return theta, cov, dof, tau2


def _delta(value, grad, cov):
    """(value, standard error) of a function of the parameters from its gradient (..., p) by the delta method."""
    cov = cov.reshape(len(cov), *[1] * (grad.ndim - 2), *cov.shape[1:])
    return value, np.sqrt(np.maximum(np.einsum("...p,...pq,...q->...", grad, cov, grad), 0.0))


def log_multiplier(theta, cov, form, k, at):
    """(log m, se) of each other arm over the baseline (B, K-1, len(at)) at centred log C `at`."""
    e_idx, al, la, p = layout(form, k)
    b = len(theta)
    grad = np.zeros((b, k - 1, len(at), p))
    if form == "shared":
        alpha = theta[:, 1, None]
        value = (theta[:, la[:1]] - theta[:, la[1:]]) / alpha  # (B, K-1)
        value = np.repeat(value[:, :, None], len(at), axis=2)
        grad[..., la[0]] = 1 / alpha[:, :, None]
        for a in range(1, k):
            grad[:, a - 1, :, la[a]] = -1 / alpha
        grad[..., 1] = -value / alpha[:, :, None]
        return _delta(value, grad, cov)
    if form != "trend":
        raise ValueError("per-arm fits give no multiplier with an interval here")
    a_base, a_arm = theta[:, al[:1], None], theta[:, al[1:], None]
    gap = (theta[:, la[:1], None] - theta[:, la[1:], None] + a_arm * at)
    value = gap / a_base - at
    grad[..., la[0]] = 1 / a_base
    grad[..., al[0]] = -gap / a_base ** 2
    for a in range(1, k):
        grad[:, a - 1, :, la[a]] = -1 / a_base[:, 0]
        grad[:, a - 1, :, al[a]] = at / a_base[:, 0]
    return _delta(value, grad, cov)


def trend_slope(theta, cov, k):
    """(slope of log m on log C, se) of each other arm (B, K-1) from a trend fit: alpha_X / alpha_base - 1."""
    _, al, _, p = layout("trend", k)
    base = theta[:, al[0], None]
    ratio = theta[:, al[1:]] / base
    grad = np.zeros((*ratio.shape, p))
    grad[..., al[0]] = -ratio / base
    for a in range(1, k):
        grad[:, a - 1, al[a]] = 1 / base[:, 0]
    return _delta(ratio - 1, grad, cov)


def interval(value, se, dof, level):
    """The level t interval estimate +- t_{dof} se."""
    q = student.ppf(0.5 + level / 2, dof)
    return value - q * se, value + q * se


def p_value(value, se, dof):
    """Two-sided p of value = 0 (nan where se is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2 * student.sf(np.abs(value / se), dof)


@dataclass(frozen=True)
class Options:
    """What a ladder's estimate depends on besides its runs; the report, the calibration, the bench and the tests
    pass the same. reference: the compute (FLOPs) at which the headline multiplier is read, None for the ladder's
    largest rung (where its gain matters most and the curve is still measured). size_effect: fit's random effect of
    the sizes (False: the estimator before it, the residual variance alone scaling every interval; for the bench's
    comparison, not for reports)."""
    confidence: float = 0.95
    reference: float | None = None
    size_effect: bool = True


def estimate(losses, log_c, options=Options(), forms=tuple(FORMS), report=True):
    """Every number a ladder report prints about its fits, for a batch of ladders at once: losses (B, K, S, seeds),
    the baseline first, at log C (K, S). The seed noise by noise_model (per-size sd, correlations of a seed's
    cells), the means fitted by generalised least squares under it in each form the sizes identify (of `forms`),
    and from the fits:
      "headline": each other arm's log m (B, K-1) at the reference compute, from the trend fit (m may change with
                  compute), or from the shared fit where the ladder has too few sizes for the trend ("form" says);
      "average":  the shared fit's one log m (the ladder average, assuming m constant; None without the shared
                  form in `forms`);
      "slope":    the trend's slope of log m on log C (alpha_X / alpha_base - 1), None without a trend fit;
      "at_sizes": the headline fit's log m (B, K-1, S) at each of the arm's sizes;
    each a dict of value, se and dof (broadcasting against them), "along": (log m, se, dof) of the headline fit at
    any centred log C; with `report` (the report's numbers that no verdict rests on and the calibration skips):
    "per_seed": each seed's own ladder fitted alike, its headline log m (B, seeds, K-1) and the seeds' spread over
    the model's (the sd of one seed's log m the headline's se implies), flagged over PER_SEED_FLAG, and
    "curve_free": stats/curve_free.py's reading (value, low, high (B, 3, K-1, S), status (B, K-1, S)) along the
    headline fit's baseline curve; and "fits": {form: theta, cov, dof, E and alpha (value, se) per arm, A, the
    residuals' sd over the seed noise model's (residual_scale) and the sd of a size's own deviation from the curve
    (size_effect_sd, 0 where the residuals ask for none; fit's size effect) and the degrees of freedom of E's and
    alpha's intervals (level_dof, B)}."""
    b, k, s, n = losses.shape
    centre = float(log_c.mean())
    x = log_c - centre
    ref = math.log(options.reference) if options.reference else float(log_c.max())
    sd, fractions = noise_model(losses, log_c)
    cov_means = mean_covariance(sd, fractions, k, n)
    means = losses.mean(axis=3)
    out = {"centre": centre, "reference": math.exp(ref), "sd": sd, "fractions": fractions, "cov_means": cov_means,
           "means": means, "fits": {}, "slope": None}
    for form in forms:
        if s < MIN_SIZES[form] or k * s <= layout(form, k)[3]:
            continue
        theta, cov, dof, size_var = fit(means, x, form, cov_means, options.size_effect)
        e_idx, al, la, _ = layout(form, k)
        se = np.sqrt(np.maximum(np.einsum("bpp->bp", cov), 0))
        whitened = np.linalg.solve(np.linalg.cholesky(cov_means),
                                   (_curve(theta, x, layout(form, k))[0] - means).reshape(b, -1, 1))[..., 0]
        out["fits"][form] = {"theta": theta, "cov": cov, "dof": dof, "E": (theta[:, e_idx], se[:, e_idx]),
                             "alpha": (theta[:, al], se[:, al]), "A": np.exp(theta[:, la] + theta[:, al] * centre),
                             "residual_scale": np.sqrt((whitened ** 2).sum(axis=1) / max(dof, 1)),
                             "size_effect_sd": np.sqrt(size_var),
                             # E and the exponents are the curve's level and bend, read between the sizes: with a
                             # size effect, from S size means less these 3 (configuration g in stats/ladder_noise.py:
                             # BENCHMARKS.md, "Ladder estimator calibration with the sizes' own deviations")
                             "level_dof": np.where(size_var > 0, max(min(dof, s - 3), 1), dof)}
    # An arm's own seed effect that persists across sizes moves its whole curve: the residuals cannot see it, only
    # the seeds can, through K (seeds - 1) degrees of freedom; where the noise model finds one, the intervals that
    # compare arms take their t quantile from those (the coverage with the fit's N - p and with these: BENCHMARKS.md,
    # "Ladder estimator calibration")
    def arm_dof(form_dof):
        return np.where(fractions[:, 2] > 0, min(form_dof, k * (n - 1)), form_dof)[:, None] if n > 1 else \
            np.full((b, 1), form_dof)

    out["average"] = None
    if "shared" in out["fits"]:
        shared = out["fits"]["shared"]
        value, se = log_multiplier(shared["theta"], shared["cov"], "shared", k, np.array([0.0]))
        out["average"] = {"value": value[..., 0], "se": se[..., 0], "dof": arm_dof(shared["dof"])}
    head = "trend" if "trend" in out["fits"] else "shared"
    f = out["fits"][head]
    value, se = log_multiplier(f["theta"], f["cov"], head, k, np.concatenate([[ref - centre], x[0]]))
    dof = arm_dof(f["dof"])
    out["headline"] = {"form": head, "value": value[..., 0], "se": se[..., 0], "dof": dof}
    out["at_sizes"] = {"form": head, "value": value[..., 1:], "se": se[..., 1:], "dof": dof[..., None]}
    out["along"] = lambda at: (*log_multiplier(f["theta"], f["cov"], head, k, at), dof[..., None])
    if head == "trend":
        value, se = trend_slope(f["theta"], f["cov"], k)
        out["slope"] = {"value": value, "se": se, "dof": dof}
    if report:
        out.update(_readings(out, losses, log_c, head, ref - centre, options))
    return out


def _readings(est, losses, log_c, head, ref, options):
    """The report's numbers that no verdict rests on (estimate's "curve_free", and "per_seed" with several seeds)
    from an estimate `est` of losses (B, K, S, seeds) at log C (K, S): head, the headline's form; ref, the
    reference compute's centred log C."""
    b, k, s, n = losses.shape
    x = log_c - est["centre"]
    means, cov_means, out = est["means"], est["cov_means"], {}
    base = est["fits"][head]
    # one seed measures no noise: the headline fit's residuals scale the model's placeholder then
    scale = base["residual_scale"] ** 2 if n == 1 else np.ones(b)

    def baseline(i):  # the baseline's fitted loss at log C
        return lambda u: base["E"][0][i, 0] + base["A"][i, 0] * np.exp(-base["alpha"][0][i, 0] * u)

    # each size's own deviation (the fit's size effect) is in every mean there, the baseline's read and X's
    sizes = base["size_effect_sd"][:, None, None] ** 2 * _cell_masks(k, s)[1]
    readings = [curve_free(log_c, means[i], cov_means[i] * scale[i] + sizes[i], baseline(i),
                           base["dof"] if n == 1 else k * s * (n - 1), options.confidence) for i in range(b)]
    out["curve_free"] = {"value": np.array([r[0] for r in readings]), "status": np.array([r[1] for r in readings])}
    if n > 1:
        one = losses.transpose(0, 3, 1, 2).reshape(b * n, k, s)
        theta, cov, _, _ = fit(one, x, head, np.repeat(cov_means * n, n, axis=0), options.size_effect)
        value = log_multiplier(theta, cov, head, k, np.array([ref]))[0][..., 0].reshape(b, n, k - 1)
        implied = est["headline"]["se"] * math.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = value.std(axis=1, ddof=1) / implied
        out["per_seed"] = {"value": value, "ratio": ratio, "flag": ratio > PER_SEED_FLAG}
    return out
