"""What is X worth in compute: each arm's loss against training compute fitted over a ladder of model sizes, the
gain of X as a compute multiplier over the baseline, and whether that gain grows as the model grows.

Input: {arm: {C: {seed: final loss}}}, C the training compute of a ladder point in FLOPs (model.py's
flops_per_token times the tokens trained), the same seeds at every point of every arm; each arm at its best lr
(analysis/lr_grid.py). Per arm, the mean loss over seeds at each C is fitted with

    L(C) = E + A * C^(-alpha)      (Kaplan et al. 2020's power law in C, plus Hoffmann et al. 2022's floor E)

by scipy.optimize.least_squares. Three parameters need at least 4 distinct C to leave a residual; with fewer,
E is not identified and the fit is a pure power law L = A * C^(-alpha), a straight line in log-log, or, when an
irreducible loss E is given, log(L - E) against log C. The form used is stated in every output.

The compute multiplier of X at compute C is m(C) = C_base(L_X(C)) / C, with the baseline's fitted curve inverted,
C_base(L) = ((L - E_base) / A_base)^(-1/alpha_base): how many times C the baseline needs to reach the loss X reaches
at C. m = 1 is no gain; m is infinite where X's fitted loss lies below the baseline's floor E_base. It is
evaluated at every C of X's ladder and at a named target (by default GPT-2 124M at 10B tokens, an extrapolation).
The wall-clock multiplier is m times X's throughput over the baseline's, a ratio given with its source. The trend
is the slope of log m against log C over the ladder: > 0, X's gain grows with compute.

Intervals: percentile bootstrap over seeds (scipy.stats.bootstrap): one resample of seed indices serves every arm
and every size, since the arms share seeds and the seed fixes the data order (paired), then every fit and multiplier
is redone. With few seeds the bootstrap has few distinct resamples (3 seeds: 10) and its intervals are too narrow
(percentile intervals cover at about sqrt((n-1)/n) of the standard error); read them with the seed count.
"""
import math
import warnings

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import bootstrap

from errors import ConfigError

SIZES_FOR_E = 4  # fewer distinct C cannot identify E beside A and alpha
# GPT-2 124M (configs/gpt2_124m.toml) for 19,073 steps of 2**19 tokens (~10B): model.py's flops_per_token(1024),
# 6N + 12 L d T = 855,383,040 FLOPs per token; tests/test_scaling.py checks it against model.py.
GPT2_124M_10B = ("GPT-2 124M at 10B tokens", 855_383_040 * 19_073 * 2 ** 19)
CURVE_POINTS = 40  # compute values at which the figure's multiplier band is drawn
FORMS = {"saturating": "L = E + A C^-alpha (scipy.optimize.least_squares on the mean loss over seeds per size)",
         "power_law": "L = A C^-alpha, a line in log-log (fewer than 4 sizes cannot identify E, so the fit has no "
                      "floor; extrapolated multipliers rest on that assumption)",
         "fixed_E": "L = E + A C^-alpha with E given, a line of log(L - E) in log C"}


def check_ladder(ladder, baseline):
    """{arm: (sorted compute array, losses array (sizes, seeds))} and the shared seeds; bad input is a ConfigError."""
    if baseline not in ladder:
        raise ConfigError(f"baseline {baseline!r} has no ladder; name one of {', '.join(ladder)}")
    seeds = sorted(next(iter(ladder[baseline].values())), key=str)
    arrays = {}
    for arm, points in ladder.items():
        computes = sorted(points)
        if bad := [c for c in computes if not c > 0]:
            raise ConfigError(f"{arm}: compute {bad[0]} is not positive; give each ladder point's training FLOPs")
        if len(computes) < 2:
            raise ConfigError(f"{arm}: a ladder of {len(computes)} size fits no curve; train at least 2 sizes "
                              f"({SIZES_FOR_E} to fit the irreducible loss E)")
        for c in computes:
            if sorted(points[c], key=str) != seeds:
                raise ConfigError(f"{arm} at C={c:.3g}: seeds {sorted(points[c], key=str)}, {baseline}'s first point "
                                  f"{seeds}; the bootstrap pairs seeds, so every point needs the same seeds")
            if not all(math.isfinite(points[c][s]) for s in seeds):
                raise ConfigError(f"{arm} at C={c:.3g}: a non-finite loss (a diverged run); rerun it at a lower lr")
        arrays[arm] = (np.array(computes, float), np.array([[points[c][s] for s in seeds] for c in computes]))
    return arrays, seeds


