"""One multiple-comparison family: Holm's step-down adjustment, and the verdicts of a report adjusted together.

A report declares a claim ("this pair differs on this metric", "this multiplier is not 1") where its Holm-adjusted
p is below the family-wise error rate: the chance of any false claim among the family's stays at most that rate,
whatever the dependence between the tests. numpy is imported inside: log reading needs none of this.
"""


def holm(pvalues):
    """Holm's step-down adjusted p-values (Holm 1979): the i-th smallest of m p-values times (m - i + 1), made
    non-decreasing in that order and capped at 1. Rejecting where the adjusted p is below alpha keeps the
    chance of any false rejection in the family at most alpha under every dependence between the tests.
    Vectorised over the last axis (one family per row); a nan p is no member of its row's family (m counts the
    others) and its adjusted p is nan."""
    import numpy as np
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p, axis=-1)  # nan last
    members = (~np.isnan(p)).sum(axis=-1, keepdims=True)
    scaled = np.take_along_axis(p, order, axis=-1) * (members - np.arange(p.shape[-1]))
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, np.minimum(np.maximum.accumulate(scaled, axis=-1), 1.0), axis=-1)
    return adjusted


def adjust(members):
    """Holm over one family: members [(p, record)], each record (a dict) gets its adjusted p as "p_holm"."""
    for (_, record), p in zip(members, holm([p for p, _ in members]) if members else []):
        record["p_holm"] = float(p)
