"""The sweep: paired statistics equal a hand computation, finished runs are skipped, errors are clear."""
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import sweep_report
from sweep import cli, launchers, plan
from stats import significance
from training.runlog import RunLog


# final val loss per (act, seed); aglu - gelu = -0.10, -0.25, -0.16; relu - gelu = +0.05, +0.10, -0.02
FINAL = {("gelu", 1): 3.50, ("gelu", 2): 3.60, ("gelu", 3): 3.40,
         ("aglu", 1): 3.40, ("aglu", 2): 3.35, ("aglu", 3): 3.24,
         ("relu", 1): 3.55, ("relu", 2): 3.70, ("relu", 3): 3.38}


def fake_run(path, act, seed, final, max_steps=10, stop_at=None, hella=None, params=None, offset=None):
    """A finished (or stopped) run as the GPT trainer writes it; offset: an A/A control's init seed offset."""
    log = RunLog(path)
    log.write_run_info({"model": {"act": act}, "optim": {"max_steps": max_steps, "total_batch_size": 64},
                        "run": {"seed": seed, **({"init_seed_offset": offset} if offset else {})}},
                       {"params": params} if params else {})
    for step in range(0, (max_steps if stop_at is None else stop_at) + 1):
        if step < max_steps:
            log.record(step, kind="train", loss=5.0 - step / 10, tok_per_s=100.0, tokens=(step + 1) * 64)
            log.scalar(step, "train", 5.0 - step / 10)
        if step % 5 == 0:
            val = final if step == max_steps else final + 1.0
            extra = {"hellaswag_acc": hella, "hellaswag_acc_norm": hella} if hella is not None else {}
            log.record(step, kind="eval", val_loss=val, tokens=step * 64, **extra)
            log.scalar(step, "val", val)
    log.close()


def without_plots(monkeypatch):
    """For a test's reports after its first: their PNGs were drawn once (each report draws them again, ~0.4 CPU-s)."""
    from analysis import ladder_report, sweep_report

    for module, name in ((sweep_report, "plot_sweep"), (sweep_report, "plot_telemetry"),
                         (ladder_report, "plot_lr_grid"), (ladder_report, "plot_scaling")):
        monkeypatch.setattr(module, name, lambda *args, **kwargs: None)


def launches(monkeypatch, fake):
    """The sweep's subprocess.run replaced by `fake`; the rest (run.json's git calls) keeps the real one."""
    monkeypatch.setattr(launchers.local, "subprocess", SimpleNamespace(run=fake, STDOUT=subprocess.STDOUT))


