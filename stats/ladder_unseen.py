"""The calibration a ladder report prints: its rates measured on truths that are not the ladder's own fit.

A twin of the fit (ladder_noise.truth_of) is the one truth the estimator is built for, so ladders drawn from it
cover at the nominal level whatever the real ladder is. The report's rates are therefore the worst over the twin
and the twin perturbed by what the fit cannot see, each within what the ladder's data allow:
    lr drift      each arm's optimum falling with the horizon at its own rate, up to DRIFT x over the ladder (the
                  baseline's fastest, or the others'), through the plan's lr design (ladder_noise.LrStage: the grid
                  on its own seeds, stats/lr_grid.py's rule, a size's shape moving the optimum up to TRANSFER x)
                  and the tuning audit;
    persistent    one arm's own seed effect persisting across sizes (PERSISTENT of its seed variance);
    sizes         each size off the curves by as much as its mean's seed noise (a deviation the moments estimator
                  reads as none about half the time);
    second term   a second, slower power term in every arm's law (the same term: the law's shape), and
    floor         a lower floor E for the baseline, each as large as the headline fit's own residual test (chi^2 at
                  5%) would detect DETECT of the time, noise-free;
    one arm's bend  a second power term in one other arm's law alone (a truth for each), as large as the ladder's
                  data show it: a 1-dof score test along that arm's bend (one_arm_bends), its estimate less one
                  standard error towards 0 (none within one error of 0).
A bend in one arm alone is scaled to the data, not to a detection rate: one the residual chi^2 test rarely detects
already takes the headline's coverage well below its level (configuration b, experiments/lr_horizon.md), so every
ladder would print that whatever its truth, while that test, spread over every direction at once, misses half the
bends that make the interval miss most of the time. The targeted test sees them; the soft threshold keeps a ladder
with no bend from planting its noise at full size (BENCHMARKS.md, "A bend in one arm's law alone": how often the
printed coverage falls below 0.90 with and without a bend).
Coverage is the headline's (the trend fit's twin); the trend's false alarm and Holm's family-wise error are a null
twin's (every arm the baseline's law in the shared fit: a constant multiplier, and no arm differing); the lr and
seed perturbations enter both, the curve perturbations coverage alone (they make the multiplier change). Every
ladder runs through estimate (stats/scaling.py) with the report's options, by ladder_noise.calibrate.
"""
from dataclasses import replace

import numpy as np
from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

from stats import scaling
from stats.ladder_noise import LrStage, calibrate, truth_of
from stats.lr_audit import AUDIT_SEEDS, AuditOptions

DRIFT = 3.0  # the fastest an arm's optimum falls over the ladder (relu2's on the CPU ladder: experiments/cpu_ladder.md)
PERSISTENT = 0.3  # one arm's own persisting share of its seed variance
DETECT = 0.5  # a planted curve misfit as large as the residual test detects this often
# experiments/cpu_ladder.md: the loss's bend in log2 lr at the smallest and the largest rung (grid at A, audit at D)
CURVATURE = (0.06, 0.01)
TRANSFER = 1.21  # experiments/lr_transfer.md: the most the optimum moved over 4x width and 4x depth at one horizon


def lr_stage(design, seeds, audit_seeds=AUDIT_SEEDS, audit=AuditOptions()):
    """The lr stage a report simulates for a plan of this design, the grid on `seeds` of its own, the tuning audit
    on `audit_seeds` (0: none) judged under the report's `audit` options."""
    return LrStage(curvature=CURVATURE, seeds=seeds, design=design, transfer=TRANSFER, audit_seeds=audit_seeds,
                   audit=audit)


def misfit(truth, form):
    """The noncentrality of the headline fit's residual test on the truth's noise-free means: their whitened
    residual sum of squares after the fit in `form` under the truth's seed noise, and its degrees of freedom."""
    k, s = len(truth.curves), len(truth.compute)
    means = np.array([truth.loss(a, truth.compute) for a in range(k)])[None]
    persistent = float(np.mean(truth.persistent))
    cov = scaling.mean_covariance(np.asarray(truth.seed_sd, float)[None],
                                  np.array([[truth.common, truth.shared, persistent]]), k, truth.seeds)
    x = truth.log_c - truth.log_c.mean()
    theta = scaling.fit(means, x, form, cov, size_effect=False)[0][0]
    e, al, la, p = scaling.layout(form, k)
    fitted = theta[e, None] + np.exp(theta[la, None] - theta[al, None] * x)
    whitened = np.linalg.solve(np.linalg.cholesky(cov[0]), (fitted - means[0]).ravel())
    return float(whitened @ whitened), k * s - p


