"""Reading runs: build-nanogpt's log.txt, llm.c's main.log and ours, the table numbers, the PNGs, and one-line
errors."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import compare, runs
from analysis.runs import RunError, load_run, load_runs, summary
from stats.significance import wilson
from training.runlog import RunLog

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def nanogpt_log(path, steps=30, val_every=10, hella_every=10):
    """A log.txt exactly as karpathy/build-nanogpt's train_gpt2.py writes it."""
    path.mkdir(parents=True, exist_ok=True)
    truth = {"train": {}, "val": {}, "hella": {}}
    with open(path / "log.txt", "w") as f:
        for step in range(steps):
            if step % val_every == 0 or step == steps - 1:
                truth["val"][step] = round(5 - step / 10, 4)
                f.write(f"{step} val {truth['val'][step]:.4f}\n")
            if step % hella_every == 0 or step == steps - 1:
                truth["hella"][step] = round(0.25 + step / 1000, 4)
                f.write(f"{step} hella {truth['hella'][step]:.4f}\n")
            if step < steps - 1:
                truth["train"][step] = round(6 - step / 7, 6)
                f.write(f"{step} train {truth['train'][step]:.6f}\n")
    return truth


def llmc_log(path, steps=30, val_every=10, restart_at=None):
    """A main.log exactly as karpathy/llm.c's train_gpt2.cu writes it (llmc/logger.h formats, its loop's order:
    val loss, then HellaSwag after step 0, then the step's train line). `restart_at`: the job died after that
    step and was resumed (-y 1) from the checkpoint at step 10, appending steps 10.. again with new values."""
    path.mkdir(parents=True, exist_ok=True)
    truth = {"train": {}, "val": {}, "hella": {}}
    with open(path / "main.log", "w") as f:
        def run(first, last_logged, shift):
            for step in range(first, last_logged + 1):
                last = step == steps
                if step % val_every == 0 or last:
                    truth["val"][step] = round(5 - step / 10 + shift, 4)
                    f.write(f"s:{step} tel:{truth['val'][step]:.4f}\n")
                if (step > 0 and step % val_every == 0) or last:
                    truth["hella"][step] = round(0.25 + step / 1000 + shift, 4)
                    f.write(f"s:{step} eval:{truth['hella'][step]:.4f}\n")
                if last:
                    return
                truth["train"][step] = round(6 - step / 7 + shift, 4)
                f.write(f"s:{step} trl:{truth['train'][step]:.4f} lr:{6e-4 * step / steps:.6f} norm:{1 + step / 9:.2f}\n")
        if restart_at is None:
            run(0, steps, 0.0)
        else:
            run(0, restart_at, 0.0)
            run(10, steps, 0.01)
    return truth


def our_run(path, act="aglu", seed=3, max_steps=20, stop_at=None, tokens_per_step=2048, bleu=False, bpb=False):
    """A run written by the trainers' own RunLog (log.txt + metrics.jsonl + run.json)."""
    log = RunLog(path)
    config = {"model": {"act": act}, "data": {"hellaswag_limit": 500},
              "optim": {"max_steps": max_steps, "total_batch_size": tokens_per_step}, "run": {"seed": seed}}
    log.write_run_info(config, {"python": "3"})
    for step in range((stop_at if stop_at is not None else max_steps) + 1):
        if step % 10 == 0 or step == max_steps:
            fields = {"val_loss": 4.0 - step / 100, "hellaswag_acc": 0.3, "hellaswag_acc_norm": 0.32}
            if bpb:
                fields["val_bpb"] = 2.0 - step / 100
            if bleu:
                fields["bleu"] = 10 + step
                log.scalar(step, "bleu", fields["bleu"])
            log.scalar(step, "val", fields["val_loss"])
            log.record(step, kind="eval", tokens=step * tokens_per_step, **fields)
        if step < max_steps:
            loss = 5.0 - step / 50
            log.scalar(step, "train", loss)
            log.record(step, kind="train", loss=loss, tok_per_s=1000.0 + step, tokens=(step + 1) * tokens_per_step)
    log.close()
    return path


