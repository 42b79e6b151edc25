"""A ladder's fits as the report prints them: estimate (stats/scaling.py) on the ladder's runs turned into plain numbers
for sweep.json, with the calibration of the same estimator and options on the configuration the ladder implies.

Input: {arm: {C: {seed: final loss}}}, C the training compute of a ladder point in FLOPs, the same seeds at every
point of every arm, each arm at one chosen lr per size. Nothing here estimates: every multiplier, trend, E and alpha
is estimate()'s (the curve-free reading too), every interval scaling.interval's; this module picks the words ("not
identified" where an interval would leave the parameter space) and the calibration's truth.

The calibration (stats/ladder_noise.py) states a property of the configuration, not of the ladder's luck: ladders
drawn from the trend fit (the headline's coverage) and from the shared fit (the trend's false alarms) with the noise
model's per-size sd and seed correlations, a fixed simulation seed (common random numbers: two ladders of one truth
differ only through what they estimate), its Monte-Carlo interval over the ladders and its assumptions in words.
"""
import math
from dataclasses import dataclass

import numpy as np

from errors import ConfigError
from stats import scaling
from stats.ladder_unseen import report_calibration

EXTRAPOLATION_LIMIT = 10.0  # a target beyond this times the ladder's largest compute is an extrapolation
CURVE_POINTS = 40  # compute values at which the figure's multiplier band is drawn
# the largest |log m| a fit may give and still be read: beyond, the exponent is so close to 0 that the arms' gap in
# loss maps to a multiplier no ladder measures (e^50 ~ 5e21), and the calibration's truth would have none
LOG_MULTIPLIER_LIMIT = 50.0


@dataclass(frozen=True)
class NotFitted:
    """A ladder the power law cannot describe, with why in one sentence: the report prints its runs and pairs
    and this in place of the fit (never a traceback, never a multiplier read off a curve that does not fall)."""
    reason: str


def not_falling(arms, log_c, losses):
    """NotFitted where an arm's mean loss does not fall with compute (the slope of its seeds' mean on log C is not
    negative: a flat ladder, one whose losses rise, a smoke test's few steps), else None. L = E + A C^-alpha with
    A, alpha > 0 only falls: fitted to such points it pins alpha at its bound and reads any multiplier at all."""
    means = losses.mean(axis=2)
    x = log_c - log_c.mean(axis=1, keepdims=True)
    slope = (means * x).sum(axis=1) / (x ** 2).sum(axis=1)
    if (bad := np.flatnonzero(~(slope < 0))).size:
        a = bad[0]
        points = ", ".join(f"{v:.4g}" for v in means[a])
        return NotFitted(f"{arms[a]}'s mean loss does not fall with compute ({points}"
                         f" from {math.exp(log_c[a].min()):.3g} to {math.exp(log_c[a].max()):.3g} FLOPs), and "
                         "L = E + A C^-alpha only falls, so no curve and no multiplier can be read from this ladder; "
                         "train the sizes long enough that the loss falls with size")
    return None


def unreadable(est, arms, log_c):
    """NotFitted where the fit's multipliers cannot be read (not finite, or |log m| over LOG_MULTIPLIER_LIMIT:
    the exponent so near 0 that the gap between arms maps to no measurable compute), else None."""
    for key in ("headline", "average"):
        if est[key] is None:
            continue
        value, se = est[key]["value"][0], est[key]["se"][0]
        if (bad := np.flatnonzero(~(np.isfinite(value) & np.isfinite(se) & (np.abs(value) < LOG_MULTIPLIER_LIMIT))
                                  )).size:
            alpha = est["fits"][est["headline"]["form"]]["alpha"][0][0]
            exponents = ", ".join(f"{v:.3g}" for v in alpha)
            return NotFitted(f"the {key} fit puts {arms[1 + bad[0]]}'s log multiplier at {value[bad[0]]:.3g} "
                             f"(exponents {exponents}): the losses fall too little over the ladder's "
                             f"{math.exp(np.ptp(log_c)):.3g}x of compute for a multiplier to be read; train the "
                             "sizes longer or over a wider range of compute")
    return None


