"""What is X worth in compute: the arms' losses against training compute fitted together over a ladder of sizes, X's
gain as a compute multiplier over the baseline with an interval whose coverage is measured, read off the baseline's
observed points as well, and whether the gain changes as the models grow.

Input: {arm: {C: {seed: final loss}}}, C the training compute of a ladder point in FLOPs, the same seeds at every
point of every arm, each arm at one chosen lr per size. The means over seeds y[a, s] are fitted by
scipy.optimize.least_squares (analytic Jacobian) with one of three forms of L = E + A C^-alpha:

    shared  (the default)  E and alpha shared by the arms, A per arm: K + 2 parameters for K arms. X's multiplier
                           over the baseline is one number, m = (A_base / A_X)^(1/alpha), the factor of compute the
                           baseline needs to reach X's loss (below 1: X is worse), the same at every C.
    trend                  E shared, A and alpha per arm: 2K + 1 parameters. m changes with C, and the slope of log m
                           on log C is alpha_X / alpha_base - 1 exactly: the trend verdict (> 0: X's gain grows).
    per_arm                E, A and alpha per arm (Hoffmann et al.'s floor per arm): 3 parameters from one arm's
                           own sizes, reported only with MIN_SIZES["per_arm"] sizes or more ("not identified" below).

Intervals: the nonlinear least-squares t interval, estimate +- t_{N-p} se, se from sigma^2 (J'J)^-1 with sigma^2 the
weighted residual sum of squares over its N - p degrees of freedom (N arm-size means, each size weighted by its seeds'
variance, smoothed in log C): the residuals hold the seed noise of the means and the curve's lack of fit alike, so a
curve that misses the points widens every interval, where a bootstrap over seeds (this module's former method) saw
the seed noise only and covered the truth 71-73% of the time with 3 seeds. Functions of the parameters (log m, the
trend's slope) get theirs by the delta method.
The coverage is not assumed: `simulate` draws ladders of the report's own configuration (its sizes, seeds, arms,
the fitted curve as the truth and the measured seed noise of each size), fits them with this same code and counts how
often the interval holds the true log m, and how often the trend verdict fires on a constant multiplier. The report
states both. bench/scaling_coverage.py runs it at scale (BENCHMARKS.md).

The curve-free multiplier needs no form: at each of X's sizes, the baseline's compute that reaches X's mean loss, read
by linear interpolation in log C between the baseline's two observed points around it (none outside the baseline's
observed losses), over X's compute; its interval from the pooled seed variance of the means, by the delta method.
Where it and the fitted multiplier have disjoint intervals, the report flags the fit at that size.

A multiplier at a target compute is only given inside EXTRAPOLATION_LIMIT times the ladder's largest compute on the
ladder's own vocabulary; beyond, or on another vocabulary, only with `extrapolate=True`, and then called an
extrapolation in every sentence and in the figure.
"""
import math

import numpy as np
from scipy import sparse
from scipy.optimize import least_squares
from scipy.stats import t as student

from errors import ConfigError

FORMS = {"shared": "L = E + A_arm C^-alpha, E and alpha shared by the arms, A per arm",
         "trend": "L = E + A_arm C^-alpha_arm, E shared, A and alpha per arm",
         "per_arm": "L = E_arm + A_arm C^-alpha_arm, every parameter per arm"}
# the fewest sizes each form needs: the shared form 3 (E, alpha and the baseline's A from its own points), the trend
# form 4 (2 residual degrees of freedom per pair of arms), the per-arm form 5 (2 per arm)
MIN_SIZES = {"shared": 3, "trend": 4, "per_arm": 5}
EXTRAPOLATION_LIMIT = 10.0  # a target beyond this times the ladder's largest compute is an extrapolation
# GPT-2 124M (configs/gpt2_124m.toml) for 19,073 steps of 2**19 tokens (~10B) on GPT-2's 50,304-token vocabulary:
# model.py's flops_per_token(1024), 855,383,040 FLOPs per token; tests/test_scaling.py checks it against model.py.
GPT2_124M_10B = ("GPT-2 124M at 10B tokens", 855_383_040 * 19_073 * 2 ** 19, 50_304)
CURVE_POINTS = 40  # compute values at which the figure's multiplier band is drawn


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


