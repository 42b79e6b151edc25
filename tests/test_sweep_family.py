"""Many pairs, one error rate (analysis/sweep_report.py): Holm's adjustment equals a hand computation, and sweeps
simulated under the null show that the A/A verdict and "any pair declared different" keep the stated family-wise
error rate, where the old rule (any 95% interval excluding 0) does not."""
import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from analysis import sweep_report
from analysis.sweep_report import ALPHA
from stats import significance
from stats.family import holm
from test_sweep import fake_run

SWEEPS, SEEDS = 2000, 3
# the most false alarms in SWEEPS sweeps that a rate of ALPHA gives, but for a 1-in-10,000 fluke
BOUND = binom.ppf(1 - 1e-4, SWEEPS, ALPHA) / SWEEPS


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; made non-decreasing: 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert holm([0.5, 0.7]) == pytest.approx([1.0, 1.0]) and holm([0.2]) == pytest.approx([0.2])
    rows = holm([[0.01, 0.04, 0.03, 0.005], [0.04, 0.01, 0.005, 0.03]])  # one family per row
    assert rows == pytest.approx(np.array([[0.03, 0.06, 0.06, 0.02], [0.06, 0.03, 0.02, 0.06]]), rel=1e-12)


def null_sweeps(rng, claims):
    """(p of each claim's paired t-test, old rule's "its 95% interval excludes 0") for SWEEPS sweeps of SEEDS
    seeds where no claim is true: paired differences drawn from N(0, 1)."""
    diffs = rng.standard_normal((SWEEPS, claims, SEEDS))
    mean, se = diffs.mean(-1), diffs.std(-1, ddof=1) / math.sqrt(SEEDS)
    p = significance.t_pvalue(mean / se, SEEDS - 1)
    one = significance.paired(dict(enumerate([0.0] * SEEDS)), dict(enumerate(diffs[0, 0])))
    assert one["p"] == pytest.approx(p[0, 0], rel=1e-9)  # the report's paired() gives the same p
    return p, np.abs(mean) > significance.t_quantile(SEEDS - 1) * se


def test_control_verdict_false_alarm_rate_under_the_null():
    """An A/A control with four metrics (the translation sweep's final dev loss, valid BLEU, test BLEU greedy and
    beam) whose differences are pure noise: the sweep is called unreliable at most ALPHA of the time."""
    p, excludes_zero = null_sweeps(np.random.default_rng(0), 4)
    false_alarms = (holm(p) < ALPHA).any(-1).mean()
    old_rule = excludes_zero.any(-1).mean()
    assert false_alarms <= BOUND < old_rule, (false_alarms, BOUND, old_rule)  # old rule: 1 - 0.95^4 = 19%


def test_any_pair_declared_different_under_the_null():
    """Nine pairs (configs/sweep_gpt2_glu.toml's arms against their baselines), each on the final val loss and on
    HellaSwag, none truly different. The HellaSwag claim's p is the larger of the per-seed and the item-level p
    (sweep_report.claim_p); the worst case is an item-level interval that always excludes 0 (two trained models
    always differ on the items), where the per-seed p alone decides: simulated here."""
    p, excludes_zero = null_sweeps(np.random.default_rng(1), 18)
    declared = (holm(p) < ALPHA).any(-1).mean()
    old_rule = excludes_zero.any(-1).mean()
    assert declared <= BOUND < old_rule, (declared, BOUND, old_rule)  # old rule: 1 - 0.95^18 = 60%


def test_one_raw_false_alarm_among_the_controls_metrics_is_not_unreliable(tmp_path):
    """The control's final val loss interval excludes 0 (p 0.029) while its HellaSwag does not move (p 1): Holm
    over its two metrics gives 0.057, so the sweep stands; each pair's p and Holm p are in sweep.md and sweep.json."""
    gelu = {1: 3.5, 2: 3.6, 3: 3.4}
    for s, v in gelu.items():
        fake_run(tmp_path / f"gelu_seed{s}", "gelu", s, v, hella=0.25 + s / 100)
        fake_run(tmp_path / f"gelu_aa_seed{s}", "gelu", s, v + 0.02 + (s - 2) * 0.006,
                 hella=0.25 + s / 100 + (0.01, -0.01, 0.0)[s - 1], offset=1_000_000)
    (tmp_path / "sweep_plan.json").write_text(json.dumps({"acts": ["gelu", "gelu_aa"], "baseline": "gelu",
                                                          "control": "gelu_aa", "variants": {
        "gelu": ["--act", "gelu"], "gelu_aa": ["--act", "gelu", "--init-seed-offset", "1000000"]}}))
    text = sweep_report.report(tmp_path)
    result = json.loads((tmp_path / "sweep.json").read_text())
    final, hella = result["paired"]["gelu_aa"]["final_val"], result["paired"]["gelu_aa"]["hellaswag_acc_norm"]
    t = 0.02 / (0.006 / math.sqrt(3))
    assert final["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9) == pytest.approx(0.0287, abs=1e-4)
    assert final["ci95"][0] > 0 and hella["p"] == pytest.approx(1.0)  # the old rule: "unreliable"
    assert final["p_holm"] == pytest.approx(2 * final["p"], rel=1e-12) and hella["p_holm"] == pytest.approx(1.0)
    assert result["control_reliable"] is True and result["alpha"] == ALPHA
    assert "no metric differs from 0 (at family-wise error rate 0.05, Holm over its 2 metrics" in text
    row = next(line for line in text.splitlines() if line.startswith("| gelu_aa - gelu") and "final val" in line)
    assert f"| {final['p']:.3g} | {final['p_holm']:.3g} |" in row
