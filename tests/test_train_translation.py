"""train_translation.py end to end on generated files: exact resume, logs, eval-only BLEU, one-line errors."""
import json
import shutil

import pytest
import torch

import train_translation
from training.checkpoint import load_checkpoint
from translation.model import Transformer
from test_parallel_data import write_corpus

torch.set_num_threads(1)
# one pytest-xdist worker runs this file (--dist loadgroup): the `runs` fixture trains once, not once per worker
pytestmark = pytest.mark.xdist_group("train_translation_runs")


def args(corpus, out, spm, *extra):
    return ["--data-dir", str(corpus), "--out-dir", str(out), "--spm-dir", str(spm), "--spm-vocab-size", "60",
            "--enc-layers", "2", "--dec-layers", "2", "--d-model", "32", "--ffn-dim", "64", "--n-head", "4",
            "--dropout", "0.1", "--act-dropout", "0.1", "--act", "nswish", "--act-kwargs", '{"per_instance": true}',
            "--plain-top-k", "1", "--max-tokens", "1600", "--warmup-steps", "4", "--lr", "3e-3",
            "--eval-interval", "4", "--checkpoint-interval", "100", "--log-interval", "1", "--bleu-sentences", "5",
            "--device", "cpu", "--seed", "5", "--beam", "2", *extra]


def records(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # wall-clock fields differ between runs
        for key in [k for k in r if k in ("time", "dt_ms", "tok_per_s", "bleu_seconds") or k.startswith("sent_per_s")]:
            r.pop(key)
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tr")
    corpus, spm = write_corpus(tmp / "corpus"), tmp / "spm"
    straight, split = tmp / "straight", tmp / "split"
    train_translation.main(args(corpus, straight, spm, "--max-steps", "8"))
    train_translation.main(args(corpus, split, spm, "--max-steps", "4", "--test-at-end", "false"))
    train_translation.main(args(corpus, split, spm, "--max-steps", "8", "--resume"))
    return corpus, spm, straight, split


def test_resume_is_exact(runs):
    _, _, straight, split = runs
    a, b = load_checkpoint(straight, kind="translation"), load_checkpoint(split, kind="translation")
    assert a["step"] == b["step"] == 8 and a["loader"][0]["epoch"] >= 1  # the run crossed an epoch
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert (straight / "log.txt").read_text() == (split / "log.txt").read_text()
    assert records(straight) == records(split)


def test_logs_in_the_gpt2_trainer_formats(runs):
    _, _, straight, _ = runs
    lines = [line.split() for line in (straight / "log.txt").read_text().splitlines()]
    assert [(s, k) for s, k, _ in lines if k != "train"] == [("0", "val"), ("4", "bleu"), ("4", "val"),
                                                             ("8", "bleu"), ("8", "val")]
    assert [int(s) for s, k, _ in lines if k == "train"] == list(range(8))
    rows = records(straight)
    train = [r for r in rows if r["kind"] == "train"]
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["lr"] > 0 and r["tokens"] > 0 for r in train)
    assert all(b["tokens"] > a["tokens"] for a, b in zip(train, train[1:]))  # cumulative target tokens
    assert rows[-1]["kind"] == "test" and {"bleu_greedy", "bleu_beam2"} <= rows[-1].keys()
    evals = [r for r in rows if r["kind"] == "eval"]
    kinds = [layer["kind"] for layer in evals[-1]["telemetry"]["layers"]]  # encoder then decoder FFNs
    assert kinds == ["NSwish", "SiLU", "NSwish", "SiLU"] and "alpha" in evals[-1]["telemetry"]["layers"][0]["params"]
    assert json.loads((straight / "run.json").read_text())["config"]["model"]["act"] == "nswish"