def _model(theta, x, idx):
    """Fitted means (B, K, S) and their Jacobian (B, K*S, p) at parameters theta (B, p); x: centred log C (K, S)."""
    e, al, la, p = idx
    g = np.exp(theta[:, la, None] - theta[:, al, None] * x)
    jac = np.zeros((*g.shape, p))
    for a in range(g.shape[1]):
        jac[:, a, :, e[a]] += 1.0
        jac[:, a, :, la[a]] += g[:, a]
        jac[:, a, :, al[a]] -= x[a] * g[:, a]
    return theta[:, e, None] + g, jac.reshape(len(theta), -1, p)


def _start(y, x, idx, form):
    """Starting parameters (B, p): E at a fraction of the lowest loss (the fraction whose log-linear fit leaves the
    smallest residual), alpha and log A from lines of log(y - E) on x."""
    e_idx, al, la, p = idx
    b, k, s = y.shape
    floor = (y.min(axis=2) if form == "per_arm" else y.min(axis=(1, 2))[:, None].repeat(k, 1))
    best, best_cost = None, np.full(b, np.inf)
    for frac in (0.0, 0.5, 0.8, 0.9, 0.95):
        e = frac * floor
        z = np.log(y - e[:, :, None])
        xc = x - x.mean(axis=1, keepdims=True)
        slope = (z * xc).sum(2) / (xc ** 2).sum(1)  # per arm (B, K)
        if form == "shared":
            slope = np.repeat(slope.mean(axis=1, keepdims=True), k, axis=1)
        alpha = np.clip(-slope, 1e-3, 5.0)
        log_a = (z + alpha[:, :, None] * x).mean(axis=2)
        theta = np.zeros((b, p))
        theta[:, e_idx], theta[:, al], theta[:, la] = e, alpha, log_a
        cost = ((_model(theta, x, idx)[0] - y) ** 2).sum(axis=(1, 2))
        better = cost < best_cost
        best = theta if best is None else np.where(better[:, None], theta, best)
        best_cost = np.where(better, cost, best_cost)
    return best


def fit(y, x, form, weight=None):
    """Weighted least-squares fits of a batch of ladders y (B, K, S) at centred log C x (K, S), one
    scipy.optimize.least_squares per ladder (analytic Jacobian; Levenberg-Marquardt, or trust-region reflective
    where the bounds bind): (theta (B, p), covariance (B, p, p), residual degrees of freedom). weight (B, S): each
    size's inverse variance of a mean (the seeds' noise differs between sizes); the residual variance then scales
    it, so lack of fit still widens every interval. A parameter held at its bound keeps its column in J: its
    interval is then the one the data alone would give."""
    idx = layout(form, y.shape[1])
    e_idx, al, _, p = idx
    b, k, s = y.shape
    root_w = np.sqrt(np.ones((b, s)) if weight is None else weight / weight.mean(axis=1, keepdims=True))
    # a loss floor between 0 and the lowest loss it bounds, an exponent between 0 and 5: outside, the curve is no
    # longer a loss (a ladder too noisy to identify E would otherwise send it to -infinity with alpha to 0)
    floor = y.min(axis=2) if form == "per_arm" else y.min(axis=(1, 2))[:, None].repeat(k, 1)
    lower, upper = np.full((b, p), -np.inf), np.full((b, p), np.inf)
    lower[:, e_idx], upper[:, e_idx] = 0.0, floor * (1 - 1e-6)
    lower[:, al], upper[:, al] = 1e-4, 5.0
    theta = np.clip(_start(y, x, idx, form), lower, np.where(np.isfinite(upper), upper * (1 - 1e-6), upper))
    for i in range(b):
        w = np.broadcast_to(root_w[i], (k, s)).ravel()

        def residual(t, i=i):
            return (_model(t[None], x, idx)[0][0] - y[i]).ravel() * w

        def jacobian(t):
            return _model(t[None], x, idx)[1][0] * w[:, None]

        # Levenberg-Marquardt first (fast); only a fit that leaves the bounds is redone inside them
        free = least_squares(residual, theta[i], jac=jacobian, method="lm", xtol=1e-10, ftol=1e-10).x
        theta[i] = free if np.all((free >= lower[i]) & (free <= upper[i])) else least_squares(
            residual, theta[i], jac=jacobian, bounds=(lower[i], upper[i]), xtol=1e-10, ftol=1e-10).x
    fitted, jac = _model(theta, x, idx)
    w = np.broadcast_to(root_w[:, None, :], (b, k, s)).reshape(b, -1)
    jac = jac * w[:, :, None]
    dof = k * s - p
    sigma2 = (((fitted - y).reshape(b, -1) * w) ** 2).sum(axis=1) / max(dof, 1)
    cov = np.linalg.pinv(np.einsum("bnp,bnq->bpq", jac, jac)) * sigma2[:, None, None]
    return theta, cov, dof


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