def test_nanogpt_log_parses_exactly(tmp_path):
    truth = nanogpt_log(tmp_path / "log")
    run = load_run(tmp_path / "log" / "log.txt")  # the file itself also works
    for kind, series in (("train", "train"), ("val", "val"), ("hella", "hellaswag_acc_norm")):
        assert [(s, v) for s, v, _ in run.series[series]] == sorted(truth[kind].items())
    assert run.label == "log" and run.config is None
    s = summary(run)
    assert s["final_val"] == truth["val"][29] and s["best_val"] == min(truth["val"].values())
    assert s["hellaswag_acc_norm"] == truth["hella"][29] and s["tok_per_s"] is None
    assert run.metrics["hellaswag_acc_norm"].items == 10042


@pytest.mark.parametrize("restart_at", [None, 17])
def test_llmc_main_log_parses_exactly(tmp_path, restart_at):
    truth = llmc_log(tmp_path / "log124M", restart_at=restart_at)
    run = load_run(tmp_path / "log124M" / "main.log")  # the file itself also works
    for kind, series in (("train", "train"), ("val", "val"), ("hella", "hellaswag_acc_norm")):
        assert [(s, v) for s, v, _ in run.series[series]] == sorted(truth[kind].items())
    assert run.series["train"][-1][0] == 29 and run.series["val"][-1][0] == 30
    s = summary(run)
    assert s["final_val"] == truth["val"][30] and s["best_val"] == min(truth["val"].values())
    assert s["hellaswag_acc_norm"] == truth["hella"][30] and s["label"] == "log124M"
    if restart_at:  # the resumed job's lines for steps 10-17 replaced the first job's
        assert s["final_val"] == pytest.approx(2.01) and dict((st, v) for st, v, _ in run.series["val"])[10] == 4.01


def test_our_run_parses_with_tokens_hellaswag_and_bleu(tmp_path):
    run = load_runs([our_run(tmp_path / "r", bleu=True)])[0]
    assert run.label == "aglu/seed3"
    assert run.series["val"][-1] == (20, pytest.approx(3.8), 20 * 2048)
    assert run.series["train"][0] == (0, 5.0, 2048)
    assert [p[1] for p in run.series["bleu"]] == [10, 20, 30]
    s = summary(run)
    assert (s["step"], s["max_steps"], s["tokens"]) == (20, 20, 40960)
    assert s["hellaswag_acc"] == 0.3 and run.metrics["hellaswag_acc"].items == 500
    assert s["tok_per_s"] == 1009.5  # median of 1000..1019
    assert s["bleu"] == 30 and compare.metric_cell(run, "bleu") == "30.00 (30.00)"  # the last and the best


def test_val_bits_per_byte_is_a_series_and_a_column(tmp_path, capsys):
    run = load_runs([our_run(tmp_path / "bytes", bpb=True)])[0]
    assert [p[1] for p in run.series["val_bpb"]] == [2.0, 1.9, 1.8] and summary(run)["final_val_bpb"] == 1.8
    our_run(tmp_path / "plain", act="gelu")
    compare.main([str(tmp_path / "bytes"), str(tmp_path / "plain"), "-o", str(tmp_path / "cmp.png")])
    header, _, with_bpb, without = capsys.readouterr().out.splitlines()[:4]
    column = [c.strip() for c in header.split("|")].index("val bpb")
    assert [[c.strip() for c in row.split("|")][column] for row in (with_bpb, without)] == ["1.8000", "-"]


def test_log_txt_only_run_gets_tokens_from_run_json(tmp_path):
    path = our_run(tmp_path / "r")
    (path / "metrics.jsonl").unlink()
    run = load_run(path)
    assert run.series["train"][4] == (4, pytest.approx(4.92), 5 * 2048)
    assert run.series["val"][1] == (10, pytest.approx(3.9), 10 * 2048)