def fit_line(compute, loss, irreducible=0.0):
    """(E, log A, alpha) of log(L - E) = log A - alpha log C by least squares, vectorised over the rows of `loss`
    (one ladder per row); a row with L <= E gets nan."""
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.log(np.atleast_2d(loss) - irreducible)
    slope, intercept = np.polyfit(np.log(compute), np.nan_to_num(y, nan=0.0).T, 1)
    bad = ~np.isfinite(y).all(axis=1)
    slope[bad], intercept[bad] = np.nan, np.nan
    return np.full(len(y), irreducible, float), intercept, -slope


def fit_saturating(compute, loss, start=None):
    """(E, log A, alpha) of L = E + A C^-alpha for each row of `loss`, by scipy.optimize.least_squares in the
    residuals of L. C is divided by its geometric mean first: at C ~ 1e18 log A and alpha are nearly collinear and
    A itself overflows. E is kept in [0, min L); without `start`, three starts (E at 0, 0.5, 0.9 of min L) guard
    against a local minimum, and the lowest cost wins."""
    log_ref = np.log(compute).mean()
    x = np.log(compute) - log_ref
    out = np.full((len(np.atleast_2d(loss)), 3), np.nan)
    for row, y in enumerate(np.atleast_2d(loss)):
        upper = [y.min() * (1 - 1e-9), np.inf, 10.0]
        if start is None:
            starts = []
            for frac in (0.0, 0.5, 0.9):
                e, log_a, alpha = (v[0] for v in fit_line(compute, y, frac * y.min()))
                starts.append([e, log_a - alpha * log_ref, alpha])
        else:
            starts = [[start[0], start[1] - start[2] * log_ref, start[2]]]
        best = None
        for s in starts:
            s = np.clip(np.nan_to_num(s, nan=0.1), [0, -np.inf, 1e-6], [upper[0] * (1 - 1e-6), np.inf, 9.9])
            fit = least_squares(lambda p: p[0] + np.exp(p[1] - p[2] * x) - y, s, bounds=([0, -np.inf, 0], upper))
            if best is None or fit.cost < best.cost:
                best = fit
        out[row] = best.x[0], best.x[1] + best.x[2] * log_ref, best.x[2]
    return out[:, 0], out[:, 1], out[:, 2]


def loss_at(params, compute):
    e, log_a, alpha = params
    return e[:, None] + np.exp(log_a[:, None] - alpha[:, None] * np.log(compute))


def log_compute_for(params, loss):
    """log C at which the curve reaches `loss` (rows of params against rows of loss); +inf below its floor E."""
    e, log_a, alpha = (p[:, None] for p in params)
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.log(loss - e)
    return np.where(loss > e, (log_a - gap) / alpha, np.inf)


def multiplier_from_fits(base, other, compute):
    """log m at each compute (rows: resamples): log C_base(L_other(C)) - log C."""
    return log_compute_for(base, loss_at(other, compute)) - np.log(compute)


def _fit(form, compute, mean_loss, irreducible, start=None):
    if form == "saturating":
        return fit_saturating(compute, mean_loss, start)
    return fit_line(compute, mean_loss, irreducible or 0.0)


def _slope(compute, log_m):
    """Least-squares slope of log m on log C per row; nan where a multiplier is infinite."""
    finite = np.isfinite(log_m).all(axis=1)
    slope = np.polyfit(np.log(compute), np.where(np.isfinite(log_m), log_m, 0.0).T, 1)[0]
    return np.where(finite, slope, np.nan)


def _value(x):
    """A float for sweep.json: None for nan and inf (JSON has neither); the sentences say which."""
    x = float(x)
    return x if math.isfinite(x) else None