def test_eval_only_translates_and_scores_the_checkpoint(runs):
    corpus, _, straight, _ = runs
    at_end = json.loads((straight / "bleu_test.json").read_text())
    results = train_translation.main(["--eval-only", str(straight / "model_00008.pt"), "--beam", "2",
                                      "--decode-batch", "7", "--device", "cpu"])
    assert results["greedy"]["bleu"] == at_end["greedy"]["bleu"] and results["beam2"]["bleu"] == at_end["beam2"]["bleu"]
    assert "tok:13a" in results["greedy"]["signature"]
    for name in ("greedy", "beam2"):
        assert len((straight / f"translations_test_{name}.txt").read_text().splitlines()) == 20
    model = Transformer.from_checkpoint(load_checkpoint(straight, kind="translation"))
    assert model.encoder[1].ffn.act.__class__.__name__ == "SiLU"  # NSwish + 1 Swish
    assert model.encoder[0].ffn.act.__class__.__name__ == "NSwish" and model.encoder[0].ffn.act.per_instance


def test_test_sentences_limits_the_decode_and_reports_its_speed(runs, tmp_path, capsys):
    _, _, straight, _ = runs
    at_end = json.loads((straight / "bleu_test.json").read_text())
    assert at_end["greedy"]["sentences"] == at_end["greedy"]["of"] == 20 and at_end["beam2"]["sentences_per_s"] > 0
    shutil.copy(straight / "model_00008.pt", tmp_path)
    results = train_translation.main(["--eval-only", str(tmp_path / "model_00008.pt"), "--beam", "2",
                                      "--test-sentences", "5", "--device", "cpu"])
    for name in ("greedy", "beam2"):
        assert (results[name]["sentences"], results[name]["of"]) == (5, 20) and results[name]["sentences_per_s"] > 0
        assert len((tmp_path / f"translations_test_{name}.txt").read_text().splitlines()) == 5
    out = capsys.readouterr().out
    assert "test BLEU (beam2) = " in out and "(first 5 of 20 sentences)" in out and "5 sentences in " in out
    assert json.loads((tmp_path / "bleu_test.json").read_text()) == results


def test_resume_with_other_model_options_is_refused(runs):
    corpus, spm, _, split = runs
    with pytest.raises(SystemExit, match="error: .*trained with model config"):
        train_translation.main(args(corpus, split, spm, "--max-steps", "9", "--resume", "--d-model", "64"))


def test_bad_files_stop_with_one_line_errors(tmp_path):
    corpus = write_corpus(tmp_path / "c", n_train=30)
    (corpus / "train.en").write_text("only one line\n")
    with pytest.raises(SystemExit, match=r"^error: .*train\.de has 30 lines but .*train\.en has 1; .*line-aligned$"):
        train_translation.main(args(corpus, tmp_path / "o", tmp_path / "spm"))
    with pytest.raises(SystemExit, match=r"^error: .*valid\.de and .*valid\.en not found"):
        train_translation.main(args(write_corpus(tmp_path / "d", n_train=30), tmp_path / "o", tmp_path / "spm",
                                    "--valid-prefix", str(tmp_path / "nowhere" / "valid")))


def test_compiled_training_gets_padded_static_shapes(runs, tmp_path, monkeypatch, capsys):
    """With compile on, the trainer pads batches (pad_multiple 8 by default) and compiles with dynamic=False;
    the step is the same computation (torch.compile is replaced by a recorder: compiling is tested above)."""
    corpus, spm, _, _ = runs
    calls = []

    def record(model, **kwargs):
        calls.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", record)
    train_translation.main(args(corpus, tmp_path / "c", spm, "--max-steps", "2", "--test-at-end", "false",
                                "--compile", "true"))
    assert calls == [{"dynamic": False, "mode": "default"}]
    first = capsys.readouterr().out.splitlines()[0]
    assert "batch shapes" in first and "exact-length" not in first
    train_translation.main(args(corpus, tmp_path / "e", spm, "--max-steps", "2", "--test-at-end", "false",
                                "--compile", "true", "--pad-multiple", "1"))
    assert calls[1] == {"dynamic": True, "mode": "default"}
    assert "exact-length batches" in capsys.readouterr().out.splitlines()[0]