def detectable(dof):
    """The noncentrality the residual chi^2 test at 5% detects DETECT of the time."""
    critical = chi2.ppf(0.95, dof)
    return brentq(lambda lam: ncx2.sf(critical, dof, lam) - DETECT, 1e-6, 1e4)


def scaled(make, truth, form):
    """make(amplitude) -> a truth; the amplitude whose misfit is detectable() (two secant steps from 1, the
    misfit growing as its square where small), and its truth."""
    amplitude = 1.0
    for _ in range(2):
        lam, dof = misfit(make(amplitude), form)
        amplitude *= np.sqrt(detectable(dof) / max(lam, 1e-12))
    return make(amplitude)


def seed_perturbations(truth, lr):
    """{name: truth} of the twin with the lr stage's drifts and the seeds' and sizes' unseen parts."""
    k = len(truth.curves)
    out = {}
    if lr is not None:
        out[f"baseline's lr optimum falling {DRIFT:g}x over the ladder, the others' fixed"] = replace(
            truth, lr=replace(lr, shift=(DRIFT,) + (1.0,) * (k - 1)))
        out[f"the other arms' lr optima falling {DRIFT:g}x and {np.sqrt(DRIFT):.2g}x, the baseline's fixed"] = \
            replace(truth, lr=replace(lr, shift=(1.0,) + tuple(DRIFT if a % 2 else np.sqrt(DRIFT)
                                                                for a in range(1, k))))
    if truth.seeds > 1:
        room = 0.9 - truth.common - truth.shared
        own = tuple(max(float(np.mean(truth.persistent)), min(PERSISTENT, room)) if a == 1 else
                    float(np.mean(truth.persistent)) for a in range(k))
        out[f"an arm's own seed effect persisting across sizes ({own[1]:.0%} of its variance)"] = replace(
            truth, persistent=own)
    noise = float(np.median(truth.seed_sd)) / np.sqrt(truth.seeds)
    if truth.size_effect_sd < noise:
        out[f"each size off the curves by sd {noise:.3g} (its mean's seed noise)"] = replace(
            truth, size_effect_sd=noise)
    return out


def second_term(truth, amplitudes):
    """The truth with each arm's law plus a second, slower power term: half the baseline's exponent, amplitudes (K,)
    in units of the baseline's first term at the largest rung (0: none)."""
    a, alpha = truth.curves[0][1][0]
    unit = a * float(truth.compute[-1]) ** (-alpha / 2)
    return replace(truth, curves=tuple((floor_e, own + (((amplitude * unit, alpha / 2),) if amplitude else ()))
                                       for (floor_e, own), amplitude in zip(truth.curves, amplitudes)))


def curve_perturbations(truth, form):
    """{name: truth} of the twin with a second power term in every arm's law or a lower floor in the baseline's,
    each scaled to what the headline fit's residuals detect DETECT of the time."""
    (e, terms), *others = truth.curves
    k = len(truth.curves)

    def floor(amplitude):  # amplitude: the drop in E over a tenth of E
        return replace(truth, curves=((e * (1 - 0.1 * min(amplitude, 9.0)), terms), *others))

    return {"a second power term (half the baseline's exponent) in every arm's law":
            scaled(lambda amplitude: second_term(truth, (amplitude,) * k), truth, form),
            "the baseline's floor E lower than the others'": scaled(floor, truth, form)}


def one_arm_bends(est, log_c, form):
    """Each other arm's own second power term as its ladder's means show it (second_term's, in arm j's law alone):
    its amplitude (B, K-1) and standard error. The Gauss-Newton step from the headline fit in `form` along the term's
    whitened direction less what the fit's own parameters absorb of it (its residual projection off the fit's
    Jacobian): a 1-dof score test, which sees a bend in one arm that the residual chi^2 test, spread over every
    direction at once, misses. A direction the fit absorbs entirely has amplitude 0 and an infinite error."""
    r, jac, whiten = scaling.whitened_fit(est, log_c, form)
    b, k, s = est["means"].shape
    theta = est["fits"][form]["theta"]
    _, al, la, _ = scaling.layout(form, k)
    x = log_c[0] - est["centre"]
    alpha = theta[:, al[0], None]
    shape = np.exp(theta[:, la[0], None] - alpha * x.max() - alpha / 2 * (x - x.max()))  # (B, S): second_term's
    hat = jac @ np.linalg.pinv(np.einsum("bnp,bnq->bpq", jac, jac)) @ jac.transpose(0, 2, 1)
    amplitude, se = np.zeros((b, k - 1)), np.full((b, k - 1), np.inf)
    for j in range(1, k):
        direction = np.zeros((b, k, s))
        direction[:, j] = shape
        d = np.einsum("bij,bj->bi", whiten, direction.reshape(b, -1))
        unseen = d - np.einsum("bij,bj->bi", hat, d)  # what no change of the fit's parameters reproduces
        seen = (unseen ** 2).sum(axis=1)
        ok = seen > 1e-12 * (d ** 2).sum(axis=1)  # a direction inside the fit's span leaves only rounding
        # r is fitted - means: a bend the fit missed leaves -amplitude x `unseen` in r (Frisch-Waugh: regressing r on
        # the part of the direction orthogonal to the Jacobian is the joint fit's coefficient, a bound held or not)
        amplitude[ok, j - 1] = -(unseen * r).sum(axis=1)[ok] / seen[ok]
        se[ok, j - 1] = 1 / np.sqrt(seen[ok])
    return amplitude, se


