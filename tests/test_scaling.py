"""analysis/scaling.py and analysis/lr_grid.py: fits that recover known curves, multipliers equal to their analytic
values, bootstrap intervals that cover at their nominal rate, the lr picker's rule and edge flag, one-line errors."""
import json
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from analysis import lr_grid, scaling
from analysis.scaling_plot import plot_scaling
from errors import ConfigError
from eval.stats import paired

COMPUTE = np.geomspace(1e15, 1e17, 5)


def ladder_of(curves, compute=COMPUTE, seeds=3, noise=0.0, rng=None):
    """{arm: {C: {seed: E + A C^-alpha + noise}}} from {arm: (E, A, alpha)}."""
    rng = rng or np.random.default_rng(0)
    return {arm: {float(c): {s: float(e + a * c ** -alpha + noise * rng.standard_normal()) for s in range(seeds)}
                  for c in compute} for arm, (e, a, alpha) in curves.items()}


def test_fit_recovers_known_curve_from_noisy_seeds():
    truth = (2.5, 300.0, 0.15)  # ~4.0 nats at 1e15 FLOPs, 3.3 at 1e17
    ladder = ladder_of({"gelu": truth}, compute=np.geomspace(1e15, 1e18, 7), seeds=5, noise=0.002)
    fit = scaling.fit_ladder(ladder, "gelu", n_resamples=30)["arms"]["gelu"]
    assert fit["E"] == pytest.approx(truth[0], abs=0.03)
    assert fit["alpha"] == pytest.approx(truth[2], rel=0.04)
    assert fit["A"] * 1e16 ** -fit["alpha"] == pytest.approx(truth[1] * 1e16 ** -truth[2], rel=0.02)
    assert fit["alpha_ci"][0] <= fit["alpha"] <= fit["alpha_ci"][1]


@pytest.mark.parametrize("sizes,form", [(5, "saturating"), (3, "power_law")])
def test_multiplier_of_scaled_curve_is_k_to_minus_one_over_alpha(sizes, form):
    # same E and alpha, A_x = k A_base: L_x(C) = L_base(k^(-1/alpha) C), at every C
    k, alpha = 0.9, 0.15
    e = 2.5 if form == "saturating" else 0.0
    ladder = ladder_of({"gelu": (e, 300.0, alpha), "swiglu": (e, k * 300.0, alpha)}, COMPUTE[:sizes])
    result = scaling.fit_ladder(ladder, "gelu", n_resamples=10,
                                throughput={"ratio": {"swiglu": 0.8}, "source": "a bench run"})
    m = result["multipliers"]["swiglu"]
    assert result["form"] == form
    for row in [*m["at_sizes"], m["target"]]:
        assert row["multiplier"] == pytest.approx(k ** (-1 / alpha), rel=1e-4)
    assert m["at_sizes"][0]["wall_clock"] == pytest.approx(0.8 * k ** (-1 / alpha), rel=1e-4)
    assert m["trend"]["slope"] == pytest.approx(0.0, abs=1e-4)
    assert any("a bench run" in s for s in result["sentences"])
    json.dumps(result, allow_nan=False)  # sweep.json holds plain numbers


def test_bootstrap_pairs_seeds_across_arms():
    # a seed's offset shared by both arms at every size moves E_base and E_x alike, which leaves L_x - E_base and
    # so the multiplier unchanged: resampled paired, its interval has no width; resampled per arm, it would
    offsets = [0.0, 0.05, -0.04, 0.08]
    ladder = ladder_of({"gelu": (2.5, 300.0, 0.15), "swiglu": (2.5, 280.0, 0.15)}, seeds=len(offsets))
    for points in ladder.values():
        for losses in points.values():
            for s in losses:
                losses[s] += offsets[s]
    row = scaling.fit_ladder(ladder, "gelu", n_resamples=20)["multipliers"]["swiglu"]["at_sizes"][2]
    assert row["ci"][1] - row["ci"][0] < 1e-4 * row["multiplier"]


def test_trend_of_power_laws_with_different_exponents():
    # L = A C^-a: log m = (a_x / a_base - 1) log C + const, so the slope is a_x / a_base - 1 exactly
    ladder = ladder_of({"gelu": (0.0, 30.0, 0.10), "relu2": (0.0, 30.0, 0.11)}, COMPUTE[:3], seeds=4, noise=1e-4)
    trend = scaling.fit_ladder(ladder, "gelu", n_resamples=50, target=None)["multipliers"]["relu2"]["trend"]
    assert trend["slope"] == pytest.approx(0.1, rel=0.05)
    assert trend["verdict"] == "grows"


def test_multiplier_below_baseline_floor_is_infinite():
    ladder = ladder_of({"gelu": (2.5, 300.0, 0.15), "x": (2.0, 300.0, 0.15)})
    result = scaling.fit_ladder(ladder, "gelu", n_resamples=10)
    assert result["multipliers"]["x"]["target"]["multiplier"] is None
    assert any("infinitely many times" in s for s in result["sentences"])


def test_bootstrap_interval_covers_truth_at_nominal_rate():
    # 200 noisy 3-size ladders (power-law form: cheap, vectorised fits); the 90% interval of the multiplier should
    # cover the truth ~88% of the time: a percentile bootstrap over n seeds covers like z sqrt((n-1)/n)
    rng, seeds, level, sims = np.random.default_rng(1), 10, 0.9, 200
    k, alpha = 0.9, 0.1
    hits = 0
    for i in range(sims):
        ladder = ladder_of({"base": (0.0, 30.0, alpha), "x": (0.0, k * 30.0, alpha)}, COMPUTE[:3], seeds, 0.01, rng)
        result = scaling.fit_ladder(ladder, "base", target=None, n_resamples=200, confidence=level, rng=i)
        low, high = result["multipliers"]["x"]["at_sizes"][1]["ci"]
        hits += low <= k ** (-1 / alpha) <= high
    expected = 2 * norm.cdf(norm.ppf((1 + level) / 2) * np.sqrt((seeds - 1) / seeds)) - 1
    assert binomtest(hits, sims, expected).pvalue > 1e-3, hits / sims