def test_in_progress_run_with_half_written_lines(tmp_path):
    path = our_run(tmp_path / "r", stop_at=12)
    with open(path / "log.txt", "a") as f:
        f.write("13 tra")
    with open(path / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "kind": "tr')
    run = load_run(path)
    assert run.last_step == 12 and summary(run)["final_val"] == pytest.approx(3.9)


def test_hellaswag_interval_is_wilson_from_the_item_count(tmp_path):
    cell = compare.metric_cell(load_run(our_run(tmp_path / "r")), "hellaswag_acc")  # 0.3 over hellaswag_limit 500
    z, p, n = 1.959964, 0.3, 500
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert cell == f"30.00 [{100 * (centre - half):.1f}, {100 * (centre + half):.1f}]"
    nanogpt_log(tmp_path / "n")
    nano = load_run(tmp_path / "n")  # no config: the full 10,042 items
    p = nano.series["hellaswag_acc_norm"][-1][1]
    lo, hi = wilson(round(p * 10042), 10042)
    assert 0.0085 < (hi - lo) / 2 < 0.0090  # the spec's "about +-0.9 points"
    assert compare.metric_cell(nano, "hellaswag_acc_norm") == f"{100 * p:.2f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def test_a_run_that_declares_no_metrics_is_read_with_the_ones_the_evaluations_declare():
    """Runs written before run.json declared their in-loop metrics (and build-nanogpt's, llm.c's logs) show them
    under the names, labels and formats eval/hellaswag_in_loop.py and eval/bleu_in_loop.py declare now."""
    from eval.bleu_in_loop import BLEU
    from eval.hellaswag_in_loop import ACC, ACC_NORM

    assert (runs.HELLASWAG_ACC, runs.HELLASWAG_ACC_NORM, runs.VALID_BLEU) == (ACC, ACC_NORM, BLEU)


def test_ema_is_bias_corrected():
    ys = [4.0, 2.0, 3.0]
    expected, avg = [], 0.0
    for i, y in enumerate(ys):
        avg = 0.5 * avg + 0.5 * y
        expected.append(avg / (1 - 0.5 ** (i + 1)))
    assert compare.ema(ys, 0.5) == pytest.approx(expected)
    assert compare.ema(ys, 0.5)[0] == 4.0


def test_compare_cli_table_and_png(tmp_path, capsys):
    nanogpt_log(tmp_path / "nanogpt")
    llmc_log(tmp_path / "llmc")
    our_run(tmp_path / "ours", bleu=True)
    our_run(tmp_path / "short", act="gelu", max_steps=40, stop_at=15)
    out = tmp_path / "cmp.png"
    compare.main([str(tmp_path / d) for d in ("nanogpt", "llmc", "ours", "short")] + ["-o", str(out)])
    text = capsys.readouterr().out
    assert "| nanogpt " in text and "aglu/seed3" in text and "15/40" in text
    assert "| llmc " in text and "| 2.0000 " in text and "28.00 [" in text  # llm.c's final val loss, HellaSwag
    assert "30.00 [26.1, 34.2]" in text  # hellaswag acc 0.3 over 500 items, Wilson interval
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_tokens_axis_and_its_error(tmp_path):
    our_run(tmp_path / "ours")
    compare.main([str(tmp_path / "ours"), "-o", str(tmp_path / "t.png"), "--x", "tokens"])
    assert (tmp_path / "t.png").read_bytes().startswith(PNG_MAGIC)
    nanogpt_log(tmp_path / "nanogpt")
    with pytest.raises(SystemExit, match="no token counts.*--x step"):
        compare.main([str(tmp_path / "nanogpt"), "-o", str(tmp_path / "u.png"), "--x", "tokens"])


def add_telemetry(path):
    """Telemetry records of 3 AGLU layers at steps 0, 10, 20 appended to our_run(path)'s metrics."""
    with open(path / "metrics.jsonl", "a") as f:
        for step in (0, 10, 20):
            layers = [{"name": f"h.{i}.mlp.act", "kind": "AGLU", "sparsity": 0.1, "out_mean": 0.0, "out_std": 1.0,
                       "rho": 0.5 + i / 10, "rho_prime": 0.4, "params": {"kappa": 1 + step / 100 + i, "lam": 0.5}}
                      for i in range(3)]
            f.write(json.dumps({"step": step, "kind": "eval", "telemetry": {"layers": layers, "anact_score": 1.0}}) + "\n")


def test_telemetry_png(tmp_path):
    path = our_run(tmp_path / "r")
    add_telemetry(path)
    compare.main([str(path), "-o", str(tmp_path / "c.png"), "--telemetry"])
    data = (tmp_path / "c_telemetry.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert summary(load_run(path))["anact_score"] == 1.0


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "no such run directory"),
    (lambda p: p.mkdir(), "no log.txt, metrics.jsonl or main.log"),
    (lambda p: (p.mkdir(), (p / "main.log").write_text("s:0 tel:5.0\ns:1 trl:4.0 lr:x norm:1.00\n")),
     r"main.log:2: cannot parse 's:1 trl:4.0 lr:x norm:1.00'"),
    (lambda p: (p.mkdir(), (p / "main.log").write_text("step 0 loss 5.0\n")), "main.log:1: cannot parse"),
    (lambda p: (p.mkdir(), (p / "main.log").write_text("s:3\n")), "main.log:1: cannot parse"),
    (lambda p: (p.mkdir(), (p / "log.txt").write_text("0 train 5.0\nhello world\n1 train 4.0\n")),
     r"log.txt:2: cannot parse 'hello world'"),
    (lambda p: (p.mkdir(), (p / "log.txt").write_text("0 train 5.0 extra\n")), "log.txt:1: cannot parse"),
    (lambda p: (p.mkdir(), (p / "metrics.jsonl").write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n')),
     "metrics.jsonl:2: not a metrics record"),
    (lambda p: (p.mkdir(), (p / "log.txt").write_text("0 val 3.0\n"), (p / "run.json").write_text("{")),
     "not a run.json"),
])
def test_unreadable_input_is_a_one_line_error(tmp_path, make, message):
    path = tmp_path / "run"
    make(path)
    with pytest.raises(RunError, match=message):
        load_run(path)
    with pytest.raises(SystemExit) as e:
        compare.main([str(path), "-o", str(tmp_path / "x.png")])
    assert str(e.value).startswith("error: ") and "\n" not in str(e.value)
    assert not (tmp_path / "x.png").exists()