def curve_free(log_c, means, var_mean, dof, level):
    """Each other arm's curve-free log m at each of its sizes: (value, low, high) arrays (K-1, S), nan where its mean
    loss lies outside the baseline's observed losses. var_mean: the pooled variance of one mean; dof its degrees."""
    xb, yb = log_c[0], means[0]
    q = student.ppf(0.5 + level / 2, dof) if dof > 0 else np.nan
    out = np.full((3, len(means) - 1, len(xb)), np.nan)
    for a in range(1, len(means)):
        for s, target in enumerate(means[a]):
            cross = [j for j in range(len(xb) - 1) if (yb[j] - target) * (yb[j + 1] - target) <= 0
                     and yb[j] != yb[j + 1]]
            if not cross:
                continue
            j = cross[0]
            dx, dy = xb[j + 1] - xb[j], yb[j + 1] - yb[j]
            frac = (target - yb[j]) / dy
            value = xb[j] + frac * dx - log_c[a, s]
            se = math.sqrt(var_mean * (dx / dy) ** 2 * (1 + (frac - 1) ** 2 + frac ** 2))
            out[:, a - 1, s] = value, value - q * se, value + q * se
    return out


def size_weights(losses, log_c):
    """(B, S) inverse variance of a mean at each size from the runs' losses (B, K, S, seeds): the seed variance pooled
    over the arms at each size, smoothed as a line of its log in log C (a few seeds per size estimate a variance too
    roughly to weigh by it, and a noisy weight costs the interval its coverage); ones with a single seed."""
    if losses.shape[-1] < 2:
        return np.ones(losses.shape[:1] + losses.shape[2:3])
    log_var = np.log(np.maximum(losses.var(axis=-1, ddof=1).mean(axis=1), 1e-12))  # (B, S)
    xs = log_c.mean(axis=0) - log_c.mean()
    slope = (log_var * (xs - xs.mean())).sum(axis=1, keepdims=True) / ((xs - xs.mean()) ** 2).sum()
    return np.exp(-(log_var.mean(axis=1, keepdims=True) + slope * (xs - xs.mean())))


def _interval(value, se, dof, level):
    q = student.ppf(0.5 + level / 2, dof)
    return value - q * se, value + q * se


def simulate(truth, form, log_c, noise_sd, n_seeds, n_sims, level, rng):
    """Ladders drawn around `truth` (the shared form's parameters, p,) at log_c (K, S): each run's loss the curve
    plus normal noise of its size's sd (noise_sd, S), averaged over n_seeds; every ladder fitted by `fit` as the
    report fits it. Returns {"coverage": share of the other arms' level-intervals of log m that hold the truth,
    "false_alarm": share of trend verdicts ("grows"/"shrinks") on these constant multipliers, "n": n_sims}."""
    k = log_c.shape[0]
    ref = log_c.mean()
    x = log_c - ref
    truth = np.asarray(truth, float)[None]
    rng = np.random.default_rng(rng)
    mean = _model(truth, x, layout("shared", k))[0][0]
    noise = rng.normal(size=(n_sims, k, x.shape[1], n_seeds)) * np.asarray(noise_sd)[None, None, :, None]
    y = mean[None] + noise.mean(axis=3)
    weight = size_weights(noise, log_c)
    true_log_m = log_multiplier(truth, np.zeros((1, len(truth[0]), len(truth[0]))), "shared", k, x[0, :1])[0][0, :, 0]
    theta, cov, dof = fit(y, x, "shared", weight)
    value, se = log_multiplier(theta, cov, "shared", k, x[0, :1])
    low, high = _interval(value[..., 0], se[..., 0], dof, level)
    covered = (low <= true_log_m) & (true_log_m <= high)
    out = {"coverage": float(covered.mean()), "n": n_sims, "arms": k - 1, "level": level}
    if x.shape[1] >= MIN_SIZES["trend"]:
        theta, cov, dof = fit(y, x, "trend", weight)
        slope, se = trend_slope(theta, cov, k)
        low, high = _interval(slope, se, dof, level)
        out["false_alarm"] = float(((low > 0) | (high < 0)).mean())
    return out