def t_ci(diffs, q):
    n = len(diffs)
    mean, sd = sum(diffs) / n, math.sqrt(sum((d - sum(diffs) / n) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    return mean, sd, mean / se, (mean - q * se, mean + q * se)


def test_report_statistics_equal_hand_computation(tmp_path):
    for (act, seed), final in FINAL.items():
        fake_run(tmp_path / f"{act}_seed{seed}", act, seed, final, hella=0.25 + seed / 100 + (act == "aglu") / 50)
    fake_run(tmp_path / "relu_seed4", "relu", 4, 3.0, stop_at=7)  # unfinished: left out
    text = sweep_report.report(tmp_path, acts=["gelu", "aglu", "relu"])
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["baseline"] == "gelu" and result["unfinished"] == ["relu/seed4"]

    for act in ("gelu", "aglu", "relu"):
        vals = [FINAL[(act, s)] for s in (1, 2, 3)]
        got = result["per_act"][act]["final_val"]
        assert got["n"] == 3
        assert got["mean"] == pytest.approx(sum(vals) / 3)
        assert got["std"] == pytest.approx(math.sqrt(sum((v - sum(vals) / 3) ** 2 for v in vals) / 2))

    q = 4.302652729911275  # t_{0.975, 2}
    for act in ("aglu", "relu"):
        diffs = [FINAL[(act, s)] - FINAL[("gelu", s)] for s in (1, 2, 3)]
        mean, sd, t, ci = t_ci(diffs, q)
        got = result["paired"][act]["final_val"]
        assert got["seeds"] == [1, 2, 3]
        assert (got["mean"], got["std"], got["t"]) == (pytest.approx(mean), pytest.approx(sd), pytest.approx(t))
        assert got["ci95"] == pytest.approx(list(ci), rel=1e-4)
    aglu = result["paired"]["aglu"]["final_val"]
    assert aglu["mean"] == pytest.approx(-0.17) and aglu["ci95"][0] < 0 < aglu["ci95"][1]  # 3 seeds: not significant
    # HellaSwag: aglu is +0.02 on every seed, so its differences have zero spread
    assert result["paired"]["aglu"]["hellaswag_acc_norm"]["mean"] == pytest.approx(0.02)
    assert "aglu - gelu" in text and "final val loss" in text and "HellaSwag acc_norm" in text
    assert (tmp_path / "sweep.md").read_text() == text
    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")


# Student's t quantiles in closed form: df 1 is Cauchy, tan(pi (p - 1/2)); df 2 is (2p - 1) / sqrt(2 p (1 - p))
T975_1, T80_1 = math.tan(math.pi * 0.475), math.tan(math.pi * 0.3)
T975_2, T80_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025), 0.6 / math.sqrt(2 * 0.8 * 0.2)
# published tables (6 digits) for df 3 and 4
T975_3, T80_3, T975_4, T80_4 = 3.182446, 0.978472, 2.776445, 0.940965


def test_t_quantile_and_p_against_closed_forms():
    assert significance.t_quantile(2) == pytest.approx(T975_2, rel=1e-12)
    assert significance.t_quantile(1) == pytest.approx(T975_1, rel=1e-12)
    assert significance.t_quantile(1, 0.80) == pytest.approx(T80_1, rel=1e-12)
    assert significance.t_quantile(2, 0.80) == pytest.approx(T80_2, rel=1e-12)
    for df, q975, q80 in ((3, T975_3, T80_3), (4, T975_4, T80_4)):
        assert significance.t_quantile(df) == pytest.approx(q975, abs=2e-6)
        assert significance.t_quantile(df, 0.80) == pytest.approx(q80, abs=2e-6)
    assert significance.t_quantile(1000) == pytest.approx(1.962339, abs=2e-6)  # towards the normal's 1.959964
    # df 2: P(|T| > t) = 1 - t / sqrt(2 + t^2); the interval's edge is p = 0.05
    assert significance.t_pvalue(1.5, 2) == pytest.approx(1 - 1.5 / math.sqrt(2 + 1.5 ** 2), rel=1e-12)
    assert significance.t_pvalue(-T975_2, 2) == pytest.approx(0.05, rel=1e-12)
    diffs = [-0.1, -0.2, -0.3]
    got = significance.paired({1: 0, 2: 0, 3: 0}, dict(zip((1, 2, 3), diffs)))
    mean, sd, t, ci = t_ci(diffs, T975_2)
    assert got["t"] == pytest.approx(t) and got["ci95"] == pytest.approx(list(ci))
    assert got["p"] == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-12)


def test_detectable_difference_and_seeds_needed_by_hand():
    s = 0.0067  # the relu - gelu: paired std 0.0067 over 3 seeds, observed 0.0132
    assert significance.detectable_difference(s, 3) == pytest.approx((T975_2 + T80_2) * s / math.sqrt(3), rel=1e-10)
    assert round(significance.detectable_difference(s, 3), 3) == 0.021
    assert significance.detectable_difference(s, 4) == pytest.approx((T975_3 + T80_3) * s / 2, rel=1e-5)  # 0.01394
    assert significance.detectable_difference(s, 5) == pytest.approx((T975_4 + T80_4) * s / math.sqrt(5), rel=1e-5)  # 0.01114
    assert significance.seeds_needed(s, 0.013) == 5 and significance.seeds_needed(s, -0.013) == 5  # 4 seeds: 0.01394 > 0.013
    assert significance.seeds_needed(s, 0.0140) == 4 and significance.seeds_needed(s, 0.03) == 3
    assert significance.seeds_needed(s, 0.07) == 2  # (T975_1 + T80_1) s / sqrt 2 = 0.0667
    assert significance.seeds_needed(s, 0) is None and significance.seeds_needed(s, 1e-9) is None  # no number of seeds does
    assert significance.detectable_difference(s, 1) is None and significance.seeds_needed(0.0, 0.001) == 2


def test_paired_uses_shared_seeds_only():
    got = significance.paired({1: 1.0, 2: 2.0, 3: 3.0}, {2: 2.5, 3: 3.0, 4: 9.0})
    assert got["seeds"] == [2, 3] and got["mean"] == pytest.approx(0.25)
    assert got["std"] == pytest.approx(statistics.stdev([0.5, 0.0]))
    single = significance.paired({1: 1.0}, {1: 1.5})
    assert single["n"] == 1 and single["t"] is None and single["ci95"] is None


