"""Each arm at its best learning rate: the lr picker of a grid sweep, and the paired comparisons it allows.

Input: {arm: {lr: {seed: final loss}}}, a log-spaced grid of learning rates per arm, the same seeds at every lr
of every arm. The rule, stated in every output: an arm's best lr is the grid point with the lowest mean final loss
over seeds; a point where any seed diverged (a non-finite loss) counts as worst. Where the best lr has a grid
neighbour on each side, a parabola through those three means in log lr gives an interpolated optimum (reported,
never used to pick: no run was trained there). A best lr at an end of the grid is flagged: the optimum may lie
outside, and a comparison at it understates that arm.

The tuning audit's lrs: a ladder whose lr was picked at one size checks the pick at another (its largest) on a small
grid of its own around the pick (audit_lrs: half a grid step and one and a half on each side); stats/lr_audit.py
estimates the optimum there with its interval and judges the pick.

Comparisons are paired by seed (stats/significance.py's paired): each arm at its best lr against the baseline at its own
best lr ("what is X worth, both tuned"), and at the baseline's best lr ("X dropped into the baseline's recipe").
"""
import math

import numpy as np

from errors import ConfigError
from stats.significance import mean_std, paired

RULE = ("best lr: the grid point with the lowest mean final loss over seeds (a point with a diverged seed counts "
        "as worst); interpolated: the vertex of a parabola in log lr through the best point and its two neighbours")
# consecutive log-lr steps may differ by this fraction: 3e-4, 6e-4, 1.2e-3 pass, and so do rounded grids
# such as 1e-4, 3e-4, 1e-3 (steps ln 3 and ln 3.33)
LOG_SPACING_TOLERANCE = 0.15
# how a ladder chooses each arm's lr at each size (a plan's lr_design; stats/ladder_noise.py simulates each)
DESIGNS = {"smallest": "each arm's lr picked on a grid at the smallest size and run at every size",
           "horizon": "each arm's lr the vertex of a grid on the base shape at the smallest size's horizon and at the "
                      "largest's, interpolated in log tokens between them (CompleteP carrying width and depth)",
           "ends": "each arm's lr the vertex of a grid at the smallest size and one at the largest, interpolated in "
                   "log tokens between them"}
AUDIT_STEPS = (-1.5, -0.5, 0.5, 1.5)  # the audit's lrs: the pick times the grid's ratio to these powers


def check_grid(arm, grid):
    """Sorted lrs and sorted seeds of one arm's {lr: {seed: loss}}; a grid the picker cannot read is a ConfigError."""
    lrs = sorted(grid)
    if bad := [lr for lr in lrs if not lr > 0]:
        raise ConfigError(f"{arm}: learning rate {bad[0]} is not positive; a grid holds lrs > 0")
    if len(lrs) < 2:
        raise ConfigError(f"{arm}: a grid of one learning rate ({lrs[0]:g}) picks nothing; run at least 3, "
                          "log-spaced (e.g. 0.5x, 1x, 2x the recipe's lr)")
    steps = np.diff(np.log(lrs))
    if steps.max() > (1 + LOG_SPACING_TOLERANCE) * steps.min():
        raise ConfigError(f"{arm}: the lrs {', '.join(f'{lr:g}' for lr in lrs)} are not log-spaced; use a constant "
                          "ratio between neighbours (e.g. 3e-4, 6e-4, 1.2e-3), so that every lr is equally resolved")
    seeds = sorted(set().union(*(grid[lr] for lr in lrs)), key=str)
    for lr in lrs:
        if missing := [s for s in seeds if s not in grid[lr]]:
            raise ConfigError(f"{arm} at lr {lr:g}: no loss for seed {', '.join(map(str, missing))}; every lr needs "
                              "the same seeds (run them, or drop those seeds from the whole grid)")
    return lrs, seeds


def vertex(x, y):
    """The vertex of the parabola through three points, x and y (..., 3) each (any batch shape): nan where it
    opens downward or is flat. RULE's interpolation, for pick and for the simulated grids of stats/ladder_noise.py."""
    x0, x1, x2 = np.moveaxis(np.asarray(x, float), -1, 0)
    y0, y1, y2 = np.moveaxis(np.asarray(y, float), -1, 0)
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 ** 2 * (y0 - y1) + x1 ** 2 * (y2 - y0) + x0 ** 2 * (y1 - y2)) / denom
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, -b / (2 * a), np.nan)