def _value(x):
    """A float for sweep.json: None for nan and inf (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _p(value, se, dof):
    return None if not se > 0 else float(2 * student.sf(abs(value / se), dof))


def target_point(target, top, vocab, extrapolate):
    """{"name", "compute", "extrapolation"} of a target (name, C, vocabulary or None), or None; a target the ladder
    cannot support (beyond EXTRAPOLATION_LIMIT x its largest compute `top`, or on another vocabulary) is a
    ConfigError unless extrapolate."""
    if target is None:
        return None
    beyond = target[1] > EXTRAPOLATION_LIMIT * top
    other_vocab = target[2] is not None and vocab is not None and target[2] != vocab
    if (beyond or other_vocab) and not extrapolate:
        why = (f"{target[1] / top:.3g}x the ladder's largest compute (over {EXTRAPOLATION_LIMIT:g}x)" if beyond
               else f"vocabulary {target[2]}, the ladder's {vocab}")
        raise ConfigError(f"target {target[0]} lies at {why}: an extrapolation the ladder cannot support; pass "
                          "--extrapolate to print it marked as one, or choose a target inside the ladder")
    return {"name": target[0], "compute": float(target[1]), "extrapolation": bool(beyond or other_vocab)}


def fit_forms(means, x, arms, confidence):
    """({form: its fit for sweep.json, or "not identified"}, {form: (theta, cov, dof)}) of every form the ladder's
    sizes identify."""
    k, n_sizes = means.shape
    forms, fits = {}, {}
    for form in FORMS:
        if n_sizes < MIN_SIZES[form] or k * n_sizes <= layout(form, k)[3]:
            forms[form] = {"identified": False, "text": f"{FORMS[form]}: not identified by "
                           f"{n_sizes} sizes (needs {MIN_SIZES[form]})"}
            continue
        theta, cov, dof = fit(means[None], x, form)
        fits[form] = (theta, cov, dof)
        e_idx, al, la, _ = layout(form, k)
        sd = np.sqrt(np.diag(cov[0]))
        rss = float(((_model(theta, x, layout(form, k))[0][0] - means) ** 2).sum())
        forms[form] = {"identified": True, "text": FORMS[form], "dof": dof, "rss": rss, "params": {
            a: {name: {"value": float(theta[0, i]), "ci": [float(v) for v in _interval(theta[0, i], sd[i], dof,
                                                                                     confidence)]}
                for name, i in (("E", e_idx[j]), ("alpha", al[j]))}
            for j, a in enumerate(arms)}}
    return forms, fits


def at_sizes(computes, free, fitted, lo, hi, ratio):
    """One arm's rows per size: the curve-free multiplier (value, low, high: free (3, S)) and whether it disagrees
    with the fitted one's interval [lo, hi] (log m), and the wall-clock multiplier where a throughput ratio {C:
    ratio} is known."""
    rows = []
    for s, c in enumerate(computes):
        fv, flo, fhi = free[:, s]
        row = {"compute": c, "curve_free": _value(np.exp(fv)), "curve_free_ci": [_value(np.exp(flo)),
                                                                                 _value(np.exp(fhi))]}
        row["disagree"] = bool(math.isfinite(fv) and (fhi < lo or flo > hi))
        r = ratio.get(c)
        row["throughput_ratio"] = r
        row["wall_clock"] = None if r is None else fitted["multiplier"] * r
        row["wall_clock_ci"] = None if r is None else [v * r for v in fitted["ci"]]
        rows.append(row)
    return rows


def add_trend(entry, value, se, slope, slope_se, dof, confidence, n_sizes, curve_c, target):
    """The trend fit's multiplier into one arm's entry: at each size (its rows), at the target, along the curve,
    and the slope of log m on log C with its p. value, se: the trend's log m at the sizes, the target (if any) and
    curve_c, in that order."""
    q = student.ppf(0.5 + confidence / 2, dof)

    def pack(i):
        return {"multiplier": _value(np.exp(value[i])), "ci": [_value(np.exp(value[i] - q * se[i])),
                                                               _value(np.exp(value[i] + q * se[i]))]}

    for s, row in enumerate(entry["at_sizes"]):
        row["trend_fit"] = pack(s)
    at_target = 1 if target else 0
    if target:
        entry["target"] = {"compute": target["compute"], **pack(n_sizes)}
    entry["curve"] = [{"compute": float(c), **pack(n_sizes + at_target + i)} for i, c in enumerate(curve_c)]
    low, high = _interval(slope, slope_se, dof, confidence)
    entry["trend"] = {"slope": slope, "ci": [low, high], "p": _p(slope, slope_se, dof)}


def fit_ladder(ladder, baseline, target=None, extrapolate=False, vocab=None, throughput=None, confidence=0.95,
               n_sims=400, rng=0):
    """Fits, multipliers (fitted and curve-free), trend and the interval's measured coverage as plain numbers for
    sweep.json, with "sentences". ladder: {arm: {C: {seed: loss}}}; target: (name, C, vocabulary or None) or None;
    vocab: the ladder's vocabulary; throughput: {"ratio": {arm: {C: X's compute per second over the baseline's}},
    "source": text}; n_sims, rng: the coverage simulation's ladders and seed. Each verdict carries its p ("p")."""
    arms, log_c, losses, seeds = check_ladder(ladder, baseline)
    computes = [sorted(ladder[a]) for a in arms]  # the given values: a throughput ratio is looked up by them
    k, n_sizes, n = losses.shape
    top = float(np.exp(log_c.max()))
    target = target_point(target, top, vocab, extrapolate)
    means = losses.mean(axis=2)
    ref = log_c.mean()
    x = log_c - ref
    var_mean = float(losses.var(axis=2, ddof=1).mean() / n) if n > 1 else math.nan
    result = {"form": "shared", "form_text": FORMS["shared"], "forms": {}, "baseline": baseline, "seeds": seeds,
              "confidence": confidence, "sizes": n_sizes, "target": target, "arms": {}, "multipliers": {},
              "interval": "nonlinear least-squares t interval on the means (residual variance: seed noise and lack "
                          "of fit), delta method for functions of the parameters",
              "throughput_source": (throughput or {}).get("source")}
    result["forms"], fits = fit_forms(means, x, arms, confidence)
    seed_sd = losses.std(axis=2, ddof=1).mean(axis=0) if n > 1 else np.zeros(n_sizes)
    theta, cov, dof = fits["shared"]
    result["calibration"] = simulate(theta[0], "shared", log_c, seed_sd, n, n_sims, confidence, rng)
    result["calibration"]["noise_sd"] = [float(v) for v in seed_sd]
    at_target = [math.log(target["compute"]) - ref] if target else []
    curve_c = np.geomspace(float(np.exp(log_c.min())), max(top, target["compute"] if target else top), CURVE_POINTS)
    value, se = log_multiplier(theta, cov, "shared", k, np.array([0.0]))
    free = curve_free(log_c, means, var_mean, k * n_sizes * (n - 1), confidence)
    trend = fits.get("trend")
    if trend:
        t_value, t_se = log_multiplier(*trend[:2], "trend", k, np.concatenate([x[0], at_target, np.log(curve_c) - ref]))
        slope, slope_se = trend_slope(*trend[:2], k)
    for j, a in enumerate(arms):
        result["arms"][a] = {"points": [{"compute": float(c), "mean": float(row.mean()),
                                         "low": float(row.min()), "high": float(row.max())}
                                        for c, row in zip(computes[j], losses[j])],
                             "E": float(theta[0, 0]), "alpha": float(theta[0, 1]),
                             "A": float(np.exp(theta[0, 2 + j] + theta[0, 1] * ref))}
        if j == 0:
            continue
        lv, lse = float(value[0, j - 1, 0]), float(se[0, j - 1, 0])
        lo, hi = _interval(lv, lse, dof, confidence)
        fitted = {"multiplier": math.exp(lv), "ci": [math.exp(lo), math.exp(hi)], "p": _p(lv, lse, dof)}
        ratio = ((throughput or {}).get("ratio") or {}).get(a) or {}
        entry = {"fitted": fitted, "at_sizes": at_sizes(computes[j], free[:, j - 1], fitted, lo, hi, ratio),
                 "target": None, "curve": [], "trend": None}
        if trend:
            add_trend(entry, t_value[0, j - 1], t_se[0, j - 1], float(slope[0, j - 1]), float(slope_se[0, j - 1]),
                      trend[2], confidence, n_sizes, curve_c, target)
        result["multipliers"][a] = entry
    return result