def test_sweep_skips_finished_runs_and_launches_the_rest(tmp_path, monkeypatch):
    calls = []

    def fake_subprocess_run(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        args = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1)}
        fake_run(tmp_path / "s" / f"{args['--act']}_seed{args['--seed']}", args["--act"], int(args["--seed"]), 3.0)
        return subprocess.CompletedProcess(cmd, 0)

    fake_run(tmp_path / "s" / "gelu_seed1", "gelu", 1, 3.5)
    launches(monkeypatch, fake_subprocess_run)
    cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,aglu", "--seeds", "1,2",
                "--out-dir", str(tmp_path / "s"), "--nproc-per-node", "2", "--max-steps", "10"])
    launched = [(c[c.index("--act") + 1], c[c.index("--seed") + 1]) for c in calls]
    assert launched == [("aglu", "1"), ("gelu", "2"), ("aglu", "2")]  # seed by seed
    cmd = calls[0]
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[-3:] == ["--auto-resume", "--max-steps", "10"] and cmd[cmd.index("--out-dir") + 1] == str(tmp_path / "s" / "aglu_seed1")
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["paired"]["aglu"]["final_val"]["n"] == 2

    calls.clear()  # the same command again: everything is finished
    without_plots(monkeypatch)
    cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,aglu", "--seeds", "1,2",
                "--out-dir", str(tmp_path / "s"), "--nproc-per-node", "2", "--max-steps", "10"])
    assert calls == []
    with pytest.raises(SystemExit, match="other settings"):
        cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1",
                    "--out-dir", str(tmp_path / "s"), "--max-steps", "20"])


def test_failed_run_is_a_clear_error(tmp_path, monkeypatch):
    def failing(cmd, stdout=None, stderr=None):
        stdout.write("Traceback ...\nerror: data dir not found\n")
        return subprocess.CompletedProcess(cmd, 1)

    launches(monkeypatch, failing)
    with pytest.raises(SystemExit, match=r"gelu seed 1 stopped \(exit code 1\): error: data dir not found.*train.out"):
        cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1", "--out-dir", str(tmp_path)])


@pytest.mark.parametrize("argv, message", [
    (["--acts", "gelu", "--seeds", "1", "--out-dir", "x"], "missing --config"),
    (["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1", "--out-dir", "x", "--act", "relu"], "--act is set by the sweep"),
    (["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1", "--out-dir", "x", "--baseline", "relu"], "not one of --acts"),
    (["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,agl", "--seeds", "1", "--out-dir", "x"], "unknown activation(s) agl"),
    (["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1,two", "--out-dir", "x"], "comma-separated integers"),
])
def test_bad_arguments(argv, message, capsys, monkeypatch):
    launches(monkeypatch, lambda *a, **k: pytest.fail("launched a run on bad arguments"))
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert message in capsys.readouterr().err


def test_report_only_errors(tmp_path):
    with pytest.raises(SystemExit, match="no such sweep directory"):
        cli.main(["--report-only", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="no run directories"):
        cli.main(["--report-only", str(tmp_path)])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "log.txt").write_text("garbage\n")
    with pytest.raises(SystemExit, match="bad/log.txt:1: cannot parse"):
        cli.main(["--report-only", str(tmp_path)])


PLAN = """
trainer = "translation"
config = "{config}"
seeds = [1, 2]

[variants.relu]
act = "relu"

[variants."nrelu+1relu"]
act = "nrelu"
act_kwargs = {{per_instance = true}}
plain_top_k = 1
baseline = "relu"

[corpora.gen]
data_dir = "{corpus}"
"""
TINY = """
[model]
enc_layers = 2
dec_layers = 2
d_model = 32
ffn_dim = 64
n_head = 4
dropout = 0.0
[data]
spm_vocab_size = 60
max_tokens = 1600
[optim]
warmup_steps = 2
lr = 3e-3
max_steps = 3
[eval]
eval_interval = 3
beam = 2
bleu_sentences = 3
test_sentences = 4
max_len_a = 1.0
max_len_b = 2
[run]
device = "cpu"
checkpoint_interval = 100
"""


