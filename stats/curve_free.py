"""The curve-free multiplier: at each of X's sizes, the baseline's compute that reaches X's mean loss, read off the
baseline's own observed points, over X's compute; with a Fieller interval, or "not resolved".

Between two of the baseline's points the reading follows the baseline's fitted curve, shifted to pass through both
points (its residual there interpolated linearly in log C), not the chord: a chord across a wide gap of a convex
curve reads too little compute (a planted 1.5 read as 1.578 at the CPU ladder's smallest size), while the shifted
curve is exact where the form is right and off by its residuals' curvature only where it is not. The reading stays
curve-free where it matters: it passes through every observed point, and it is given only between them.

The interval inverts the test of "the baseline's reading at x0 equals X's loss" (Fieller's construction, the
means' covariance from the noise model: per-size variance, the correlation of a seed's cells), so it is not
symmetric and may be open towards a flat stretch of the baseline; where the baseline's step around X's loss is not
significant itself, the reading is "not resolved".
"""
import numpy as np
from scipy.optimize import brentq
from scipy.stats import t as student

GRID = 400  # test points per gap between the baseline's sizes


def _reading(x, xb, yb, curve):
    """The baseline's loss read at x: its fitted curve plus its residual at its points, linear between them; and
    the weights of its means (len(xb),) in that reading."""
    j = int(np.clip(np.searchsorted(xb, x, side="right") - 1, 0, len(xb) - 2))
    t = (x - xb[j]) / (xb[j + 1] - xb[j])
    weights = np.zeros(len(xb))
    weights[j], weights[j + 1] = 1 - t, t
    return curve(x) + weights @ (yb - curve(xb)), weights


def curve_free(log_c, means, cov_means, curve, dof, level):
    """Each other arm's curve-free log m at each of its sizes: (value, low, high) arrays (K-1, S) and a status
    array (K-1, S) of "ok", "outside" (its loss outside the baseline's observed ones), "not resolved". log_c, means
    (K, S); cov_means (K*S, K*S); curve: the baseline's fitted loss at log C; dof, level: the t quantile's."""
    k, s = means.shape
    xb, yb = log_c[0], means[0]
    q = student.ppf(0.5 + level / 2, dof)
    out = np.full((3, k - 1, s), np.nan)
    status = np.full((k - 1, s), "outside", dtype=object)
    grid = np.concatenate([np.linspace(xb[j], xb[j + 1], GRID, endpoint=False) for j in range(s - 1)] + [xb[-1:]])
    readings = [_reading(x, xb, yb, curve) for x in grid]
    h = np.array([r[0] for r in readings])
    w_base = np.array([r[1] for r in readings])
    for a in range(1, k):
        for i in range(s):
            target = means[a, i]
            if not min(yb) <= target <= max(yb):
                continue
            w = np.zeros((len(grid), k * s))
            w[:, :s] = w_base
            w[:, a * s + i] -= 1
            var = np.einsum("gi,ij,gj->g", w, cov_means, w)
            accept = (h - target) ** 2 <= q ** 2 * var
            cross = np.flatnonzero(np.diff(np.sign(h - target)) != 0)
            if not len(cross):
                continue
            g = cross[0]
            root = brentq(lambda x: _reading(x, xb, yb, curve)[0] - target, grid[g], grid[g + 1])
            j = int(np.clip(np.searchsorted(xb, root, side="right") - 1, 0, s - 2))
            step = yb[j] - yb[j + 1]
            step_var = cov_means[j, j] + cov_means[j + 1, j + 1] - 2 * cov_means[j, j + 1]
            if step ** 2 <= q ** 2 * step_var:
                status[a - 1, i] = "not resolved"
                out[0, a - 1, i] = root - log_c[a, i]
                continue
            lo = hi = g
            while lo > 0 and accept[lo - 1]:
                lo -= 1
            while hi < len(grid) - 1 and accept[hi + 1]:
                hi += 1
            # an accepted region reaching the baseline's first or last point is open there: beyond them, no reading
            out[:, a - 1, i] = (root - log_c[a, i], grid[lo] - log_c[a, i] if lo > 0 else -np.inf,
                                grid[hi] - log_c[a, i] if hi < len(grid) - 1 else np.inf)
            status[a - 1, i] = "ok"
    return out, status
