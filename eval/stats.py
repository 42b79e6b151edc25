"""Statistics for reading results: binomial intervals for accuracies, paired differences over seeds.
Plain Python (no torch), so run reading and reports stay light."""
import math
import statistics

Z95 = 1.959963984540054


def wilson(k, n, z=Z95):
    """95% Wilson score interval of a binomial proportion k/n (better than normal near 0/1 and small n)."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


# two-sided 95% quantiles of Student's t by degrees of freedom, used when scipy is not installed;
# between rows the smaller df is taken (a slightly wider, conservative interval)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile(df):
    """(t_{0.975, df}, where it came from)."""
    try:
        from scipy.stats import t
        return float(t.ppf(0.975, df)), "scipy.stats.t"
    except ImportError:
        return T975[max(k for k in T975 if k <= df)], "table (scipy not installed)"


def mean_std(values):
    return {"n": len(values), "mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None}


def paired(baseline, other):
    """Paired difference other - baseline over the seeds in both ({seed: value} each)."""
    seeds = sorted(set(baseline) & set(other))
    diffs = [other[s] - baseline[s] for s in seeds]
    out = {"seeds": seeds, **mean_std(diffs), "t": None, "ci95": None, "t_source": None}
    if len(diffs) > 1:
        se = out["std"] / math.sqrt(len(diffs))
        q, out["t_source"] = t_quantile(len(diffs) - 1)
        out["t"] = out["mean"] / se if se > 0 else math.copysign(math.inf, out["mean"]) if out["mean"] else 0.0
        out["ci95"] = [out["mean"] - q * se, out["mean"] + q * se]
    return out
