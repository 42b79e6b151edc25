"""bench/lr_transfer.py: a cell's optimum is the fitted vertex in log2 lr, an optimum at the grid's edge is flagged
(its drift then a lower bound), and the drift is the largest over the smallest optimum along an axis."""
import math

import pytest

from bench import lr_transfer
from errors import ConfigError

LRS = [1e-3 * 2 ** i for i in range(6)]


def curve(best):
    return {lr: 2.5 + 0.1 * math.log2(lr / best) ** 2 for lr in LRS}


def test_the_vertex_lies_between_grid_points():
    assert math.isclose(lr_transfer.optimum(curve(5.5e-3))["lr"], 5.5e-3, rel_tol=1e-6)


def test_a_minimum_at_the_grid_edge_is_flagged_not_fitted():
    high, low = lr_transfer.optimum(curve(1e-1)), lr_transfer.optimum(curve(1e-4))
    assert (high["lr"], high["edge"]) == (LRS[-1], "high") and (low["lr"], low["edge"]) == (LRS[0], "low")


def test_a_diverged_point_counts_as_the_worst():
    grid = {**curve(1e-2), LRS[-1]: math.inf}
    found = lr_transfer.optimum(grid)
    assert found["edge"] is None and LRS[2] < found["lr"] < LRS[-1]


def test_smoke_recovers_known_optima_and_drift():
    _, result = lr_transfer.smoke()
    assert result["drift"]["depth"][("gelu", "sp")]["bound"]  # d2's optimum lies beyond the grid's top


def test_too_few_lrs_is_a_clear_error():
    with pytest.raises(ConfigError, match="at least 3"):
        lr_transfer.optimum({1e-3: 2.0, 2e-3: 1.9})