def fit_ladder(ladder, baseline, target=GPT2_124M_10B, irreducible=None, throughput=None, n_resamples=2000,
               confidence=0.95, rng=0):
    """Fits, multipliers, trend and their bootstrap intervals as plain numbers for sweep.json, with "sentences".
    ladder: {arm: {C: {seed: loss}}}; target: (name, C) or None; irreducible: a known E (forces the fixed_E form);
    throughput: {"ratio": {arm: X's throughput over the baseline's, in compute per second as C counts it (tokens/s
    where the arms' FLOPs per token match), one number or {C: number} at X's ladder C}, "source": text}."""
    arrays, seeds = check_ladder(ladder, baseline)
    sizes = min(len(c) for c, _ in arrays.values())
    form = "fixed_E" if irreducible is not None else "saturating" if sizes >= SIZES_FOR_E else "power_law"
    if irreducible is not None and any(loss.min() <= irreducible for _, loss in arrays.values()):
        raise ConfigError(f"irreducible loss E={irreducible} is not below every ladder loss; give a smaller E")
    arms = list(arrays)
    others = [a for a in arms if a != baseline]
    top = max(c.max() for c, _ in arrays.values())
    curve = np.geomspace(min(c.min() for c, _ in arrays.values()), max(top, target[1] if target else top),
                         CURVE_POINTS)
    # each other arm's multiplier is evaluated at its ladder's C, the target, then the figure's curve
    evaluate_at = {a: np.concatenate([arrays[a][0], [target[1]] if target else [], curve]) for a in others}
    full_fit = {a: _fit(form, arrays[a][0], arrays[a][1].mean(axis=1), irreducible) for a in arms}

    def estimates(idx, axis=-1):
        """Every reported number for seed-index resamples idx (rows), stacked as (quantities, rows): per arm
        E, log A, alpha; per other arm log m at evaluate_at, then the slope of log m over its ladder."""
        idx = np.atleast_2d(idx).astype(int)
        fits = {a: _fit(form, arrays[a][0], arrays[a][1][:, idx].mean(axis=-1).T, irreducible,
                        start=[p[0] for p in full_fit[a]]) for a in arms}
        rows = [np.stack(fits[a]) for a in arms]
        for a in others:
            log_m = multiplier_from_fits(fits[baseline], fits[a], evaluate_at[a])
            rows += [log_m.T, _slope(arrays[a][0], log_m[:, :len(arrays[a][0])])[None]]
        return np.concatenate(rows)

    estimate = estimates(np.arange(len(seeds)))[:, 0]
    low = high = np.full_like(estimate, np.nan)
    if len(seeds) > 1:
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # infinite multipliers make the standard error nan
            ci = bootstrap((np.arange(len(seeds)),), estimates, n_resamples=n_resamples, confidence_level=confidence,
                           method="percentile", vectorized=True, rng=rng).confidence_interval
        low, high = ci.low, ci.high
    triples = iter(np.column_stack([estimate, low, high]))  # (value, low, high) in estimates' order
    take = lambda n: [next(triples) for _ in range(n)]

    result = {"form": form, "form_text": FORMS[form], "baseline": baseline, "seeds": seeds, "confidence": confidence,
              "n_resamples": n_resamples, "interval": "percentile bootstrap over seeds, paired across arms and sizes",
              "target": None if target is None else {"name": target[0], "compute": target[1]},
              "throughput_source": (throughput or {}).get("source"), "arms": {}, "multipliers": {}}
    for a in arms:
        e, log_a, alpha = take(3)
        compute, loss = arrays[a]
        result["arms"][a] = {
            "E": _value(e[0]), "E_ci": [_value(v) for v in e[1:]], "A": _value(np.exp(log_a[0])),
            "A_ci": [_value(np.exp(v)) for v in log_a[1:]], "alpha": _value(alpha[0]),
            "alpha_ci": [_value(v) for v in alpha[1:]],
            "points": [{"compute": float(c), "mean": float(row.mean()), "low": float(row.min()),
                        "high": float(row.max())} for c, row in zip(compute, loss)]}
    entry = lambda c, m: {"compute": float(c), "multiplier": _value(m[0]), "ci": [_value(m[1]), _value(m[2])]}
    for a in others:
        compute = arrays[a][0]
        multipliers = np.exp(take(len(evaluate_at[a])))
        ratio = ((throughput or {}).get("ratio") or {}).get(a)
        at_sizes = [entry(c, m) for c, m in zip(compute, multipliers)]
        for row in at_sizes:
            r = ratio.get(row["compute"]) if isinstance(ratio, dict) else ratio
            row["throughput_ratio"] = r
            row["wall_clock"] = None if r is None or row["multiplier"] is None else row["multiplier"] * r
            row["wall_clock_ci"] = None if r is None else [None if v is None else v * r for v in row["ci"]]
        (slope, s_lo, s_hi), = take(1)
        verdict = ("not defined: a multiplier is infinite" if not math.isfinite(slope) else
                   "grows" if s_lo > 0 else "shrinks" if s_hi < 0 else "no trend resolved")
        result["multipliers"][a] = {
            "at_sizes": at_sizes, "target": entry(target[1], multipliers[len(compute)]) if target else None,
            "curve": [entry(c, m) for c, m in zip(curve, multipliers[len(compute) + bool(target):])],
            "trend": {"slope": _value(slope), "ci": [_value(s_lo), _value(s_hi)], "verdict": verdict}}
    result["sentences"] = sentences(result)
    return result


