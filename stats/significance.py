"""Significance for reading results: binomial intervals for accuracies, paired differences over seeds, what a
number of seeds can detect, and the paired item-level noise of two models scored on the same benchmark items
(Holm's adjustment of a family of them: stats/family.py). No torch; scipy.stats is imported inside the functions
that use it: its import (about half a second) stays out of log reading, which needs only wilson()."""
import math
import statistics

Z95 = 1.959963984540054  # scipy.stats.norm.ppf(0.975), written out: wilson() reads logs without scipy


def wilson(k, n, z=Z95):
    """95% Wilson score interval of a binomial proportion k/n (better than normal near 0/1 and small n)."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def t_quantile(df, p=0.975):
    """t_{p, df}, Student's t quantile."""
    from scipy.stats import t
    return float(t.ppf(p, df))


def t_pvalue(t, df):
    """Two-sided p of a t statistic with df degrees of freedom; numpy arrays in, arrays out."""
    from scipy.stats import t as student
    return 2 * student.sf(abs(t), df)


def mean_std(values):
    return {"n": len(values), "mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None}


def paired(baseline, other):
    """Paired difference other - baseline over the seeds in both ({seed: value} each): the paired t-test's
    statistic, 95% interval and two-sided p (the interval excludes 0 exactly when p < 0.05)."""
    seeds = sorted(set(baseline) & set(other))
    diffs = [other[s] - baseline[s] for s in seeds]
    out = {"seeds": seeds, **mean_std(diffs), "t": None, "ci95": None, "p": None}
    if len(diffs) > 1:
        se = out["std"] / math.sqrt(len(diffs))
        q = t_quantile(len(diffs) - 1)
        out["t"] = out["mean"] / se if se > 0 else math.copysign(math.inf, out["mean"]) if out["mean"] else 0.0
        out["ci95"] = [out["mean"] - q * se, out["mean"] + q * se]
        out["p"] = float(t_pvalue(out["t"], len(diffs) - 1))
    return out


def detectable_difference(std, n, alpha=0.05, power=0.80):
    """The smallest true paired difference that n seeds with this paired std detect with the given power at
    two-sided level alpha: (t_{1-alpha/2, n-1} + t_{power, n-1}) * std / sqrt(n) (the t approximation of the
    power of a paired t-test, n-1 degrees of freedom). None below 2 seeds."""
    if n is None or n < 2 or std is None:
        return None
    return (t_quantile(n - 1, 1 - alpha / 2) + t_quantile(n - 1, power)) * std / math.sqrt(n)


def seeds_needed(std, diff, alpha=0.05, power=0.80, most=10_000):
    """The fewest seeds whose detectable difference is at most |diff| (the t quantiles depend on n, so n is
    searched, not solved for); None when no number up to `most` does (diff 0, or tiny against std)."""
    if std is None or diff is None or diff == 0:
        return None
    # t quantiles exceed the normal's, so n below ((z_{1-alpha/2} + z_power) std / diff)^2 cannot do: start there
    from scipy.stats import norm
    start = max(2, math.floor(((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * std / abs(diff)) ** 2))
    for n in range(start, most + 1):
        if detectable_difference(std, n, alpha, power) <= abs(diff):
            return n
    return None


def mcnemar_exact(only_a, only_b):
    """Two-sided exact McNemar p-value for two models scored on the same items: under "equal accuracy" each of
    the only_a + only_b discordant items (right for one model only) goes either way with probability 1/2, so
    p = min(1, 2 P(X <= min(only_a, only_b))), X ~ Binomial(only_a + only_b, 1/2): scipy's exact binomial test.
    No discordant item: no evidence either way, p = 1."""
    if only_a + only_b == 0:
        return 1.0
    from scipy.stats import binomtest
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired_difference_ci(both, only_a, only_b, neither, z=Z95):
    """95% interval of acc(A) - acc(B) on the same n items, from the paired 2x2 table (right for both, A only,
    B only, neither): Newcombe's square-and-add interval for paired proportions (Newcombe 1998, Stat Med
    17:2635, method 10; Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8). It
    combines the two accuracies' Wilson intervals through their estimated correlation (phi, its positive part
    shrunk by n/2), so it stays inside [-1, 1] and keeps its coverage with few discordant items, where the Wald
    interval does not. It is unconditional (the number of discordant items is random too), so its edge and
    the exact conditional McNemar test can disagree by a hair at p close to 0.05."""
    n = both + only_a + only_b + neither
    if n == 0:
        return [-1.0, 1.0]
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    (l1, u1), (l2, u2) = wilson(both + only_a, n, z), wilson(both + only_b, n, z)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    cross = both * neither - only_a * only_b
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)
    diff = p1 - p2
    lower = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    upper = diff + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    return [lower, upper]


def item_level(diffs, z=Z95):
    """Item-level interval of a mean difference: `diffs` holds one number per item (model A's correctness minus
    model B's, averaged over the seeds both have), the items are the sampling unit: mean ± z·sd/√n. It answers
    "these trained models, another sample of items like these", not "another seed of training". With one seed
    it is the Wald interval of paired proportions; at thousands of items it agrees with paired_difference_ci.
    p: the two-sided normal p of mean/se (below 0.05 exactly when the 95% interval excludes 0)."""
    n = len(diffs)
    mean = statistics.fmean(diffs) if diffs else None
    se = statistics.stdev(diffs) / math.sqrt(n) if n > 1 else None
    out = {"items": n, "mean": mean, "se": se, "ci95": None, "p": None}
    if se is not None:
        from scipy.stats import norm
        out["ci95"] = [mean - z * se, mean + z * se]
        out["p"] = float(2 * norm.sf(abs(mean) / se)) if se > 0 else float(mean == 0)
    return out