@pytest.mark.long  # several translation runs (~4 CPU-s): scheduled first (tests/conftest.py)
def test_translation_plan_runs_variants_per_corpus_and_reports_bleu(tmp_path, monkeypatch):
    """The real translation trainer (in-process) over a plan: variants with their own act options and baseline."""
    import train_translation
    from test_parallel_data import write_corpus

    corpus = write_corpus(tmp_path / "corpus", n_train=120, n_eval=6)
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "plan.toml").write_text(PLAN.format(config=tmp_path / "tiny.toml", corpus=corpus))
    commands, real_run = [], subprocess.run

    def in_process(cmd, stdout=None, stderr=None, **kwargs):
        if not str(cmd[1]).endswith("train_translation.py"):  # e.g. the run log asking git for the commit
            return real_run(cmd, stdout=stdout, stderr=stderr, **kwargs)
        commands.append(cmd)
        assert cmd[1].endswith("train_translation.py")
        train_translation.main(cmd[2:] + ["--spm-dir", str(tmp_path / "spm")])
        return subprocess.CompletedProcess(cmd, 0)

    launches(monkeypatch, in_process)
    out = tmp_path / "sweep"
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(out)])
    assert len(commands) == 4
    nrelu = next(c for c in commands if "nrelu" in c)
    assert nrelu[nrelu.index("--act-kwargs") + 1] == '{"per_instance": true}' and "--plain-top-k" in nrelu
    assert nrelu[nrelu.index("--data-dir") + 1] == str(corpus)

    result = json.loads((out / "gen" / "sweep.json").read_text())
    assert result["acts"] == ["relu", "nrelu+1relu"] and result["baselines"]["nrelu+1relu"] == "relu"
    per_seed = {}
    for label in ("relu", "nrelu+1relu"):
        for seed in (1, 2):
            run = out / "gen" / f"{label}_seed{seed}"
            config = json.loads((run / "run.json").read_text())["config"]
            assert (config["model"]["act"], config["model"]["plain_top_k"]) == (label[:5].rstrip("+"), int("+" in label))
            bleu = json.loads((run / "bleu_test.json").read_text())
            per_seed[label, seed] = bleu["greedy"]["bleu"], bleu["beam2"]["bleu"]
    for i, key in enumerate(("test_bleu_greedy", "test_bleu_beam")):
        stats = result["per_act"]["relu"][key]
        assert stats["n"] == 2 and stats["mean"] == pytest.approx((per_seed["relu", 1][i] + per_seed["relu", 2][i]) / 2)
        diffs = [per_seed["nrelu+1relu", s][i] - per_seed["relu", s][i] for s in (1, 2)]
        assert result["paired"]["nrelu+1relu"][key]["mean"] == pytest.approx(sum(diffs) / 2)
    assert result["per_act"]["nrelu+1relu"]["final_val"]["n"] == 2
    text = (out / "gen" / "sweep.md").read_text()
    assert "nrelu+1relu - relu" in text and "test BLEU beam" in text
    assert all((out / "gen" / png).read_bytes().startswith(b"\x89PNG")
               for png in ("compare.png", "compare_telemetry.png"))

    # the reports below re-read the same runs: drawing the same plots again (most of this test's time) proves
    # nothing the first report did not
    without_plots(monkeypatch)
    commands.clear()  # the same command again: every run has its test BLEU, nothing is launched
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(out)])
    assert commands == []
    assert "nrelu+1relu/seed2" in sweep_report.report(out / "gen")


