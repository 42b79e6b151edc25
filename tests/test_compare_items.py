"""Two models on the same HellaSwag items (eval/compare_items.py, stats/significance.py): the exact McNemar p-value
equals exact binomial tail sums, the paired interval a published example, the item-level interval its hand formula,
and files that do not hold the same items are refused with a clear error."""
import math
from fractions import Fraction

import pytest

from eval import compare_items, hellaswag_items
from eval.hellaswag_items import ItemsError
from stats import significance


def exact_p(only_a, only_b):
    """2 P(X <= min) for X ~ Binomial(only_a + only_b, 1/2), in exact fractions from math.comb, capped at 1."""
    n = only_a + only_b
    tail = Fraction(sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)), 2 ** n)
    return float(min(Fraction(1), 2 * tail))


@pytest.mark.parametrize("only_a, only_b, by_hand", [
    (0, 5, 2 / 32),  # 2 * (1/2)^5
    (1, 9, 2 * 11 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
    (9, 1, 2 * 11 / 1024),  # symmetric
    (3, 3, 1.0),  # 2 * P(X <= 3) > 1: capped
    (0, 0, 1.0),  # no discordant item: no evidence either way
])
def test_mcnemar_exact_by_hand(only_a, only_b, by_hand):
    assert significance.mcnemar_exact(only_a, only_b) == pytest.approx(by_hand, rel=1e-15)


@pytest.mark.parametrize("only_a, only_b", [(6, 16), (40, 70), (1250, 1340), (0, 10042)])
def test_mcnemar_exact_equals_exact_tail_sums(only_a, only_b):
    """Thousands of discordant items, and a full HellaSwag of them, where 2^-n underflows a float."""
    assert significance.mcnemar_exact(only_a, only_b) == pytest.approx(exact_p(only_a, only_b), rel=1e-12)


def test_paired_interval_equals_a_published_example():
    """Cavo et al. 2012 (complete response before/after consolidation therapy, 161 patients: 59 both, 6 before
    only, 16 after only, 80 neither) in Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables,
    ch. 8: Newcombe square-and-add, estimate -0.0621, 95% CI -0.1186 to -0.0046."""
    lo, hi = significance.paired_difference_ci(59, 6, 16, 80)
    assert (round(lo, 4), round(hi, 4)) == (-0.1186, -0.0046)


def test_paired_interval_by_hand_and_at_the_edges():
    # no correlation term (both * neither - only_a * only_b within [0, n/2]): the two Wilson half-widths squared-added
    both, only_a, only_b, neither = 10, 10, 10, 10
    (l1, u1), (l2, u2) = significance.wilson(20, 40), significance.wilson(20, 40)
    half = math.hypot(0.5 - l1, u2 - 0.5)
    assert significance.paired_difference_ci(both, only_a, only_b, neither) == pytest.approx([-half, half], rel=1e-12)
    # at 10,042 items and hundreds of discordant ones it agrees with the Wald interval of paired proportions
    b, c, n = 700, 600, 10042
    wald = 1.959963984540054 * math.sqrt(b + c - (b - c) ** 2 / n) / n
    lo, hi = significance.paired_difference_ci(3000 - b, b, c, n - 3000 - c)
    assert lo == pytest.approx((b - c) / n - wald, abs=2e-4) and hi == pytest.approx((b - c) / n + wald, abs=2e-4)
    # every item right for A only: inside [-1, 1], the Wald interval would be [1, 1]
    lo, hi = significance.paired_difference_ci(0, 30, 0, 0)
    assert 0 < lo < hi <= 1


def test_item_level_interval_by_hand():
    diffs = [1, 0, 0, -1, 1, 1, 0, 0.5, -0.5, 0]  # per item: right(A) - right(B), averaged over 2 seeds
    got = significance.item_level(diffs)
    mean = sum(diffs) / 10
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 9)
    assert got["items"] == 10 and got["mean"] == pytest.approx(0.2)
    assert got["ci95"] == pytest.approx([mean - 1.959963984540054 * sd / math.sqrt(10),
                                         mean + 1.959963984540054 * sd / math.sqrt(10)], rel=1e-12)
    # two-sided normal p of mean / se, from the error function: 1 - erf(|z| / sqrt 2)
    assert got["p"] == pytest.approx(1 - math.erf(mean / (sd / math.sqrt(10)) / math.sqrt(2)), rel=1e-12)
    assert significance.item_level([0.5, 0.5])["p"] == 0.0 and significance.item_level([0, 0])["p"] == 1.0  # no spread