def _times(m):
    return "infinitely many times (below the baseline's floor E)" if m is None else f"{m:.3g}x"


def _ci(pair, level, fmt="{:.3g}"):
    """"(95% interval [lo, hi])", "-" for an end that is not a number (an infinite multiplier), or "(no interval)"."""
    if pair[0] is None and pair[1] is None:
        return "(no interval)"
    return f"({level} interval [" + ", ".join("-" if v is None else fmt.format(v) for v in pair) + "])"


def sentences(result):
    """Lines a paper can quote: the form, each fit, each multiplier at the sizes and the target, its trend."""
    level, n, base = f"{result['confidence']:.0%}", len(result["seeds"]), result["baseline"]
    spread = (f"{level} intervals: {result['interval']}, {n} seeds, {result['n_resamples']} resamples" if n > 1 else
              "no intervals: one seed, nothing to resample")
    out = [f"Fit: {result['form_text']}; {spread}."]
    for a, f in result["arms"].items():
        e = f"{f['E']:.4g} {_ci(f['E_ci'], level, '{:.4g}')}" if result["form"] == "saturating" else \
            f"{f['E']:.4g} (fixed)"
        out.append(f"{a}: E = {e}, A = {f['A']:.4g}, alpha = {f['alpha']:.4g} {_ci(f['alpha_ci'], level, '{:.4g}')} "
                   "(C in FLOPs).")
    for a, m in result["multipliers"].items():
        for row in m["at_sizes"]:
            text = (f"At {row['compute']:.3g} FLOPs {a} reaches a loss that {base} needs {_times(row['multiplier'])} "
                    f"the compute for {_ci(row['ci'], level)}")
            if row["wall_clock"] is not None:
                text += (f"; with {a}'s throughput {row['throughput_ratio']:.3g}x {base}'s (measured: below), "
                         f"{row['wall_clock']:.3g}x in wall-clock {_ci(row['wall_clock_ci'], level)}")
            out.append(text + ".")
        if m["target"]:
            t, top = m["target"], m["at_sizes"][-1]["compute"]
            out.append(f"Extrapolated to {result['target']['name']} ({t['compute']:.3g} FLOPs, "
                       f"{t['compute'] / top:.3g}x the ladder's largest): {_times(t['multiplier'])} "
                       f"{_ci(t['ci'], level)}.")
        trend = m["trend"]
        slope = "not defined" if trend["slope"] is None else \
            f"{trend['slope']:+.3g} {_ci(trend['ci'], level, '{:+.3g}')}"
        say = {"grows": "grows with compute", "shrinks": "shrinks with compute",
               "no trend resolved": "has no trend these seeds resolve"}.get(trend["verdict"], trend["verdict"])
        out.append(f"{a}'s multiplier over {base} {say}: slope of log m on log C over the ladder {slope}.")
    if any(row["wall_clock"] is not None for m in result["multipliers"].values() for row in m["at_sizes"]):
        out.append(f"Throughput ratios measured by: {result['throughput_source'] or 'source not given'}.")
    return out