def test_plan_corpora_are_separate_sweeps(tmp_path, monkeypatch):
    calls = []

    def fake_subprocess_run(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        path = Path(cmd[cmd.index("--out-dir") + 1])
        fake_run(path, cmd[cmd.index("--act") + 1], int(cmd[cmd.index("--seed") + 1]), 3.0 + len(path.parent.name) / 10)
        return subprocess.CompletedProcess(cmd, 0)

    (tmp_path / "plan.toml").write_text('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\n[variants.gelu]\nact = "gelu"\n'
                                        '[variants.swish_bf16]\nact = "silu"\ndtype = "bfloat16"\n'
                                        '[corpora.a]\ndata_dir = "x/a"\n[corpora.bb]\ndata_dir = "x/b"\n')
    launches(monkeypatch, fake_subprocess_run)
    cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s"), "--max-steps", "10"])
    assert [(c[1].rsplit("/", 1)[-1], Path(c[c.index("--out-dir") + 1]).relative_to(tmp_path / "s").as_posix())
            for c in calls] == [("train_gpt2.py", "a/gelu_seed1"), ("train_gpt2.py", "a/swish_bf16_seed1"),
                                ("train_gpt2.py", "bb/gelu_seed1"), ("train_gpt2.py", "bb/swish_bf16_seed1")]
    assert calls[0][-5:] == ["--auto-resume", "--data-dir", "x/a", "--max-steps", "10"]
    assert calls[1][calls[1].index("--dtype") + 1] == "bfloat16"
    assert json.loads((tmp_path / "s" / "bb" / "sweep.json").read_text())["per_act"]["gelu"]["final_val"]["mean"] == 3.2
    with pytest.raises(SystemExit):
        cli.main(["--report-only", str(tmp_path / "s" / "missing")])
    without_plots(monkeypatch)
    cli.main(["--report-only", str(tmp_path / "s")])  # both corpora reported again
    assert (tmp_path / "s" / "a" / "sweep.md").is_file()


def test_shipped_translation_plan():
    args, shipped = cli.parse_args(["--plan", "configs/sweep_translation_acts.toml", "--out-dir", "x",
                                        "--max-steps", "100"])
    assert (shipped.trainer, shipped.seeds, shipped.overrides) == ("translation", [1, 2, 3], ["--max-steps", "100"])
    assert (plan.ROOT / shipped.config).is_file()
    variants = {label: (opts, base) for label, opts, base in shipped.variants}
    assert list(variants) == ["relu", "nrelu+1relu", "swish", "nswish+1swish"]
    assert variants["nswish+1swish"] == (["--act", "nswish", "--act-kwargs", '{"per_instance": true}',
                                          "--plain-top-k", "1"], "swish")
    assert [name for name, _ in shipped.corpora] == ["multi30k", "iwslt_sample"]
    assert all(opts[::2] == ["--train-prefix", "--valid-prefix", "--test-prefix"] for _, opts in shipped.corpora)


@pytest.mark.parametrize("plan, message", [
    ('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\n', "[variants.LABEL] tables"),
    ('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\n[variants.a]\nact = "relu"\nbaseline = "b"\n', "baseline 'b', which is not"),
    ('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\n[variants."a b"]\nact = "relu"\n', "must be letters"),
    ('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\n[variants.a]\nact = "relu"\nseed = 3\n', "--seed is set by the sweep"),
    ('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\nsteps = 3\n[variants.a]\nact = "relu"\n', "unknown ['steps']"),
])
def test_bad_plans(tmp_path, plan, message, capsys, monkeypatch):
    launches(monkeypatch, lambda *a, **k: pytest.fail("launched a run on a bad plan"))
    (tmp_path / "plan.toml").write_text(plan)
    with pytest.raises(SystemExit):
        cli.main(["--plan", str(tmp_path / "plan.toml"), "--out-dir", str(tmp_path / "s")])
    assert message in capsys.readouterr().err


def fake_sweep(out, finals, control=None, baseline="gelu"):
    """Finished fake runs {(label, seed): final val loss} and a sweep_plan.json naming them in order."""
    for (label, seed), final in finals.items():
        fake_run(out / f"{label}_seed{seed}", label.removesuffix("_aa"), seed, final,
                 offset=1_000_000 if label.endswith("_aa") else None)
    acts = list(dict.fromkeys(label for label, _ in finals))
    variants = {a: ["--act", a.removesuffix("_aa")] + (["--init-seed-offset", "1000000"] if a.endswith("_aa") else [])
                for a in acts}
    (out / "sweep_plan.json").write_text(json.dumps({"acts": acts, "baseline": baseline, "control": control,
                                                     "baselines": {a: baseline for a in acts}, "variants": variants}))


def test_report_power_spread_and_control(tmp_path, monkeypatch):
    gelu = {1: 3.50, 2: 3.60, 3: 3.40}
    finals = {("gelu", s): v for s, v in gelu.items()}
    finals.update({("gelu_aa", s): v + d for (s, v), d in zip(gelu.items(), (0.004, -0.003, 0.001))})
    finals.update({("relu", s): v + d for (s, v), d in zip(gelu.items(), (0.0132 - 0.0067, 0.0132, 0.0132 + 0.0067))})
    finals.update({("aglu", s): v + d for (s, v), d in zip(gelu.items(), (0.3, -0.2, 0.05))})
    fake_sweep(tmp_path, finals, control="gelu_aa")
    text = sweep_report.report(tmp_path)
    result = json.loads((tmp_path / "sweep.json").read_text())
    relu = result["paired"]["relu"]["final_val"]
    assert relu["std"] == pytest.approx(0.0067) and relu["mean"] == pytest.approx(0.0132)
    assert relu["detectable"] == pytest.approx((T975_2 + T80_2) * 0.0067 / math.sqrt(3), rel=1e-9)
    assert relu["seeds_needed"] == 5
    assert "relu - gelu, final val loss: 3 seeds can detect 0.021 nats; the observed 0.013 would need 5 seeds." in text
    # the control comes first, before the runs table and first among the pairs, and holds: its interval has 0
    assert result["acts"][:2] == ["gelu", "gelu_aa"] and list(result["paired"])[0] == "gelu_aa"
    assert result["control_reliable"] is True and "no metric differs from 0 (at family-wise error rate 0.05, Holm over its 1 metric), as it must" in text
    assert text.index("A/A control gelu_aa - gelu") < text.index("| run ")
    assert "unreliable" not in text
    # aglu's seed std (0.25 - 0.1 ...) against gelu's 0.1: flagged; relu and the control are not
    ratio = statistics.stdev([3.8, 3.4, 3.45]) / statistics.stdev([3.5, 3.6, 3.4])
    assert [(f["variant"], f["metric"]) for f in result["spread_flags"]] == [("aglu", "final_val")]
    assert result["spread_flags"][0]["ratio"] == pytest.approx(ratio)
    assert f"**aglu needs more seeds**: its seed std of final val loss (0.2179) is {ratio:.1f}x gelu's (0.1000)" in text

    without_plots(monkeypatch)
    cli.main(["--report-only", str(tmp_path), "--target-diff", "0.03"])  # a named difference, in nats
    text = (tmp_path / "sweep.md").read_text()
    assert "relu - gelu, final val loss: 3 seeds can detect 0.021 nats; the named 0.03 would need 3 seeds." in text
    assert json.loads((tmp_path / "sweep.json").read_text())["target_diff"] == 0.03


def test_control_that_excludes_zero_says_the_sweep_is_unreliable(tmp_path):
    finals = {("gelu", s): v for s, v in {1: 3.5, 2: 3.6, 3: 3.4}.items()}
    finals.update({("gelu_aa", s): v + 0.05 + s / 1000 for (_, s), v in finals.items()})
    finals.update({("relu", s): v + 0.01 for (_, s), v in list(finals.items())[:3]})
    fake_sweep(tmp_path, finals, control="gelu_aa")
    text = sweep_report.report(tmp_path)
    assert json.loads((tmp_path / "sweep.json").read_text())["control_reliable"] is False
    assert "differs from 0 (at family-wise error rate 0.05, Holm over its 1 metric). The sweep is unreliable" in text and text.index("unreliable") < text.index("| run ")


def test_hellaswag_pairs_get_the_item_level_interval(tmp_path, write_items):
    """Beside the per-seed interval, each pair's item-level one from the runs' final items files: per item the
    difference of right answers averaged over the seeds, mean ± 1.96 sd/sqrt(items); and no 'floor'."""
    labels = [i % 4 for i in range(40)]
    right = {("gelu", 1): range(0, 12), ("gelu", 2): range(5, 17),  # items each run answers right (acc_norm)
             ("relu", 1): [*range(0, 10), *range(20, 25)], ("relu", 2): [*range(5, 17), 30, 31, 32]}
    for (act, seed), hits in right.items():
        run = tmp_path / f"{act}_seed{seed}"
        fake_run(run, act, seed, 3.5, hella=len(hits) / 40)
        write_items(run / "hellaswag_items_00010.jsonl.gz", labels,
                    [label if i in hits else (label + 1) % 4 for i, label in enumerate(labels)], step=10)
    text = sweep_report.report(tmp_path, acts=["gelu", "relu"])
    hella = json.loads((tmp_path / "sweep.json").read_text())["paired"]["relu"]["hellaswag_acc_norm"]
    diffs = [sum((i in right[("relu", s)]) - (i in right[("gelu", s)]) for s in (1, 2)) / 2 for i in range(40)]
    mean, sd = sum(diffs) / 40, statistics.stdev(diffs)
    items = hella["item_level"]
    assert items["seeds"] == [1, 2] and items["items"] == 40
    assert items["mean"] == pytest.approx(hella["mean"]) == pytest.approx(mean)  # the same difference, 2 views
    assert items["ci95"] == pytest.approx([mean - 1.959963984540054 * sd / math.sqrt(40),
                                           mean + 1.959963984540054 * sd / math.sqrt(40)], rel=1e-12)
    assert items["discordant"] == [7, 3]  # seed 1: gelu only 10, 11; relu only 20-24. Seed 2: relu only 30-32
    assert items["p_mcnemar"] == [pytest.approx(2 * 29 / 128), pytest.approx(0.25)]
    # per seed relu is +0.075 both times (p 0); the claim needs the item-level interval too, so its p is that one's,
    # Holm-adjusted with the final val loss's claim (p 1: every final val loss is 3.5)
    assert hella["p"] == 0 and items["p"] == pytest.approx(0.0495, abs=1e-4)
    assert hella["p_holm"] == pytest.approx(2 * items["p"], rel=1e-12)
    assert "floor" not in text and "binomial_floor" not in hella
    assert "another seed of training" in text and "another sample of items" in text
    row = next(line for line in text.splitlines() if line.startswith("| relu - gelu") and "7, 3" in line)
    assert f"[{items['ci95'][0]:+.4f}, {items['ci95'][1]:+.4f}]" in row
    assert f"[{hella['ci95'][0]:+.4f}, {hella['ci95'][1]:+.4f}]" in row
    # a run scored on other items than its partner: a one-line error naming the file
    write_items(tmp_path / "relu_seed2" / "hellaswag_items_00010.jsonl.gz", labels[:30], labels[:30], step=10)
    with pytest.raises(SystemExit, match="relu_seed2/hellaswag_items_00010.jsonl.gz has 30 items"):
        cli.main(["--report-only", str(tmp_path)])


def test_control_from_the_cli_and_a_plan(tmp_path, monkeypatch):
    calls = []

    def fake_subprocess_run(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        path = Path(cmd[cmd.index("--out-dir") + 1])
        fake_run(path, cmd[cmd.index("--act") + 1], int(cmd[cmd.index("--seed") + 1]), 3.0,
                 offset=int(cmd[cmd.index("--init-seed-offset") + 1]) if "--init-seed-offset" in cmd else None)
        return subprocess.CompletedProcess(cmd, 0)

    launches(monkeypatch, fake_subprocess_run)
    cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,relu", "--seeds", "1,2", "--control", "--out-dir",
                str(tmp_path / "cli")])
    launched = [Path(c[c.index("--out-dir") + 1]).name for c in calls]
    assert launched == ["gelu_seed1", "gelu_aa_seed1", "relu_seed1", "gelu_seed2", "gelu_aa_seed2", "relu_seed2"]
    offsets = {Path(c[c.index("--out-dir") + 1]).name: c[c.index("--init-seed-offset") + 1] if "--init-seed-offset"
               in c else None for c in calls}
    assert offsets["gelu_aa_seed2"] == str(plan.CONTROL_INIT_SEED_OFFSET) and offsets["gelu_seed2"] is None
    assert calls[1][calls[1].index("--act") + 1] == "gelu" and calls[1][calls[1].index("--seed") + 1] == "1"
    result = json.loads((tmp_path / "cli" / "sweep.json").read_text())
    assert result["control"] == "gelu_aa" and list(result["paired"]) == ["gelu_aa", "relu"]

    (tmp_path / "plan.toml").write_text('config = "configs/gpt2_cpu_tiny.toml"\nseeds = [1]\ncontrol = "same"\n[variants.gelu]\n'
                                        'act = "gelu"\n[variants.relu]\nact = "relu"\n')
    _, controlled = cli.parse_args(["--plan", str(tmp_path / "plan.toml"), "--out-dir", "x"])
    assert controlled.variants[1] == ("same", ["--act", "gelu", "--init-seed-offset", "1000000"], "gelu")
    assert controlled.control == "same" and controlled.labels == ["gelu", "same", "relu"]


