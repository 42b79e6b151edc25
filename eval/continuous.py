"""Continuous scores of a multiple-choice item: what its options' log-likelihoods say beyond which option wins.

Accuracy counts an item right only when the gold option beats every distractor; a small model sits at chance on
HellaSwag while the log-likelihood it gives the gold ending keeps improving. The Signal-and-Noise study (Heineman
et al. 2025) and OLMo's in-loop evaluations read the gold continuation's bits per byte instead; DataDecide finds
such continuous scores rank small models the way their larger versions rank (docs/evaluation.md). numpy only:
the readers (analysis/, the sweep report) use it without importing torch.
"""
import math

import numpy as np

CONTINUOUS = {"bpb": False, "p_gold": True, "margin": True}  # per-item score -> whether higher is better


def continuous_scores(ll, n_bytes, gold):
    """Per item, from each option's summed log-likelihood ll (n, k) (an absent option: -inf) and UTF-8 byte count
    n_bytes (n, k), gold (n,): {bpb: the gold continuation's bits per byte, -ll_gold / (bytes_gold ln 2);
    p_gold: the gold option's probability among the options, softmax(ll)[gold]; margin: ll_gold minus the best
    distractor's ll, in nats}, float64 arrays. With one option (a language-modelling item) only bpb is defined;
    p_gold and margin are NaN."""
    ll, n_bytes = np.asarray(ll, dtype=np.float64), np.asarray(n_bytes, dtype=np.float64)
    rows, gold = np.arange(len(ll)), np.asarray(gold, dtype=np.int64)
    ll_gold = ll[rows, gold]
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty gold continuation (0 bytes): NaN
        bpb = -ll_gold / (n_bytes[rows, gold] * math.log(2))
    if ll.shape[1] < 2:
        return {"bpb": bpb, "p_gold": np.full_like(bpb, np.nan), "margin": np.full_like(bpb, np.nan)}
    top = ll.max(1)
    p_gold = np.exp(ll_gold - (top + np.log(np.exp(ll - top[:, None]).sum(1))))
    distractors = ll.copy()
    distractors[rows, gold] = -np.inf
    return {"bpb": bpb, "p_gold": p_gold, "margin": ll_gold - distractors.max(1)}
