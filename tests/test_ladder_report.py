"""The ladder report on ladders the power law cannot describe, and the tuning audit as a test with an interval
(analysis/ladder_report.py, stats/ladder_fit.py, stats/lr_audit.py): every valid ladder gets its report, an arm
whose lr the audit refutes declares nothing."""
import json

import numpy as np
import pytest

from sweep import cli
from stats import scaling
from test_ladder import SHAPES, curve, ladder_run
from test_sweep import without_plots


def test_a_ladder_drawn_below_zero_loss_is_fitted_not_refused_by_scipy():
    """The calibration draws ladders from a fit with normal noise; one whose lowest mean falls below 0 (a smoke
    test's 3 sizes x 2 seeds at 4-8 steps drew this one) once started least_squares outside its own bounds
    ("Initial guess is outside of provided bounds") and the report was lost."""
    means = np.array([[6.126, 4.569, -0.118], [6.138, 4.594, -0.105]])
    losses = means[None, :, :, None] + np.array([-0.01, 0.01])
    log_c = np.log(np.tile([2.8e8, 1.1e9, 2.5e9], (2, 1)))
    est = scaling.estimate(losses, log_c, forms=("shared",), report=False)
    assert np.isfinite(est["headline"]["value"]).all() and np.isfinite(est["fits"]["shared"]["theta"]).all()


def _ladder(path, loss, seeds=(1, 2, 3)):
    index = 0
    for i, shape in enumerate(SHAPES[:3]):
        for seed in seeds:
            for act in ("gelu", "relu2"):
                index += 1
                ladder_run(path / f"job{index:03d}", act, shape, 3e-3, seed, loss(i, seed, act), 10 ** (i + 4))


@pytest.mark.parametrize("case, loss, seeds, sentence", [
    ("rising", lambda i, seed, act: 3.0 + 0.1 * i + 0.01 * seed, (1, 2, 3),
     "No fit: gelu's mean loss does not fall with compute (3.02, 3.12, 3.22 from"),
    ("flat", lambda i, seed, act: 3.0 + 0.01 * seed * (-1) ** (i + (act == "relu2")), (1, 2, 3),
     "No fit: gelu's mean loss does not fall with compute (3.02, 2.98, 3.02 from"),
    ("one seed", lambda i, seed, act: curve((1.5 if act == "relu2" else 1) * 640 * 10 ** (i + 4)) + 0.01 * (-1) ** i,
     (1,), "One seed (1) at every fitted size: the seed noise cannot be fitted"),
])
def test_a_ladder_the_power_law_cannot_describe_gets_its_tables_and_one_sentence(tmp_path, monkeypatch, case, loss,
                                                                                 seeds, sentence):
    """Losses that rise with size, a flat ladder (once a NoneType format error, or brentq's "f(a) and f(b) must have
    different signs" in the calibration), one seed at every size: the runs and pairs tables, and one sentence."""
    without_plots(monkeypatch)
    _ladder(tmp_path, loss, seeds)
    cli.main(["--report-only", str(tmp_path), "--resamples", "20"])
    text = (tmp_path / "sweep.md").read_text()
    assert text.count(sentence) == 1 and "| size " in text and "## Paired by seed at each size" in text
    fit = json.loads((tmp_path / "sweep.json").read_text())["fit"]
    assert ("not_fitted" in fit) == (case != "one seed")