@pytest.mark.parametrize("argv, message", [
    (["--control", "relu"], "control label 'relu' must be new"),
    (["--init-seed-offset", "3"], "--init-seed-offset is set by the sweep"),
])
def test_bad_control(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,relu", "--seeds", "1", "--out-dir", "x", *argv])
    assert message in capsys.readouterr().err


def test_later_seeds_reuse_the_first_seeds_kernel_path_and_the_report_names_it(tmp_path, monkeypatch):
    """Seed 2 of every variant gets --kernels-from its seed-1 run (the trainer reuses that run's decision); the
    report names each variant's path from run.json, and a variant whose seeds ran different paths is MIXED."""
    calls = []
    paths = {("aglu", 1): "triton", ("aglu", 2): "triton", ("nswish", 1): "triton", ("nswish", 2): "torch"}

    def fake_subprocess_run(cmd, stdout=None, stderr=None):
        calls.append(cmd)
        args = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1)}
        act, seed = args["--act"], int(args["--seed"])
        path = tmp_path / "s" / f"{act}_seed{seed}"
        fake_run(path, act, seed, 3.0 + seed / 10)
        info = json.loads((path / "run.json").read_text())
        decisions = {act: {"impl": paths[act, seed]}} if (act, seed) in paths else {}
        info["environment"] = {"decisions": {"activations": decisions}}
        (path / "run.json").write_text(json.dumps(info))
        return subprocess.CompletedProcess(cmd, 0)

    launches(monkeypatch, fake_subprocess_run)
    cli.main(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,aglu,nswish", "--seeds", "1,2",
                "--out-dir", str(tmp_path / "s"), "--max-steps", "10"])
    reused = {(c[c.index("--act") + 1], c[c.index("--seed") + 1]): c[c.index("--kernels-from") + 1]
              for c in calls if "--kernels-from" in c}
    assert reused == {(a, "2"): str(tmp_path / "s" / f"{a}_seed1") for a in ("gelu", "aglu", "nswish")}
    md = (tmp_path / "s" / "sweep.md").read_text()
    assert "- gelu: PyTorch (no kernel family)\n- aglu: aglu Triton kernel\n" \
           "- nswish: MIXED: seed 1: nswish Triton kernel; seed 2: nswish PyTorch\n" in md
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["kernel_paths"]["aglu"] == "aglu Triton kernel"
    with pytest.raises(SystemExit):
        cli.parse_args(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu", "--seeds", "1", "--out-dir", "o",
                          "--kernels-from", "x"])