def best_and_vertex(x, means):
    """RULE on a batch of grids: means (..., G) at log lrs x (G,) (a non-finite mean counts as worst) ->
    (the best point's index (...), its parabola's vertex in log lr (...), nan at an edge or without a minimum)."""
    x = np.asarray(x, float)
    score = np.where(np.isfinite(means), means, np.inf)
    best = np.argmin(score, axis=-1)
    inner = np.clip(best, 1, len(x) - 2)[..., None]
    y = np.take_along_axis(score, inner + np.arange(-1, 2), axis=-1)
    with np.errstate(invalid="ignore"):
        top = vertex(x[inner + np.arange(-1, 2)], y)
    return best, np.where((best == inner[..., 0]) & np.isfinite(y).all(axis=-1), top, np.nan)


def pick(arm, grid):
    """One arm's best lr by RULE: {"best_lr", "interpolated_lr" (None at an edge), "edge" ("low", "high" or None),
    "grid": [{"lr", "n", "mean", "std", "diverged"}]}."""
    lrs, seeds = check_grid(arm, grid)
    rows = []
    for lr in lrs:
        losses = [grid[lr][s] for s in seeds]
        diverged = not all(math.isfinite(x) for x in losses)
        stats = {"n": len(losses), "mean": None, "std": None} if diverged else mean_std(losses)
        rows.append({"lr": lr, **stats, "diverged": diverged})
    score = [math.inf if r["diverged"] else r["mean"] for r in rows]
    best = int(np.argmin(score))
    edge = "low" if best == 0 else "high" if best == len(lrs) - 1 else None
    interpolated = None
    if edge is None and all(math.isfinite(s) for s in score[best - 1:best + 2]):
        top = vertex(np.log(lrs[best - 1:best + 2]), np.array(score[best - 1:best + 2]))
        interpolated = float(math.exp(top)) if math.isfinite(top) else None
    return {"best_lr": lrs[best], "interpolated_lr": interpolated, "edge": edge, "seeds": seeds, "grid": rows}


def audit_lrs(lr, lrs):
    """The audit's 4 lrs around a pick lr of the grid lrs (3 significant digits): at the grid's own ratio r, lr r^-1.5,
    r^-0.5, r^0.5, r^1.5, so that a vertex a factor 2 away (r = 2) lies between audit points, not at an edge."""
    ratio = (max(lrs) / min(lrs)) ** (1 / (len(lrs) - 1))
    return [float(f"{lr * ratio ** k:.3g}") for k in AUDIT_STEPS]


def compare(grids, baseline):
    """Every arm's pick, and each other arm against `baseline` paired by seed: at both best lrs ("at_best") and at
    the baseline's best lr ("at_baseline_lr", None when the arm's grid lacks it). grids: {arm: {lr: {seed: loss}}}."""
    if baseline not in grids:
        raise ConfigError(f"baseline {baseline!r} has no grid; name one of {', '.join(grids)}")
    picks = {arm: pick(arm, grid) for arm, grid in grids.items()}
    for arm, p in picks.items():
        if p["seeds"] != picks[baseline]["seeds"]:
            raise ConfigError(f"{arm} has seeds {p['seeds']}, {baseline} {picks[baseline]['seeds']}; a paired "
                              "comparison needs the same seeds in both arms")
    base_lr = picks[baseline]["best_lr"]
    pairs = {arm: {"at_best": paired(grids[baseline][base_lr], grids[arm][p["best_lr"]]), "baseline_lr": base_lr,
                   "at_baseline_lr": paired(grids[baseline][base_lr], grids[arm][base_lr])
                   if base_lr in grids[arm] else None}
             for arm, p in picks.items() if arm != baseline}
    return {"rule": RULE, "baseline": baseline, "picks": picks, "paired": pairs,
            "best_lr": {arm: p["best_lr"] for arm, p in picks.items()},
            "sentences": sentences(picks, pairs, baseline)}


def _interval(p):
    if p["ci95"] is None:
        return f"{p['mean']:+.4f} (n={p['n']}, no interval)"
    return f"{p['mean']:+.4f} nats (95% CI [{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}], {p['n']} seeds paired)"


def sentences(picks, pairs, baseline):
    out = []
    for arm, p in picks.items():
        text = f"{arm}: best lr {p['best_lr']:g} of {len(p['grid'])} grid points ({len(p['seeds'])} seeds)"
        if p["interpolated_lr"] is not None:
            text += f"; a parabola in log lr puts the optimum at {p['interpolated_lr']:.3g}"
        if p["edge"]:
            text += (f"; it is the grid's {'lowest' if p['edge'] == 'low' else 'highest'} lr, so the optimum may "
                     f"lie outside: extend the grid {'down' if p['edge'] == 'low' else 'up'}ward")
        out.append(text + ".")
    for arm, pair in pairs.items():
        text = (f"{arm} - {baseline}, each at its best lr: {_interval(pair['at_best'])}; at {baseline}'s best lr "
                f"{pair['baseline_lr']:g}: ")
        text += _interval(pair["at_baseline_lr"]) if pair["at_baseline_lr"] else "not in its grid"
        out.append(text + ".")
    return out
