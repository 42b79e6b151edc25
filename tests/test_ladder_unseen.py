"""The truths a ladder report's printed coverage is the worst over (stats/ladder_unseen.py): a bend in one arm's law
alone, as large as the ladder's own data show it."""
from stats import ladder_fit, scaling
from stats.ladder_noise import cpu_ladder, truth_of
from stats.ladder_unseen import bend_perturbations, second_term

ARMS = ("gelu", "aglu", "relu2")


def ladder(relu2_bend, seed):
    """A ladder drawn at `seed` from the CPU ladder's truth (multipliers 1, 0.958, 0.892, the horizon design) with
    relu2's law bent by `relu2_bend` (second_term's amplitude)."""
    truth = second_term(cpu_ladder((1.0, 0.958, 0.892), (1.0, 1.0, 1.0), "horizon", 6), (0.0, 0.0, relu2_bend))
    losses = truth.draw(1, seed)[0]
    return {arm: {c: dict(enumerate(losses[a, s])) for s, c in enumerate(truth.compute)}
            for a, arm in enumerate(ARMS)}


def test_printed_coverage_says_when_one_arms_law_bends():
    """relu2's law falling faster than its fit by a second power term at half gelu's exponent, as large as gelu's
    first term at the largest rung (the headline's real coverage 0.48; the residual chi^2 test sees it in half the
    ladders; BENCHMARKS.md, "A bend in one arm's law alone"): the report prints coverage below 0.90 and names relu2's
    own bend as the worst truth (so on 15 of 16 seeds; the set without it printed 0.90 on this one). The same noise
    without the bend: relu2's estimate lies within one standard error of 0, so bend_perturbations (the report's)
    plants no bend of relu2's (as in about two ladders of three)."""
    bent = ladder_fit.fit_ladder(ladder(-1.0, 7), "gelu", n_sims=20, lr_design=(None, 6))["calibration"]
    assert bent["coverage"]["rate"] < 0.9, bent["worst"]
    assert "relu2's law alone, -" in bent["worst"]["coverage"], bent["worst"]
    arms, log_c, losses, seeds = scaling.check_ladder(ladder(0.0, 7), "gelu")
    est = scaling.estimate(losses[None], log_c, forms=("trend",), report=False)
    clean = bend_perturbations(truth_of(est, 0, log_c, "trend", len(seeds)), est, log_c, "trend", arms)
    assert not any("relu2's law alone" in name for name in clean), list(clean)