def test_report_states_parameters_and_flags_arms_that_are_not_matched(tmp_path):
    """run.json's parameter counts per arm; an arm off its baseline's non-embedding count by > 0.5% is flagged."""
    counts = {"gelu": 1_000_000, "swiglu": 1_004_000, "wide_glu": 1_006_000}  # +0.4%: matched; +0.6%: not
    for label, n in counts.items():
        for seed in (1, 2):
            fake_run(tmp_path / f"{label}_seed{seed}", label, seed, 3.0 + seed / 10,
                     params={"total": n + 50_000, "non_embedding": n, "mlp_per_layer": n // 10})
    text = sweep_report.report(tmp_path, acts=list(counts))
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["params"]["swiglu"] == {"total": 1_054_000, "non_embedding": 1_004_000, "mlp_per_layer": 100_400}
    assert [(f["variant"], round(f["relative"], 6)) for f in result["param_flags"]] == [("wide_glu", 0.006)]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| swiglu ")]
    assert ["swiglu", "1,054,000", "1,004,000", "100,400", "+0.40%"] in rows
    assert "**wide_glu is not parameter-matched**: 1,006,000 parameters outside embeddings against gelu's 1,000,000 " \
           "(+0.60%, more than 0.5%)" in text and "swiglu is not" not in text


def test_gated_names_sweep_with_the_plain_ones():
    _, gated = cli.parse_args(["--config", "configs/gpt2_cpu_tiny.toml", "--acts", "gelu,swiglu,aglu,aglu_glu",
                                "--seeds", "1", "--out-dir", "x"])
    assert gated.labels == ["gelu", "swiglu", "aglu", "aglu_glu"] and gated.baseline == "gelu"


@pytest.mark.parametrize("plan, config", [("configs/sweep_gpt2_glu.toml", "configs/gpt2_124m.toml"),
                                          ("configs/sweep_gpt2_glu_cpu.toml", "configs/gpt2_cpu_study.toml")])
def test_shipped_glu_plans_match_parameters(plan, config):
    """Both plans: ten arms, plain and gated, whose models have MLPs of equal size within 0.5% of gelu's."""
    from sweep.plan import options  # noqa: F401  (the plan's tables are trainer options)
    from model import MLP, GPTConfig
    from training.config import load_config

    import train_gpt2

    _, shipped = cli.parse_args(["--plan", plan, "--out-dir", "x"])
    assert shipped.config == config and len(shipped.variants) == 10
    sizes = {}
    for label, opts, _ in shipped.variants:
        cfg = load_config(train_gpt2.TrainConfig, ["--config", config, *opts])
        sizes[label] = sum(p.numel() for p in MLP(cfg.model, 0).parameters())
    assert {label for label, _, _ in shipped.variants} >= {"gelu", "swiglu", "relu2", "relu2_glu", "aglu", "aglu_glu",
                                                        "nswish", "nswish_glu"}
    assert all(abs(n / sizes["gelu"] - 1) < 0.005 for n in sizes.values()), sizes


def test_sweep_refuses_eval_hellaswags_items_under_the_runs_own_name(tmp_path, write_items):
    """An items file eval/hellaswag.py wrote over a run's own (an older nanoact used the same name) is a one-line
    error, not a silent switch of scoring settings (compile, dtype, kernels) in the item-level interval."""
    from eval import hellaswag_items

    labels = [i % 4 for i in range(20)]
    for act in ("gelu", "relu"):
        for seed in (1, 2):
            fake_run(tmp_path / f"{act}_seed{seed}", act, seed, 3.5, hella=0.5)
            write_items(tmp_path / f"{act}_seed{seed}" / "hellaswag_items_00010.jsonl.gz", labels, labels, step=10)
    hellaswag_items.write(tmp_path / "relu_seed2" / "hellaswag_items_00010.jsonl.gz",
                          {"n": 20, "scorings": ["completion"], "checkpoint": "relu_seed2/model_00010.pt", "step": 10},
                          [{"i": i, "label": x, "completion": hellaswag_items.scoring_record([0, -1, -2, -3], [1] * 4)}
                           for i, x in enumerate(labels)])
    with pytest.raises(SystemExit, match="relu_seed2/hellaswag_items_00010.jsonl.gz holds eval/hellaswag.py's scoring"):
        sweep_report.report(tmp_path, acts=["gelu", "relu"])


def test_the_former_command_forwards_to_the_sweep_with_a_note(tmp_path, capsys, monkeypatch):
    """`python -m analysis.sweep ...`, kept for one release: the same output as `python -m sweep ...`, and one line
    on stderr that names the new command (run here as `python -m` runs a module: runpy, as __main__)."""
    import runpy

    fake_run(tmp_path / "gelu_seed1", "gelu", 1, 3.5)
    cli.main(["--status", str(tmp_path)])
    new = capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["-m", "--status", str(tmp_path)])
    runpy.run_module("analysis.sweep", run_name="__main__", alter_sys=True)
    old = capsys.readouterr()
    assert old.out == new and "gelu_seed1 | done" in old.out
    assert old.err.splitlines() == ["note: `python -m analysis.sweep` is `python -m sweep` now; this name goes in "
                                    "the next release"]
