"""The sweep report's downstream part (analysis/downstream.py): the two-way interval equals the ANOVA by hand and
covers the truth at 95% ± 2% on simulated seeds and items; the report shows every declared downstream metric's
difference and each metric's signal-to-noise."""
import json
import math
import re
import statistics

import numpy as np
import pytest
from scipy.stats import t as student

from analysis import downstream, sweep_report
from bench.downstream_coverage import coverage
from eval import hellaswag_items
from eval.hellaswag_in_loop import ACC, ACC_NORM, BPB
from training.runlog import RunLog


def test_two_way_interval_equals_the_anova_by_hand():
    d = [[0.3, -0.1, 0.5, 0.2, 0.0], [0.1, 0.0, 0.2, -0.3, 0.4], [0.6, 0.2, 0.3, 0.1, 0.5]]
    base = {s: {i: 1.0 for i in range(5)} for s in range(3)}
    other = {s: {i: 1.0 + d[s][i] for i in range(5)} for s in range(3)}
    got = downstream.paired_seeds_items(base, other)
    grand = statistics.fmean(x for row in d for x in row)
    seed_means = [statistics.fmean(row) for row in d]
    item_means = [statistics.fmean(d[s][i] for s in range(3)) for i in range(5)]
    ms_seed = 5 * sum((m - grand) ** 2 for m in seed_means) / 2
    ms_item = 3 * sum((m - grand) ** 2 for m in item_means) / 4
    ms_resid = sum((d[s][i] - seed_means[s] - item_means[i] + grand) ** 2 for s in range(3) for i in range(5)) / 8
    assert min(ms_seed, ms_item) > ms_resid  # the unbiased three-term estimate applies
    var = (ms_seed + ms_item - ms_resid) / 15
    df = (ms_seed + ms_item - ms_resid) ** 2 / (ms_seed ** 2 / 2 + ms_item ** 2 / 4 + ms_resid ** 2 / 8)
    q = student.ppf(0.975, df)
    assert got["mean"] == pytest.approx(grand) and got["se"] == pytest.approx(math.sqrt(var))
    assert got["df"] == pytest.approx(df)
    assert got["ci95"] == pytest.approx([grand - q * math.sqrt(var), grand + q * math.sqrt(var)])
    assert got["detectable"] == pytest.approx((q + student.ppf(0.8, df)) * math.sqrt(var))
    assert downstream.paired_seeds_items({0: base[0]}, {0: other[0]}) is None  # one seed: no seed noise seen


@pytest.mark.parametrize("case", ["continuous, seeds dominate", "binary, seeds dominate"])
def test_interval_covers_the_truth_at_95_percent(case):
    """Through paired_seeds_items, the function the report prints from (bench/downstream_coverage.py: every case
    at 2,000 sweeps)."""
    hits, n, _ = coverage(case, 400, 4, 100, np.random.default_rng(1), truth_draws=200_000)
    assert 0.93 <= hits / n <= 0.97, hits / n


def items_run(path, act, seed, right, bpb, core_tasks=None):
    """A finished run declaring HellaSwag acc, acc_norm and bits/byte, with its final items file (and CORE's
    per-task numbers in its final eval record, eval/core_in_loop.py's `core_tasks`)."""
    log = RunLog(path)
    log.write_run_info({"model": {"act": act}, "optim": {"max_steps": 10}, "run": {"seed": seed}}, {},
                       metrics=[m.record() for m in (ACC, ACC_NORM, BPB)])
    for step in (0, 5, 10):
        acc = float(np.mean(right))
        log.record(step, kind="eval", val_loss=3.5 - seed / 100, hellaswag_acc=acc, hellaswag_acc_norm=acc,
                   hellaswag_bpb=float(np.mean(bpb)), **({"core_tasks": core_tasks} if step == 10 else {}))
        log.scalar(step, "val", 3.5)
    log.close()
    records = [{"i": i, "label": 0, "completion": hellaswag_items.scoring_record(
        [0.0, -1.0, -1.0, -1.0] if r else [-1.0, 0.0, -1.0, -1.0], [1.0] * 4, continuous={"bpb": b})}
        for i, (r, b) in enumerate(zip(right, bpb))]
    hellaswag_items.write(hellaswag_items.run_items_file(path, 10), {
        "n": len(right), "scorings": ["completion"], "scored_by": hellaswag_items.TRAINING, "step": 10}, records)


def test_report_gives_each_downstream_metric_and_the_signal_to_noise(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_report, "plot_sweep", lambda *args, **kwargs: None)
    rng = np.random.default_rng(0)
    values = {}
    for act, shift in (("gelu", 0.0), ("relu", -0.05)):
        for seed in (1, 2, 3):
            right = rng.random(30) < 0.3
            bpb = 1.5 + shift + 0.01 * seed + rng.normal(0, 0.1, 30)
            values[(act, seed)] = (right.astype(float), bpb)
            core = {"arc": {"acc": 0.25 + 0.01 * seed, "centered": 0.0, "bpb": 2.0 + shift + 0.002 * seed},
                    "lambada": {"acc": 0.1 * (seed % 2), "bpb": 3.0 + 0.01 * seed}}
            items_run(tmp_path / f"{act}_seed{seed}", act, seed, right.tolist(), bpb.tolist(), core)
    text = sweep_report.report(tmp_path, acts=["gelu", "relu"])
    result = json.loads((tmp_path / "sweep.json").read_text())["downstream"]
    for metric, k in (("hellaswag_acc", 0), ("hellaswag_bpb", 1)):
        base = {s: dict(enumerate(values[("gelu", s)][k])) for s in (1, 2, 3)}
        other = {s: dict(enumerate(values[("relu", s)][k])) for s in (1, 2, 3)}
        assert result["paired"]["relu"][metric] == pytest.approx(downstream.paired_seeds_items(base, other))
    assert set(result["paired"]["relu"]) == {"hellaswag_acc", "hellaswag_acc_norm", "hellaswag_bpb"}
    snr = {row["metric"]: row for row in result["snr"]}
    means = [statistics.fmean(float(np.mean(values[(a, s)][1])) for s in (1, 2, 3)) for a in ("gelu", "relu")]
    sd = math.sqrt(statistics.fmean(statistics.variance(float(np.mean(values[(a, s)][1])) for s in (1, 2, 3))
                                    for a in ("gelu", "relu")))
    assert snr["hellaswag_bpb"]["snr"] == pytest.approx(abs(means[0] - means[1]) / sd)
    assert {"final_val", "hellaswag_acc", "hellaswag_acc_norm"} <= set(snr)
    assert re.search(r"\| relu - gelu \| HellaSwag gold bits/byte +\| 3 +\| 30 +\|", text)
    assert "Signal-to-noise per metric" in text
    # CORE per task: the spread of the arms' means over the seed sd pooled over arms (arc's bpb: 0.05 / 0.002)
    tasks = {row["task"]: row for row in result["core_tasks_snr"]}
    assert tasks["arc"]["bpb"][2] == pytest.approx(25.0) and tasks["arc"]["acc"][2] == pytest.approx(0.0, abs=1e-9)
    assert tasks["lambada"]["bpb"][2] == pytest.approx(0.0, abs=1e-9)
    assert re.search(r"\| arc +\| 0\.01 +\| 0\.00 +\| 0\.002 +\| 25\.00 +\|", text)