def test_reading_runs_imports_no_torch():
    """Reading and tabulating logs must work on a laptop without torch (and start fast: scipy.stats, half a second
    to import, waits inside the stats/significance.py functions that need it)."""
    code = "import sys, analysis.runs; sys.exit('torch' in sys.modules or 'scipy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1]).returncode == 0


def hellaswag_json(run_dir, step, limit, completion, lm_eval):
    """A result file as eval/hellaswag.py writes it beside a run's checkpoint."""
    n = limit or 10042
    results = {name: {"acc": acc, "acc_norm": norm, "n": n} for name, (acc, norm) in
               (("completion", completion), ("lm_eval", lm_eval))}
    suffix = f"_limit{limit}" if limit else ""
    path = run_dir / f"hellaswag_{step:05d}{suffix}.json"
    path.write_text(json.dumps({"checkpoint": str(run_dir / f"model_{step:05d}.pt"), "step": step, "act": "aglu",
                                "limit": limit, "results": results}))
    return path


def test_hellaswag_results_of_eval_beside_the_losses(tmp_path, capsys):
    run = our_run(tmp_path / "ours")
    hellaswag_json(run, 10, None, (0.2859, 0.2955), (0.2892, 0.3114))  # full, earlier step: shown
    hellaswag_json(run, 20, 500, (0.31, 0.32), (0.33, 0.34))  # later, but only 500 items
    hellaswag_json(run, 20, 100, (0.5, 0.5), (0.5, 0.5))
    our_run(tmp_path / "none", act="gelu")
    s = summary(load_run(run))
    assert s["hella_eval"]["step"] == 10 and s["hella_eval"]["n"] == 10042
    compare.main([str(run), str(tmp_path / "none"), "-o", str(tmp_path / "c.png")])
    lines = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    ours = dict(zip(header, [c.strip() for c in lines[2].strip("|").split("|")]))
    other = dict(zip(header, [c.strip() for c in lines[3].strip("|").split("|")]))
    assert ours["hellaswag.py (step, n)"] == "10, 10042"
    assert ours["completion acc / acc_norm %"] == "28.59 / 29.55"
    assert ours["lm_eval acc / acc_norm %"] == "28.92 / 31.14"
    assert ours["final val"] == "3.8000" and other["hellaswag.py (step, n)"] == "-"
    (run / "hellaswag_00010.json").unlink()  # no full evaluation: the limited one with the most items
    assert summary(load_run(run))["hella_eval"]["n"] == 500
    (run / "hellaswag_00030.json").write_text('{"step": 30}')
    with pytest.raises(RunError, match="hellaswag_00030.json: not a result of eval/hellaswag.py"):
        load_run(run)