def _value(x):
    """A float for sweep.json: None for nan and inf (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _multiplier(value, se, dof, level):
    """{"multiplier", "ci", "p"} of a log m and its se."""
    low, high = scaling.interval(value, se, dof, level)
    p = scaling.p_value(value, se, dof)
    return {"multiplier": _value(np.exp(value)), "ci": [_value(np.exp(low)), _value(np.exp(high))],
            "p": _value(p) if se > 0 else None}


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


def _parameter(value, se, dof, level, space):
    """{"value", "ci"} of E or alpha, or with "not identified" where its interval leaves the parameter space
    (low, high): a t interval there would print a loss floor below 0 or an exponent of either sign."""
    low, high = scaling.interval(value, se, dof, level)
    out = {"value": float(value), "ci": [float(low), float(high)]}
    if not (space[0] <= low and high <= space[1]):
        out["not_identified"] = (f"not identified: its {level:.0%} interval [{low:.3g}, {high:.3g}] leaves "
                                 f"[{space[0]:g}, {space[1]:.3g}]")
    return out


def forms_of(est, arms, level):
    """{form: its fit for sweep.json, or "not identified"} of every form."""
    n_sizes = est["means"].shape[2]
    floor = float(est["means"][0].min())
    forms = {}
    for form, text in scaling.FORMS.items():
        if form not in est["fits"]:
            forms[form] = {"identified": False, "text": f"{text}: not identified by {n_sizes} sizes (needs "
                                                          f"{scaling.MIN_SIZES[form]})"}
            continue
        f = est["fits"][form]
        dof = int(f["level_dof"][0])
        forms[form] = {"identified": True, "text": text, "dof": f["dof"], "level_dof": dof,
                       "size_effect_sd": float(f["size_effect_sd"][0]), "params": {
            a: {"E": _parameter(f["E"][0][0, j], f["E"][1][0, j], dof, level, (0.0, floor)),
                "alpha": _parameter(f["alpha"][0][0, j], f["alpha"][1][0, j], dof, level, (0.0, 5.0))}
            for j, a in enumerate(arms)}}
    return forms


def fit_ladder(ladder, baseline, options=scaling.Options(), target=None, extrapolate=False, vocab=None,
               throughput=None, n_sims=400, rng=0, lr_design=(None, 1)):
    """Fits, multipliers (headline at the reference compute, the ladder average, per size, curve-free), trend and
    the calibration as plain numbers for sweep.json. ladder: {arm: {C: {seed: loss}}}; options: the estimator's
    (scaling.Options); target: (name, C, vocabulary or None) or None; vocab: the ladder's vocabulary; throughput:
    {"ratio": {arm: {C: X's compute per second over the baseline's}}, "source": text}; n_sims, rng: the calibration's
    ladders per truth and seed; lr_design: (the plan's lr design, its grid's seeds[, its audit's seeds, the
    report's lr tolerance]) for the calibration (stats/ladder_unseen.py report_calibration; design None: no lr
    stage, each arm at its optimum at every size). Each verdict carries its p
    ("p"). A ladder the power law cannot describe gives NotFitted."""
    arms, log_c, losses, seeds = scaling.check_ladder(ladder, baseline)
    computes = [sorted(ladder[a]) for a in arms]  # the given values: a throughput ratio is looked up by them
    k, n_sizes, n = losses.shape
    level = options.confidence
    top = float(np.exp(log_c.max()))
    target = target_point(target, top, vocab, extrapolate)
    bottom = float(np.exp(log_c.min()))
    if options.reference is not None and not bottom * (1 - 1e-9) <= options.reference <= top * (1 + 1e-9):
        raise ConfigError(f"reference compute {options.reference:.3g} FLOPs lies outside the ladder "
                          f"({bottom:.3g}-{top:.3g}); read a multiplier beyond it with --target")
    if refused := not_falling(arms, log_c, losses):
        return refused
    est = scaling.estimate(losses[None], log_c, options)
    if refused := unreadable(est, arms, log_c):
        return refused
    head, average, slope = est["headline"], est["average"], est["slope"]
    result = {"form": head["form"], "form_text": scaling.FORMS[head["form"]], "baseline": baseline, "seeds": seeds,
              "confidence": level, "sizes": n_sizes, "target": target, "reference": est["reference"],
              "forms": forms_of(est, arms, level), "arms": {}, "multipliers": {},
              "noise": {"sd": [float(v) for v in est["sd"][0]],
                        "fractions": dict(zip(("common", "shared", "persistent"),
                                              (float(v) for v in est["fractions"][0])))},
              "interval": "generalised least squares under the noise model (per-size seed sd, a seed's cells "
                          "correlated, each size's own deviation from the curve shared by its arms, its variance by "
                          "moments), t interval with the residual variance (Hartung-Knapp), delta method for the "
                          "multipliers and the slope",
              "throughput_source": (throughput or {}).get("source")}
    result["calibration"] = {**report_calibration(est, log_c, head["form"], n, options, n_sims, rng, *lr_design,
                                                arms=arms),
                             "seed": rng}
    shared = est["fits"]["shared"]
    for j, a in enumerate(arms):
        result["arms"][a] = {"points": [{"compute": float(c), "mean": float(row.mean()), "low": float(row.min()),
                                         "high": float(row.max())} for c, row in zip(computes[j], losses[j])],
                             "E": float(shared["theta"][0, 0]), "alpha": float(shared["theta"][0, 1]),
                             "A": float(shared["A"][0, j])}
    curve_c = np.geomspace(bottom, max(top, target["compute"] if target else top), CURVE_POINTS)
    extra = np.log(np.concatenate([[target["compute"]] if target else [], curve_c])) - est["centre"]
    along, along_se, along_dof = est["along"](extra)
    for j, a in enumerate(arms[1:], start=1):
        i = j - 1
        entry = {"headline": {"compute": est["reference"], "form": head["form"],
                              **_multiplier(head["value"][0, i], head["se"][0, i], head["dof"][0, 0], level)},
                 "average": _multiplier(average["value"][0, i], average["se"][0, i], average["dof"][0, 0], level),
                 "trend": None, "target": None,
                 "curve": [{"compute": float(c), **_multiplier(v, s, along_dof[0, 0, 0], level)}
                           for c, v, s in zip(curve_c, along[0, i, -CURVE_POINTS:], along_se[0, i, -CURVE_POINTS:])]}
        if "per_seed" in est:
            seeds_m = est["per_seed"]
            entry["per_seed"] = {"multipliers": [_value(np.exp(v)) for v in seeds_m["value"][0, :, i]],
                                 "spread_over_model": _value(seeds_m["ratio"][0, i]),
                                 "flag": bool(seeds_m["flag"][0, i])}
        if target:
            entry["target"] = {"compute": target["compute"], **_multiplier(along[0, i, 0], along_se[0, i, 0],
                                                                           along_dof[0, 0, 0], level)}
        if slope is not None:
            value, se, dof = slope["value"][0, i], slope["se"][0, i], slope["dof"][0, 0]
            low, high = scaling.interval(value, se, dof, level)
            entry["trend"] = {"slope": float(value), "ci": [float(low), float(high)], "dof": int(dof),
                              "p": _value(scaling.p_value(value, se, dof))}
        ratio = ((throughput or {}).get("ratio") or {}).get(a) or {}
        entry["at_sizes"] = size_rows(est, i, computes[j], ratio, level)
        result["multipliers"][a] = entry
    return result


def size_rows(est, i, computes, ratio, level):
    """Arm i's multiplier at each of its sizes: the fit's, the curve-free reading (flagged where the two intervals
    are disjoint) and, with a throughput ratio {C: X's compute per second over the baseline's}, in wall-clock."""
    here, (free, status) = est["at_sizes"], (est["curve_free"]["value"][0], est["curve_free"]["status"][0])
    rows = []
    for s, c in enumerate(computes):
        value, se, dof = here["value"][0, i, s], here["se"][0, i, s], here["dof"][0, 0, 0]
        fit_here = _multiplier(value, se, dof, level)
        fv, flo, fhi = free[:, i, s]
        lo, hi = scaling.interval(value, se, dof, level)
        r = ratio.get(c)
        rows.append({"compute": c, "fit": fit_here, "curve_free_status": status[i, s],
                     "curve_free": _value(np.exp(fv)) if status[i, s] != "outside" else None,
                     "curve_free_ci": [_value(np.exp(flo)), _value(np.exp(fhi))],
                     "disagree": bool(status[i, s] == "ok" and (fhi < lo or flo > hi)),
                     "throughput_ratio": r,
                     "wall_clock": None if r is None or fit_here["multiplier"] is None
                     else fit_here["multiplier"] * r,
                     "wall_clock_ci": None if r is None else [None if v is None else v * r for v in fit_here["ci"]]})
    return rows
