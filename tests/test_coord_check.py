"""bench/coord_check.py: under completep every block's mean |x| after 10 steps stays within 2x across widths 32-256
and depths 2-16 (blocks at one relative depth); under sp, the same check fails the bound."""
import pytest

from bench import coord_check


@pytest.mark.long
def test_completep_coordinates_stay_within_2x_and_sp_ones_do_not():
    spreads = {param: coord_check.check(param)["spread"]["act"] for param in ("completep", "sp")}
    assert coord_check.WIDTHS == (32, 64, 128, 256) and coord_check.DEPTHS == (2, 4, 8, 16)
    assert spreads["completep"] < 2 < spreads["sp"], spreads