def test_compare_two_files(tmp_path, capsys, write_items):
    labels = [0, 1, 2, 3] * 10
    right = lambda pattern: [label if r else (label + 1) % 4 for label, r in zip(labels, pattern)]
    a_right = [True] * 25 + [False] * 15  # A: 25 of 40
    b_right = [True] * 15 + [False] * 10 + [True] * 3 + [False] * 12  # B: 18; A only: 10 items, B only: 3
    a = write_items(tmp_path / "hellaswag_items_00005.jsonl.gz", labels, right(a_right))
    b = write_items(tmp_path / "b.jsonl.gz", labels, right(b_right))
    rows = compare_items.main([str(tmp_path), str(b), "--metric", "acc_norm"])  # a run directory: its newest file
    assert len(rows) == 1
    r = rows[0]
    assert (r["acc_a"], r["acc_b"], r["diff"]) == (25 / 40, 18 / 40, 7 / 40)
    assert (r["only_a"], r["only_b"], r["discordant"]) == (10, 3, 13)
    assert r["p_mcnemar"] == pytest.approx(exact_p(10, 3))
    assert r["ci95"] == significance.paired_difference_ci(15, 10, 3, 12)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"A: {a} (step 5)"
    assert "| completion | acc_norm | 62.50 | 45.00 | +17.50 |" in out and "| 13: 10 / 3 |" in out
    assert "another sample of items" in out
    assert [(r["scoring"], r["metric"]) for r in compare_items.main([str(a), str(b)])] == [
        ("completion", "acc"), ("completion", "acc_norm")]


def test_files_of_other_items_are_refused(tmp_path, write_items):
    labels = [0, 1, 2, 3] * 5
    a = write_items(tmp_path / "a.jsonl.gz", labels, labels)
    fewer = write_items(tmp_path / "fewer.jsonl.gz", labels[:12], labels[:12])
    relabelled = write_items(tmp_path / "relabelled.jsonl.gz", labels[::-1], labels)
    lm_eval_only = write_items(tmp_path / "lm.jsonl.gz", labels, labels, scorings=("lm_eval",))
    for other, message in [(fewer, "has 20 items, .* 12; they differ in 8 .*the same data file and --limit"),
                           (relabelled, "disagree on the label of 20 items \\(e.g. item 0: 0 vs 3\\)"),
                           (lm_eval_only, "no scoring in common .*has completion, .*has lm_eval")]:
        with pytest.raises(SystemExit, match=message):
            compare_items.main([str(a), str(other)])
    with pytest.raises(SystemExit, match="no hellaswag_items_\\*.jsonl.gz here"):
        compare_items.main([str(tmp_path), str(a)])
    (tmp_path / "bad.jsonl").write_text('{"ctx": "not an items file"}\n')
    with pytest.raises(ItemsError, match="bad.jsonl:1: neither a nanoact-hellaswag-items header nor an lm-eval"):
        hellaswag_items.read(tmp_path / "bad.jsonl")


def test_newest_prefers_the_latest_step_and_every_item(tmp_path):
    for name in ("hellaswag_items_00010.jsonl.gz", "hellaswag_items_00300_limit50.jsonl.gz", "hellaswag_items_x.jsonl.gz",
                 "hellaswag_items_00300.jsonl.gz", "hellaswag_items_00300_limit500.jsonl.gz"):
        (tmp_path / name).write_bytes(b"")
    assert hellaswag_items.newest(tmp_path).name == "hellaswag_items_00300.jsonl.gz"
    (tmp_path / "hellaswag_items_00300.jsonl.gz").unlink()
    assert hellaswag_items.newest(tmp_path).name == "hellaswag_items_00300_limit500.jsonl.gz"