def bend_perturbations(truth, est, log_c, form, arms):
    """{name: truth} of the twin with one other arm's own second power term as large as its ladder's data show it,
    one truth per arm that shows one: one_arm_bends' estimate less one standard error towards 0 (soft-thresholded:
    none where the estimate is within one error of 0). arms: the arms' names, the baseline first."""
    amplitude, se = (v[0] for v in one_arm_bends(est, log_c, form))
    if truth.seeds == 1:  # one seed measures no noise: the fit's residuals scale the noise model's unit sd, as in
        se = se * est["fits"][form]["residual_scale"][0]  # the twin (ladder_noise.truth_of)
    shown = np.sign(amplitude) * np.maximum(np.abs(amplitude) - se, 0.0)
    return {f"a second power term in {arms[j]}'s law alone, {v:+.2g}x the baseline's first term at the largest rung "
            "(half its exponent): as large as the data show it, less one standard error":
            second_term(truth, [0.0] * j + [v] + [0.0] * (len(arms) - j - 1))
            for j, v in enumerate(shown, start=1) if v}


def null_of(truth):
    """The twin with every arm the baseline's law: Holm's complete null."""
    return replace(truth, curves=(truth.curves[0],) * len(truth.curves))


def worst(results, key, lowest):
    """(the worst rate of `key` over the truths' results {name: calibrate's}, its truth's name)."""
    have = {name: got[key] for name, got in results.items() if key in got}
    if not have:
        return None, None
    name = (min if lowest else max)(have, key=lambda n: have[n]["rate"])
    return have[name], name


def report_calibration(est, log_c, form, seeds, options, n, rng, design="smallest", lr_seeds=1,
                       audit_seeds=AUDIT_SEEDS, tolerance=AuditOptions.tolerance, arms=None):
    """The rates a ladder report prints for estimate's output `est` (one ladder, headline `form`, `seeds` seeds a
    cell): calibrate's keys, each the worst over the twin and its perturbations (module docstring), n ladders
    each; "twin": the twin's own rates; "worst": {rate: the truth it came from}; "truths": {name: its rates and
    assumptions}. design, lr_seeds: the plan's lr design (ladder_noise.DESIGNS) and the grid's seeds; design None:
    no lr stage (each arm at its optimum at every size, as the fit assumes); audit_seeds, tolerance: the plan's
    tuning audit's seeds (0: none) and the report's tolerance; arms: the arms' names, the baseline first (None:
    "arm 1", ...)."""
    lr = None if design is None else lr_stage(design, lr_seeds, audit_seeds,
                                              AuditOptions(tolerance, options.confidence))
    twin = truth_of(est, 0, log_c, form, seeds)
    arms = arms or [f"arm {j}" for j in range(log_c.shape[0])]
    groups = {"coverage": {"the fit": twin, **seed_perturbations(twin, lr), **curve_perturbations(twin, form),
                           **bend_perturbations(twin, est, log_c, form, arms)},
              "null": {}}
    if est["slope"] is not None:
        null = null_of(truth_of(est, 0, log_c, "shared", seeds))
        groups["null"] = {"no arm differing": null, **seed_perturbations(null, lr)}
    results = {key: {name: calibrate(truth, options, n, rng) for name, truth in truths.items()}
               for key, truths in groups.items()}
    out = dict(results["coverage"]["the fit"])
    out["twin"] = {key: got[key] for got in (out, results["null"].get("no arm differing", {}))
                   for key in ("coverage", "false_alarm", "family_wise") if key in got}
    out["worst"] = {}
    for key, group in (("coverage", "coverage"), ("false_alarm", "null"), ("family_wise", "null")):
        rate, name = worst(results[group], key, key == "coverage")
        out.pop(key, None)
        if rate is not None:
            out[key], out["worst"][key] = rate, name
    out["truths"] = {f"{key}: {name}": {"assumptions": groups[key][name].assumptions(),
                                        **{r: got[r] for r in ("coverage", "false_alarm", "family_wise") if r in got}}
                     for key in groups for name, got in results[key].items()}
    out["lr_design"] = design
    return out