def test_target_is_model_py_flops_for_gpt2_124m_at_10b_tokens():
    torch = pytest.importorskip("torch")
    from model import GPT, GPTConfig
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768), seed=0)
    assert scaling.GPT2_124M_10B[1] == model.flops_per_token(1024) * 19_073 * 2 ** 19


def test_analysis_of_scaling_imports_no_torch():
    code = ("import sys, analysis.scaling, analysis.lr_grid; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_figure_is_written(tmp_path):
    ladder = ladder_of({"gelu": (2.5, 300.0, 0.15), "swiglu": (2.5, 280.0, 0.15)}, noise=0.003)
    out = plot_scaling(scaling.fit_ladder(ladder, "gelu", n_resamples=10), tmp_path / "scaling.png")
    assert out.stat().st_size > 10_000


def grid_of(losses_by_lr, seeds=(1, 2, 3)):
    """{lr: {seed: loss}} with seed s's loss offset by 0.01 s (a shared seed effect)."""
    return {lr: {s: loss + 0.01 * s for s in seeds} for lr, loss in losses_by_lr.items()}


def test_lr_picker_picks_lowest_mean_and_interpolates_the_parabola():
    lrs = [1.5e-4, 3e-4, 6e-4, 1.2e-3, 2.4e-3]
    optimum = 5e-4  # a parabola in log lr: the vertex between grid points is found exactly
    p = lr_grid.pick("gelu", grid_of({lr: 3.0 + (np.log(lr / optimum)) ** 2 for lr in lrs}))
    assert p["best_lr"] == 6e-4 and p["edge"] is None
    assert p["interpolated_lr"] == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("best,edge", [(0, "low"), (-1, "high")])
def test_lr_picker_flags_an_optimum_at_the_grid_edge(best, edge):
    lrs = [3e-4, 6e-4, 1.2e-3]
    losses = {lr: 3.0 + 0.1 * i for i, lr in enumerate(lrs[::1 if edge == "low" else -1])}
    result = lr_grid.compare({"gelu": grid_of(losses)}, "gelu")
    assert result["picks"]["gelu"]["edge"] == edge and result["best_lr"]["gelu"] == lrs[best]
    assert result["picks"]["gelu"]["interpolated_lr"] is None
    assert f"extend the grid {'down' if edge == 'low' else 'up'}ward" in result["sentences"][0]


def test_lr_picker_counts_a_diverged_seed_as_worst():
    grid = grid_of({3e-4: 3.2, 6e-4: 3.1, 1.2e-3: 3.0})
    grid[1.2e-3][2] = float("nan")
    assert lr_grid.pick("gelu", grid)["best_lr"] == 6e-4


def test_arms_compared_at_their_best_and_at_the_baseline_lr():
    base = grid_of({3e-4: 3.2, 6e-4: 3.1, 1.2e-3: 3.3})
    other = {lr: {s: v - 0.05 + 0.002 * s * s for s, v in seeds.items()} for lr, seeds in
             grid_of({6e-4: 3.2, 1.2e-3: 3.0, 2.4e-3: 3.1}).items()}
    result = lr_grid.compare({"gelu": base, "swiglu": other}, "gelu")
    pair = result["paired"]["swiglu"]
    assert result["best_lr"] == {"gelu": 6e-4, "swiglu": 1.2e-3}
    assert pair["at_best"] == paired(base[6e-4], other[1.2e-3])
    assert pair["at_baseline_lr"] == paired(base[6e-4], other[6e-4])


@pytest.mark.parametrize("grid,says", [
    ({0.0: {1: 3.0}, 1e-3: {1: 3.0}}, "not positive"),
    ({1e-3: {1: 3.0}}, "grid of one learning rate"),
    ({1e-4: {1: 3.0}, 2e-4: {1: 3.0}, 1e-3: {1: 3.0}}, "not log-spaced"),
    ({1e-4: {1: 3.0, 2: 3.1}, 2e-4: {1: 3.0}}, "no loss for seed 2"),
])
def test_lr_grid_errors_are_one_line(grid, says):
    with pytest.raises(ConfigError, match=says) as e:
        lr_grid.pick("gelu", grid)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("ladder,kwargs,says", [
    ({"gelu": {1e15: {1: 4.0}}}, {}, "a ladder of 1 size"),
    ({"gelu": {0.0: {1: 4.0}, 1e16: {1: 3.0}}}, {}, "not positive"),
    ({"gelu": {1e15: {1: 4.0, 2: 4.1}, 1e16: {1: 3.0}}}, {}, "same seeds"),
    ({"gelu": {1e15: {1: 4.0}, 1e16: {1: float("nan")}}}, {}, "diverged"),
    ({"gelu": {1e15: {1: 4.0}, 1e16: {1: 3.0}}}, {"irreducible": 3.0}, "not below every ladder loss"),
    ({"gelu": {1e15: {1: 4.0}, 1e16: {1: 3.0}}}, {"baseline": "relu"}, "baseline 'relu' has no ladder"),
])
def test_ladder_errors_are_one_line(ladder, kwargs, says):
    with pytest.raises(ConfigError, match=says) as e:
        scaling.fit_ladder(ladder, kwargs.pop("baseline", "gelu"), n_resamples=10, **kwargs)
    assert "\n" not in str(e.value)
