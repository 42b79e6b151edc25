"""Ladder sweeps (sweep/plan.py, analysis/ladder_report.py): arms x sizes x seeds x lrs from a plan, resumed
after a crash; the report read from the runs' own run.json, fitted and turned into a compute multiplier."""
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import ladder_points, ladder_report
from analysis.runs import load_run
from sweep import cli, schedule
from sweep import plan as sweep_plan
from stats import scaling
from sweep.plan import run_dir
from errors import ConfigError
from model import GPT, GPTConfig
from test_sweep import launches, without_plots
from training.runlog import RunLog


def ladder_run(path, act, shape, lr, seed, loss, flops_per_token, max_steps=10, tokens_per_step=64, **model):
    """A finished run as the GPT trainer writes it: its config (model: further model options), and eval records with
    their cumulative flops."""
    log = RunLog(path)
    n_layer, n_embd, n_head = shape
    log.write_run_info({"model": {"act": act, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, **model},
                        "optim": {"max_steps": max_steps, "max_lr": lr, "total_batch_size": tokens_per_step},
                        "run": {"seed": seed}}, {"flops_per_token": flops_per_token})
    for step in (0, max_steps):
        tokens = step * tokens_per_step
        log.record(step, kind="eval", val_loss=loss if step else loss + 1, tokens=tokens,
                   flops=tokens * flops_per_token)
    log.close()


def option(cmd, name):
    return cmd[cmd.index(name) + 1]


# best lrs of the fake grid: gelu 2e-3 (inside the grid), relu 4e-3 (its top edge)
BEST = {"gelu": 2e-3, "relu": 4e-3}
PLAN = """config = "configs/gpt2_cpu_tiny.toml"
seeds = [1, 2]
lrs = [1e-3, 2e-3, 4e-3]
lr_size = "a"
[sizes.a]
n_layer = 1
n_embd = 32
n_head = 2
max_steps = 10
[sizes.b]
n_layer = 2
n_embd = 32
n_head = 2
max_steps = 20
[variants.gelu]
act = "gelu"
[variants.relu]
act = "relu"
"""


def test_ladder_plan_runs_every_cell_and_a_half_finished_ladder_resumes(tmp_path, monkeypatch):
    calls = []

    def fake(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        if len(calls) == 5:  # a crash mid-grid
            return subprocess.CompletedProcess(cmd, 1)
        act, lr, seed = option(cmd, "--act"), float(option(cmd, "--max-lr")), int(option(cmd, "--seed"))
        shape = tuple(int(option(cmd, f"--{k}")) for k in ("n-layer", "n-embd", "n-head"))
        loss = 4.0 - shape[0] / 10 + math.log(lr / BEST[act]) ** 2 + seed / 100
        ladder_run(Path(option(cmd, "--out-dir")), act, shape, lr, seed, loss, 1000 * shape[0],
                   int(option(cmd, "--max-steps")))
        return subprocess.CompletedProcess(cmd, 0)

    (tmp_path / "plan.toml").write_text(PLAN)
    launches(monkeypatch, fake)
    argv = ["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--eval-interval", "5",
            "--allow-edge-lr"]
    with pytest.raises(SystemExit, match="relu size a lr 0.002 seed 1 stopped"):
        cli.main(argv)
    first = len(calls)
    cli.main(argv)  # the same command continues: the 4 finished runs are skipped, the crashed one runs again
    runs = [(option(c, "--act"), option(c, "--n-layer"), option(c, "--max-lr"), option(c, "--seed"))
            for c in calls[first:]]
    grid = [(a, "1", f"{lr:g}", str(s)) for s in (1, 2) for a in ("gelu", "relu") for lr in (1e-3, 2e-3, 4e-3)]
    assert runs == grid[4:] + [(a, "2", f"{BEST[a]:g}", str(s)) for s in (1, 2) for a in ("gelu", "relu")]
    last = calls[-1]
    assert option(last, "--min-lr") == "0.0004"  # the config's min_lr / max_lr = 0.1, kept at the picked lr
    assert option(last, "--max-steps") == "20"
    assert last[-2:] == ["--eval-interval", "5"]  # options after the plan reach every run
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert result["best_lr"] == {"gelu": {"L1-d32-h2": 2e-3}, "relu": {"L1-d32-h2": 4e-3}}
    assert result["lr_grid"]["L1-d32-h2"]["picks"]["relu"]["edge"] == "high"
    calls.clear()
    without_plots(monkeypatch)
    cli.main(argv)
    assert calls == []


def moved_optimum_trainer(calls, moved=(("gelu", 1.3), ("relu", 3.0))):
    """A stand-in for the trainer's subprocess: each arm's loss a parabola in log lr about BEST at size a, about
    BEST times its `moved` factor at size b (2 layers), noise-free."""
    moved = dict(moved)

    def fake(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        act, lr, seed = option(cmd, "--act"), float(option(cmd, "--max-lr")), int(option(cmd, "--seed"))
        shape = tuple(int(option(cmd, f"--{k}")) for k in ("n-layer", "n-embd", "n-head"))
        best = BEST[act] * (moved[act] if shape[0] == 2 else 1)
        loss = 4.0 - shape[0] / 10 + math.log(lr / best) ** 2 + seed / 100
        ladder_run(Path(option(cmd, "--out-dir")), act, shape, lr, seed, loss, 1000 * shape[0],
                   param=option(cmd, "--param"), base_width=int(option(cmd, "--base-width")))
        return subprocess.CompletedProcess(cmd, 0)

    return fake


def test_lr_seeds_pick_on_their_own_runs_an_edge_pick_stops_and_the_audit_refutes_an_lr_that_moved(
        tmp_path, monkeypatch):
    """The plan's param reaches every run (grid, sizes, audit); the grid at the smallest size on lr_seeds; relu's pick
    at the grid's top edge stops the plan until --allow-edge-lr; every size then runs on the other seeds, and the
    audit at the largest size (4 lrs around each pick, seed 7) refutes relu's lr, its optimum there 3x its pick
    (beyond the 1.4x tolerance), and not gelu's, 1.3x; relu's comparison there is then not declared."""
    calls = []
    fake = moved_optimum_trainer(calls)
    (tmp_path / "plan.toml").write_text(PLAN.replace('lr_size = "a"', 'lr_seeds = [7]\nparam = "completep"\n'
                                                                       'base_width = 32\nbase_depth = 1'))
    launches(monkeypatch, fake)
    argv = ["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s")]
    with pytest.raises(SystemExit, match="relu's best lr 0.004 at size a is the grid's highest: the optimum may lie "
                                         "outside the grid. Extend lrs upward .* or pass --allow-edge-lr"):
        cli.main(argv)
    assert len(calls) == 6
    cli.main(argv + ["--allow-edge-lr"])
    assert all(option(c, "--param") == "completep" and option(c, "--base-depth") == "1" for c in calls)
    runs = [(option(c, "--act"), option(c, "--n-layer"), option(c, "--max-lr"), option(c, "--seed")) for c in calls]
    grid = [(a, "1", f"{lr:g}", "7") for a in ("gelu", "relu") for lr in (1e-3, 2e-3, 4e-3)]
    audit = [(a, "2", f"{BEST[a] * f:.3g}", "7") for a in ("gelu", "relu") for f in (2 ** -1.5, 2 ** -0.5, 2 ** 0.5,
                                                                                        2 ** 1.5)]
    assert runs == grid + [(a, n, f"{BEST[a]:g}", str(s)) for s in (1, 2) for n in ("1", "2")
                           for a in ("gelu", "relu")] + audit
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    text = (tmp_path / "s" / "sweep.md").read_text()
    assert "gelu: 0.002 at every size (picked on the grid at L1-d32-h2 on seeds 7, compared on the others)" in text
    assert "exploratory" not in json.dumps(result["family"])
    audit = result["audit"]
    assert audit["refuted"] == ["relu"] and audit["arms"]["gelu"]["ratio"] == pytest.approx(1 / 1.3)
    assert audit["arms"]["gelu"]["status"] == "within"
    assert ("Result: the tuning audit at L2-d32-h2 (seeds 7) refutes relu's lr (its optimum 0.012 [0.012, 0.012], "
            "the lr 0.333x it [0.333, 0.333]).") in text
    # relu's comparison at L2 rests on an lr 3x off its optimum there: not declared, out of the Holm family
    assert [c["claim"] for c in result["not_declared"]] == ["relu - gelu at L2-d32-h2"]
    assert [c["claim"] for c in result["family"]] == ["relu - gelu at L1-d32-h2"]

    # rerun_refuted = true: the job after the grid (here, in this process, as the sequential and local launchers
    # run it) goes on after the audit: relu runs b again on the compared seeds at its audited optimum (two sizes: the
    # power of the horizon through a's pick and it is it at b); gelu, within the tolerance, runs nothing more. The
    # report compares relu at b on those runs, says so, and the same audit judges the new lr: within, declared.
    (tmp_path / "rerun.toml").write_text("rerun_refuted = true\n" + (tmp_path / "plan.toml").read_text())
    _, rerun = cli.parse_args(["--plan", str(tmp_path / "rerun.toml"), "--out-dir", str(tmp_path / "s"),
                               "--allow-edge-lr"])
    calls.clear()
    schedule.AfterGrid(rerun, tmp_path / "s", [], ["a", "b"])()
    optimum = f"{BEST['relu'] * 3:.3g}"
    assert [(option(c, "--act"), option(c, "--n-layer"), option(c, "--max-lr"), option(c, "--seed"))
            for c in calls] == [("relu", "2", optimum, "1"), ("relu", "2", optimum, "2")]
    assert json.loads((tmp_path / "s" / "after_audit.json").read_text())["reruns"] == {"relu": {"b": float(optimum)}}
    ladder_report.ladder_report(tmp_path / "s")
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert f"{optimum} at L2-d32-h2" in result["lr_choice"]["relu"] and "re-run at b" in result["lr_choice"]["relu"]
    assert result["audit"]["arms"]["relu"]["status"] == "within" and result["not_declared"] == []
    # relu now at its optimum at b, gelu 1.3x off its own: relu - gelu is what gelu pays there
    assert result["pairs"]["L2-d32-h2"]["relu"]["mean"] == pytest.approx(-math.log(1.3) ** 2)


def test_the_dry_run_counts_what_rerun_refuted_may_add(tmp_path, capsys):
    """With rerun_refuted, the dry run's cost says the most the re-runs can add before the audit has run: every
    arm's compared runs above the grid's size again (here b: 2 arms x seeds 1-2), their FLOPs those of b's ladder
    runs in the cost table."""
    from sweep import cli

    plan = PLAN.replace('lr_size = "a"', 'lr_size = "a"\nlr_seeds = [7]\nrerun_refuted = true')
    (tmp_path / "plan.toml").write_text(plan)
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--dry-run"])
    out = capsys.readouterr().out
    total = float(re.search(r"^cost: \d+ runs, ([\d.e+]+) training FLOPs", out, re.M)[1])
    b_run = float(re.search(r"^\| b +\| \d+ +\| ([\d.e+]+) +\|", out, re.M)[1])  # FLOPs per run at b
    more = re.search(r"^rerun_refuted: up to (\d+) more runs, ([\d.e+]+) training FLOPs \(([\d.]+)% on top", out, re.M)
    assert more and int(more[1]) == 4, out
    assert float(more[2]) == pytest.approx(4 * b_run, rel=1e-2)
    assert float(more[3]) == pytest.approx(100 * 4 * b_run / total, abs=0.1)
    assert "rerun_refuted" not in cli_dry_run(tmp_path, PLAN.replace('lr_size = "a"', 'lr_size = "a"\nlr_seeds = [7]'),
                                              capsys)


def cli_dry_run(tmp_path, plan, capsys):
    from sweep import cli

    (tmp_path / "plain.toml").write_text(plan)
    cli.main(["--plan", str(tmp_path / "plain.toml"), "--out-dir", str(tmp_path / "plain"), "--dry-run"])
    return capsys.readouterr().out


def test_the_audit_runs_on_the_plans_audit_seeds_first_lr_seeds():
    """audit_seeds = 3: the audit on lr seeds 11-13 (2 by default); more than the lr seeds, or rerun_refuted without
    an audit, is a one-line error."""
    table = {"lrs": [1e-3, 2e-3], "lr_seeds": [11, 12, 13, 14], "audit_seeds": 3, "seeds": [1],
             "sizes": {"a": {"n_layer": 1, "n_embd": 32, "n_head": 2, "max_steps": 10},
                       "b": {"n_layer": 2, "n_embd": 32, "n_head": 2, "max_steps": 20}}, "lr_size": "a"}
    ladder = sweep_plan.read_ladder(table, "plan")
    assert ladder.audit_size == "b" and ladder.audit_seed_list() == [11, 12, 13]
    assert sweep_plan.read_ladder({k: v for k, v in table.items() if k != "audit_seeds"}, "plan").audit_seed_list() == \
        [11, 12]
    with pytest.raises(ConfigError, match="plan: audit_seeds = 5: the tuning audit's seeds, the first of lr_seeds, so "
                                          "an integer from 1 to 4"):
        sweep_plan.read_ladder({**table, "audit_seeds": 5}, "plan")
    with pytest.raises(ConfigError, match="rerun_refuted = true re-runs an arm at its tuning audit's optimum, so it "
                                          "needs the audit"):
        sweep_plan.read_ladder({**table, "rerun_refuted": True, "lr_seeds": None}, "plan")


@pytest.mark.parametrize("change, message", [
    (("max_steps = 20\n", "max_steps = 20\nn_heads = 3\n"), "size b has unknown key(s) ['n_heads']"),
    (("lrs = [1e-3, 2e-3, 4e-3]", "lrs = [0.0, 2e-3, 4e-3]"), "learning rate 0.0 is not positive"),
    (("max_steps = 10\n", ""), "size a has no max_steps"),
    (("lr_size = \"a\"", "lr_size = \"c\""), "lr_size 'c' must name one of the [sizes.NAME] tables"),
    (("[variants.relu]\nact = \"relu\"", "[variants.relu]\nact = \"relu\"\nmax_lr = 1e-3"),
     "--max-lr is set by the ladder"),
    (("config =", "trainer = \"translation\"\nconfig ="), "the translation trainer's ladder is lrs alone"),
    (("lr_size = \"a\"", "lr_size = \"a\"\nlr_seeds = [2, 3]"), "lr_seeds must be a list of integers disjoint from"),
    (("gpt2_cpu_tiny", "translation_cpu_small"), "unknown config key 'model.enc_layers'"),  # read as the trainer reads it
])
def test_bad_ladder_plans_are_one_line_errors(tmp_path, change, message, capsys, monkeypatch):
    launches(monkeypatch, lambda *a, **k: pytest.fail("launched a run on a bad plan"))
    (tmp_path / "plan.toml").write_text(PLAN.replace(*change))
    with pytest.raises(SystemExit):
        cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err


E, A, ALPHA, K = 2.0, 40.0, 0.25, 1.5  # relu2 reaches at C the loss gelu reaches at 1.5 C
SHAPES = [(1, 32, 2), (2, 32, 2), (2, 64, 2), (4, 64, 4)]
NOISE = {1: -0.01, 2: 0.0, 3: 0.01}  # per seed, shared by the arms (the data order): the fit sees E shifted by 0


def curve(c):
    return E + A * c ** -ALPHA


def write_ladder(path, arms=(("gelu", 1.0), ("relu2", K)), noise=NOISE, grid=True, offsets=None):
    """Finished runs of a ladder over SHAPES (a decade of compute per size, the largest shape the cheapest), in
    directories named job001...; with grid, lrs 1e-3 and 9e-3 beside 3e-3 at the smallest size."""
    index = 0
    for i, shape in enumerate(SHAPES):
        per_token = 10 ** ((i + 1) % len(SHAPES) + 4)  # C = 640 x 10^(...) FLOPs: shape order is not compute order
        c = 640 * per_token
        for seed, shift in noise.items():
            for act, k in arms:
                for lr in (3e-3, 1e-3, 9e-3) if grid and i == 0 else (3e-3,):
                    index += 1
                    ladder_run(path / f"job{index:03d}", act, shape, lr, seed,
                               curve(k * c) + shift + 0.3 * (lr != 3e-3), per_token)
                    if offsets and act in offsets:
                        info = json.loads((path / f"job{index:03d}" / "run.json").read_text())
                        info["config"]["run"]["init_seed_offset"] = offsets[act]
                        (path / f"job{index:03d}" / "run.json").write_text(json.dumps(info))


def test_report_only_reads_a_ladder_from_run_json_in_any_directories(tmp_path):
    write_ladder(tmp_path)
    (tmp_path / "bench.json").write_text(json.dumps({
        "shape": {"n_layer": 2, "n_embd": 64, "n_head": 2}, "device": "Test CPU",
        "results": {"gelu": {"contender": {"act": "gelu"}, "tok_per_s": 1000.0, "flops_per_token": 100},
                    "relu2": {"contender": {"act": "relu2"}, "tok_per_s": 800.0, "flops_per_token": 100}}}))
    with pytest.raises(SystemExit, match="pass --extrapolate"):
        cli.main(["--report-only", str(tmp_path), "--target", "gpt2-124m-10b", "--resamples", "2"])
    cli.main(["--report-only", str(tmp_path), "--baseline", "gelu", "--throughput", str(tmp_path / "bench.json"),
                "--resamples", "2", "--target", "gpt2-124m-10b", "--extrapolate"])
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["best_lr"] == {"gelu": {"L1-d32-h2": 3e-3}, "relu2": {"L1-d32-h2": 3e-3}}
    # sizes by compute, not by shape: the largest shape is the cheapest here
    assert result["sizes"] == ["L4-d64-h4", "L1-d32-h2", "L2-d32-h2", "L2-d64-h2"]
    fit = result["fit"]
    assert fit["arms"]["gelu"]["alpha"] == pytest.approx(ALPHA, rel=1e-3)
    assert fit["arms"]["gelu"]["E"] == pytest.approx(E, abs=1e-3)
    relu2 = fit["multipliers"]["relu2"]
    assert relu2["headline"]["multiplier"] == pytest.approx(K, rel=1e-3) == relu2["average"]["multiplier"]
    assert [row["wall_clock"] for row in relu2["at_sizes"]] == [None, None, None, pytest.approx(K * 0.8, rel=1e-3)]
    text = (tmp_path / "sweep.md").read_text()
    assert "bench/train_step.py on Test CPU" in text and "Coverage measured: " in text
    # the lr was picked on the compared seeds: that size's pair is exploratory, outside the Holm family
    assert "picked at L1-d32-h2 on the compared seeds themselves" in text
    # every multiplier and trend sentence names the lrs, where and on which seeds they were picked, and the audit
    assert text.count("at lrs gelu 0.003 at every size and relu2 0.003 at every size, both picked at L1-d32-h2 on the "
                      "compared seeds themselves (its comparisons there: exploratory); no tuning audit") == 2
    # and so are the fit's multiplier and trend, which span that size: the calibration does not simulate the pick
    assert result["pairs"]["L1-d32-h2"]["relu2"]["exploratory"] and [f["claim"] for f in result["family"]] == [
        "relu2 - gelu at L4-d64-h4", "relu2 - gelu at L2-d32-h2", "relu2 - gelu at L2-d64-h2"]
    assert fit["exploratory"] == ["L1-d32-h2"] and "relu2's trend: slope" in text
    assert "Holm over the 3 verdicts of this report" in text and "unadjusted, exploratory)" in text
    assert (tmp_path / "scaling.png").is_file() and (tmp_path / "lr_grid.png").is_file()
    assert "relu2 at GPT-2 124M at 10B tokens (8.55e+18 FLOPs), EXTRAPOLATION" in text


def test_a_size_where_one_arm_ran_at_two_lrs_is_a_one_line_error_naming_them(tmp_path):
    """The runs of an earlier pick left beside the new one (gelu at 3e-3 and 9e-3 at a ladder point, relu2 at 3e-3):
    not a grid, and the report says which size, which arm and which lrs, not that relu2's grid is too small."""
    write_ladder(tmp_path, grid=False)
    for seed in NOISE:
        ladder_run(tmp_path / f"stale{seed}", "gelu", SHAPES[1], 9e-3, seed, 3.0, 10 ** 6)
    with pytest.raises(SystemExit, match=r"at L2-d32-h2 gelu ran at 2 lrs \(0.003, 0.009\) and relu2 at one"):
        cli.main(["--report-only", str(tmp_path), "--resamples", "2"])


def test_a_ladder_of_equal_seeds_and_an_aa_control_is_reported(tmp_path):
    """Every seed equal (at the L2-d64-h2 point their numpy mean exceeds their maximum by a rounding step, which once
    crashed the figure), and an A/A
    control (the baseline's options, another init seed offset) beside the baseline: reported, the control an arm."""
    write_ladder(tmp_path, arms=(("gelu", 1.0), ("gelu_aa", 1.0)), noise={1: 0.2, 2: 0.2, 3: 0.2}, grid=False,
                 offsets={"gelu_aa": 1_000_000})
    for path in tmp_path.glob("job*"):  # the control is gelu in its model options: only its offset differs
        info = json.loads((path / "run.json").read_text())
        info["config"]["model"]["act"] = "gelu"
        (path / "run.json").write_text(json.dumps(info))
    (tmp_path / "sweep_plan.json").write_text(json.dumps({"baseline": "gelu", "ladder": {"lrs": [None]}}))
    shutil.rmtree(tmp_path / "job024")  # half-finished: the control's seed 3 at one size is missing
    cli.main(["--report-only", str(tmp_path), "--resamples", "2"])
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["arms"] == ["gelu", "gelu+init_seed_offset=1000000"]
    assert result["fit"]["multipliers"]["gelu+init_seed_offset=1000000"]["headline"]["multiplier"] == pytest.approx(1)
    text = (tmp_path / "sweep.md").read_text()
    assert "Wall-clock: not measured" in text and "Fitted on sizes" in text and "and seeds 1, 2:" in text


def test_the_report_prints_the_estimators_numbers_on_a_heteroscedastic_ladder(tmp_path):
    """A ladder whose seed sd falls 0.03 -> 0.004 with size and whose second arm's exponent differs: every number
    sweep.md and sweep.json give about the fit (the headline at the largest rung, the ladder average, the trend, E
    and alpha, the curve-free reading, the per-seed fits) is estimate()'s (stats/scaling.py) on the same runs, with the options the calibration uses."""
    rng = np.random.default_rng(3)
    ladder, index = {}, 0
    for i, (shape, sd) in enumerate(zip(SHAPES, (0.03, 0.015, 0.008, 0.004))):
        per_token = 10 ** (i + 4)
        for seed in (1, 2, 3):
            for act, alpha in (("gelu", ALPHA), ("relu2", 1.1 * ALPHA)):
                index += 1
                loss = E + A * (640 * per_token) ** -alpha + sd * rng.standard_normal()
                ladder_run(tmp_path / f"job{index:03d}", act, shape, 3e-3, seed, loss, per_token)
                ladder.setdefault(act, {}).setdefault(640 * per_token, {})[seed] = loss
    cli.main(["--report-only", str(tmp_path), "--resamples", "2"])
    fit, text = json.loads((tmp_path / "sweep.json").read_text())["fit"], (tmp_path / "sweep.md").read_text()
    arms, log_c, losses, _ = scaling.check_ladder(ladder, "gelu")
    est = scaling.estimate(losses[None], log_c, scaling.Options())
    relu2 = fit["multipliers"]["relu2"]
    for key, got in (("headline", relu2["headline"]), ("average", relu2["average"])):
        value, se, dof = est[key]["value"][0, 0], est[key]["se"][0, 0], est[key]["dof"][0, 0]
        low, high = scaling.interval(value, se, dof, 0.95)
        assert [got["multiplier"], *got["ci"]] == pytest.approx(np.exp([value, low, high]), rel=1e-12)
        assert f"{np.exp(value):.3g}" in text and f"[{np.exp(low):.3g}, {np.exp(high):.3g}]" in text
    assert f"{np.exp(est['headline']['value'][0, 0]):.3g}x the compute to reach relu2's loss at " \
           f"{est['reference']:.3g} FLOPs" in text
    free = est["curve_free"]
    for size, row in enumerate(relu2["at_sizes"]):
        assert row["curve_free_status"] == free["status"][0, 0, size]
        assert row["curve_free"] is None or row["curve_free"] == pytest.approx(np.exp(free["value"][0, 0, 0, size]))
    per_seed = np.exp(est["per_seed"]["value"][0, :, 0])
    assert relu2["per_seed"]["multipliers"] == pytest.approx(per_seed, rel=1e-12)
    assert ", ".join(f"{v:.3g}" for v in per_seed) in text
    slope = est["slope"]["value"][0, 0]
    assert relu2["trend"]["slope"] == pytest.approx(slope, rel=1e-12) and f"{slope:+.3g}" in text
    shared = est["fits"]["shared"]
    assert fit["forms"]["shared"]["params"]["gelu"]["E"]["value"] == pytest.approx(shared["E"][0][0, 0], rel=1e-12)
    assert f"gelu E {shared['E'][0][0, 0]:.3g}" in text and f"alpha {shared['alpha'][0][0, 0]:.3g}" in text


def test_throughput_is_looked_up_by_the_arm_and_a_missing_one_said(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({
        "shape": {"n_layer": 1, "n_embd": 32, "n_head": 2}, "device": "Test CPU",
        "results": {"gelu": {"contender": {"act": "gelu"}, "tok_per_s": 1000.0, "flops_per_token": 100}}}))
    compute = {(1, 32, 2): {"gelu": 1.0, "gelu+norm=rmsnorm": 1.0}}
    speeds = ladder_report.throughput_ratios([tmp_path / "bench.json"], compute, "gelu")
    assert speeds["ratio"] == {} and speeds["missing"] == ["gelu+norm=rmsnorm"]


@pytest.mark.parametrize("plan, config, steps", [
    ("configs/ladder_cpu.toml", dict(vocab_size=256, block_size=128), lambda n: math.ceil(20 * n / 1024)),
    ("configs/ladder_gpu.toml", dict(vocab_size=50304, block_size=1024), lambda n: math.ceil(20 * n / 2 ** 19))])
def test_shipped_ladder_plans_follow_their_budget_rule(plan, config, steps):
    """Each size's max_steps by its plan's stated rule of N, the parameters outside the embeddings; under completep,
    the grid at the smallest size (the base) and at its shape with the largest size's steps (lr_design "horizon"),
    and the audit at the largest."""
    _, ladder = cli.parse_args(["--plan", plan, "--out-dir", "x"])
    sizes = list(ladder.ladder.sizes)
    for size in sizes:
        opts = ladder.size_options[size]
        shape = {k: int(option(opts, f"--{k.replace('_', '-')}")) for k in ("n_layer", "n_embd", "n_head")}
        with torch.device("meta"):
            n = GPT(GPTConfig(**config, **shape), seed=0).param_counts()["non_embedding"]
        assert int(option(opts, "--max-steps")) == steps(n), size
    assert (ladder.ladder.lr_size, ladder.ladder.audit_size) == (sizes[0], sizes[-1])
    horizon = ladder.size_options[f"{sizes[0]}_T{sizes[-1]}"]
    base, largest = ladder.size_options[sizes[0]], ladder.size_options[sizes[-1]]
    assert [option(horizon, f"--{k}") for k in ("n-layer", "n-embd", "n-head", "max-steps")] == [
        *(option(base, f"--{k}") for k in ("n-layer", "n-embd", "n-head")), option(largest, "--max-steps")]
    assert all(option(opts, "--param") == "completep" for _, opts, _ in ladder.variants)
    assert len(ladder.ladder.lrs) >= 3 and len(ladder.variants) >= 3


def test_lrs_set_each_trainers_own_lr_options():
    """GPT: max_lr, with min_lr at the config's ratio (gpt2_cpu_study: 3e-4 / 3e-3); translation: its one lr."""
    common = ["--acts", "relu", "--seeds", "1", "--out-dir", "x", "--lrs", "1e-3,2e-3"]
    _, gpt = cli.parse_args(["--config", "configs/gpt2_cpu_study.toml", *common])
    assert [job[1][2:] for job in schedule.ladder_jobs(gpt, [None], {"relu": gpt.ladder.lrs})] == [
        ["--max-lr", "0.001", "--min-lr", "0.0001"], ["--max-lr", "0.002", "--min-lr", "0.0002"]]
    _, translation = cli.parse_args(["--trainer", "translation", "--config", "configs/translation_cpu_small.toml",
                                     *common])
    assert [job[1][2:] for job in schedule.ladder_jobs(translation, [None], {"relu": translation.ladder.lrs})] == [
        ["--lr", "0.001"], ["--lr", "0.002"]]
    assert run_dir("x", "relu", 1, None, 1e-3) == Path("x/relu_lr0.001_seed1")


def test_a_runs_lr_is_the_one_run_json_states_and_older_runs_read_their_trainers_option(tmp_path):
    """The loop writes run.json's `lr` (the option the trainer's swept_lr names first); a run.json from before it
    did still reports: the GPT trainer's max_lr, else the translation trainer's lr."""
    runs = {"gpt": ({"max_lr": 1e-3}, None), "translation": ({"lr": 5e-4}, None),
            "stated": ({"max_lr": 1e-3, "lr": 7e-4}, 2e-3)}  # the first two written as before run.json had `lr`
    for name, (optim, lr) in runs.items():
        RunLog(tmp_path / name).write_run_info({"model": {"act": "relu"}, "optim": optim}, {}, lr=lr)
        (tmp_path / name / "log.txt").write_text("0 val 3.0\n")
    assert [load_run(tmp_path / name).lr for name in runs] == [1e-3, 5e-4, 2e-3]


def test_variants_that_share_an_activation_are_arms_by_their_plans_labels(tmp_path):
    """gelu_sp and gelu_cp differ in param alone: each run is its plan's most specific variant, and the plan's
    baseline gelu_sp is an arm."""
    variants = {"gelu_sp": ["--act", "gelu"], "gelu_cp": ["--act", "gelu", "--param", "completep"]}
    (tmp_path / "sweep_plan.json").write_text(json.dumps({"baseline": "gelu_sp", "variants": variants}))
    for name, param in (("sp", "sp"), ("cp", "completep")):
        ladder_run(tmp_path / name, "gelu", (1, 32, 2), 1e-3, 1, 3.0, 10, param=param)
    points, _ = ladder_points.read_points(tmp_path)
    assert [p["arm"] for p in points] == ["gelu_cp", "gelu_sp"]
    assert ladder_report.read_ladder(tmp_path, points, None).arms == ["gelu_sp", "gelu_cp"]


def test_arm_labels_name_the_model_options_that_differ(tmp_path):
    for name, model in (("x", {}), ("y", {"norm": "rmsnorm"}), ("z", {"act_kwargs": {"impl": "torch"}})):
        ladder_run(tmp_path / name, "gelu", (1, 32, 2), 1e-3, 1, 3.0, 10)
        info = json.loads((tmp_path / name / "run.json").read_text())
        info["config"]["model"].update({"norm": "layernorm", "act_kwargs": {}, **model})
        (tmp_path / name / "run.json").write_text(json.dumps(info))
    assert [p["arm"] for p in ladder_points.read_points(tmp_path)[0]] == [
        "gelu+norm=layernorm+act_kwargs={}", "gelu+norm=rmsnorm+act_kwargs={}",
        'gelu+norm=layernorm+act_kwargs={"impl":"torch"}']


def test_a_recorded_plan_without_a_ladder_is_a_sweep_whose_arms_may_differ_in_shape(tmp_path, monkeypatch):
    from analysis import ladder_points

    two_sizes = [{"size": "L1-d32-h2", "lr": 3e-3}, {"size": "L2-d64-h4", "lr": 3e-3}]
    monkeypatch.setattr(ladder_points, "read_points", lambda out: (two_sizes, None))
    assert ladder_points.is_ladder(tmp_path)  # no plan recorded: runs of several sizes read as a ladder
    (tmp_path / "sweep_plan.json").write_text(json.dumps({"ladder": None, "acts": ["d32", "d64"]}))
    assert not ladder_points.is_ladder(tmp_path)  # configs/sweep_sizes_cpu.toml: two shapes as two arms
    (tmp_path / "sweep_plan.json").write_text(json.dumps({"ladder": {"lrs": [3e-3]}}))
    assert ladder_points.is_ladder(tmp_path)
