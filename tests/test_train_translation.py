"""train_translation.py end to end on generated files: exact resume (with gradient accumulation), logs,
eval-only BLEU, one-line errors, and an optimizer step that is the same on 1 process and on 2."""
import json
import shutil
from pathlib import Path

import pytest
import torch

import train_translation
from data.parallel_corpus import collate
from training.checkpoint import load_checkpoint
from training.distributed import Dist
from training.loop import Context
from training.regional_compile import compiled_graphs
from training.precision import autocast_context, grad_scaler
from translation.model import Transformer, TranslationConfig
from test_parallel_data import lengths_corpus, write_corpus
from two_rank_runs import TRANSLATION_RUN

ROOT = Path(__file__).resolve().parents[1]

# one pytest-xdist worker runs the tests that share these module fixtures (--dist loadgroup): they train once, not
# once per worker. Not a module mark: a test of another group too would form a third group (tests/conftest.py).
SHARES_RUNS = pytest.mark.xdist_group("train_translation_runs")


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
def corpus(tmp_path_factory):
    """(generated corpus, sentencepiece cache) the file's runs share."""
    tmp = tmp_path_factory.mktemp("corpus")
    return write_corpus(tmp / "corpus"), tmp / "spm"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("tr")
    corpus, spm = corpus
    straight, split = tmp / "straight", tmp / "split"
    accumulate = ("--total-max-tokens", "3200")  # 2 batches of 1600 per optimizer step
    train_translation.main(args(corpus, straight, spm, "--max-steps", "8", *accumulate))
    train_translation.main(args(corpus, split, spm, "--max-steps", "4", "--test-at-end", "false", *accumulate))
    train_translation.main(args(corpus, split, spm, "--max-steps", "8", "--resume", "--resume-changes", "max_steps",
                                  *accumulate))
    return corpus, spm, straight, split


@SHARES_RUNS
def test_resume_is_exact(runs):
    _, _, straight, split = runs
    a, b = load_checkpoint(straight, kind="translation"), load_checkpoint(split, kind="translation")
    assert a["step"] == b["step"] == 8 and a["loader"][0]["epoch"] >= 1  # the run crossed an epoch
    assert a["loader"][0]["accum"] == 2
    segments = json.loads((split / "run.json").read_text())["segments"]  # the start and the resume
    assert [(s["start_step"], s["environment"]["grad_accum"]) for s in segments] == [(0, 2), (4, 2)]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert (straight / "log.txt").read_text() == (split / "log.txt").read_text()
    resumed = records(split)  # the resume's deliberate change of max_steps is on the record, nothing else differs
    assert [r for r in resumed if r["kind"] == "resume"] == [
        {"step": 4, "kind": "resume", "changes": {"optim.max_steps": {"from": 4, "to": 8}}}]
    assert records(straight) == [r for r in resumed if r["kind"] != "resume"]


@SHARES_RUNS
def test_the_last_checkpoint_holds_the_last_evaluation(runs):
    """Written after the step-8 evaluation: its val_loss and BLEU are step 8's, not step 4's."""
    _, _, straight, _ = runs
    ckpt = load_checkpoint(straight / "model_00008.pt", kind="translation")
    evals = [r for r in records(straight) if r["kind"] == "eval"]
    assert evals[-1]["step"] == 8 and (ckpt["val_loss"], ckpt["bleu"]) == (evals[-1]["val_loss"], evals[-1]["bleu"])
    assert ckpt["val_loss"] != evals[-2]["val_loss"]

@SHARES_RUNS
def test_logs_in_the_gpt2_trainer_formats(runs):
    _, _, straight, _ = runs
    lines = [line.split() for line in (straight / "log.txt").read_text().splitlines()]
    assert [(s, k) for s, k, _ in lines if k != "train"] == [("0", "val"), ("4", "val"), ("4", "bleu"),
                                                             ("8", "val"), ("8", "bleu")]
    assert [int(s) for s, k, _ in lines if k == "train"] == list(range(8))
    rows = records(straight)
    train = [r for r in rows if r["kind"] == "train"]
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["lr"] > 0 and r["tokens"] > 0 for r in train)
    assert all(b["tokens"] > a["tokens"] for a, b in zip(train, train[1:]))  # cumulative target tokens
    assert rows[-1]["kind"] == "test" and {"bleu_greedy", "bleu_beam2"} <= rows[-1].keys()
    evals = [r for r in rows if r["kind"] == "eval"]
    kinds = [layer["kind"] for layer in evals[-1]["telemetry"]["layers"]]  # encoder then decoder FFNs
    assert kinds == ["NSwish", "SiLU", "NSwish", "SiLU"] and "alpha" in evals[-1]["telemetry"]["layers"][0]["params"]
    info = json.loads((straight / "run.json").read_text())
    assert info["config"]["model"]["act"] == "nswish" and info["lr"] == info["config"]["optim"]["lr"]


@SHARES_RUNS
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


@SHARES_RUNS
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


@SHARES_RUNS
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


def test_a_missing_test_split_stops_the_run_before_step_0(tmp_path):
    """Test BLEU at the end needs the test references: a run without them stops before its first step, not after
    its last (where it used to end without test BLEU)."""
    corpus = write_corpus(tmp_path / "c", n_train=30)
    (corpus / "test.en").unlink()
    with pytest.raises(SystemExit, match=r"^error: test BLEU at the end \(--test-at-end\): .*test\.en not found .*"
                                         r"--test-prefix .*--test-at-end false$"):
        train_translation.main(args(corpus, tmp_path / "o", tmp_path / "spm", "--max-steps", "2"))
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@SHARES_RUNS
def test_compiled_training_compiles_each_layer_once_before_the_first_step(corpus, tmp_path, monkeypatch, capsys):
    """--compile: the encoder's 3 layers run one graph and the decoder's 2 another, compiled in a warm-up over
    every padded batch shape before step 0, whatever the depth and the shapes (the whole model compiled one graph
    per shape, during the steps); no step compiles; the losses are an eager run's on the same padded batches (the warm-up leaves
    NSwish's batch statistics, the gradients and the RNG as they were). torch.compile runs dynamo with its eager
    backend: the graphs inductor would compile, not compiled (bench/translation_compile.py compiles them)."""
    corpus, spm = corpus
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile(model, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    before = compiled_graphs()
    run = ("--max-steps", "2", "--test-at-end", "false", "--bleu-sentences", "1", "--enc-layers", "3",
           "--act-kwargs", "{}", "--plain-top-k", "0")
    train_translation.main(args(corpus, tmp_path / "c", spm, *run, "--compile", "true"))
    assert "batch shapes" in capsys.readouterr().out.splitlines()[0]
    compiled = records(tmp_path / "c")
    warm_up = [r for r in compiled if r["kind"] == "compile"]
    assert len(warm_up) == 1 and warm_up[0]["batch_shapes"] >= 3
    assert warm_up[0]["graphs"] == compiled_graphs() - before == 2
    train_translation.main(args(corpus, tmp_path / "e", spm, *run, "--compile", "false", "--pad-multiple", "8"))
    losses = [[r["loss"] for r in rows if r["kind"] == "train"] for rows in (compiled, records(tmp_path / "e"))]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-6)


class StepBatches:
    """The loader's next_batch over a fixed list of batches."""

    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self, device="cpu"):
        return self.batches.pop(0)


def step_gradients(batches, label_smoothing=0.1):
    """(loss, target tokens, gradients) of TranslationTrainer.forward_backward on `batches`, in float64."""
    torch.manual_seed(0)
    trainer = train_translation.TranslationTrainer(train_translation.TrainConfig())
    trainer.cfg.optim.label_smoothing = label_smoothing
    trainer.model = Transformer(TranslationConfig(vocab_size=50, enc_layers=2, dec_layers=2, d_model=16, ffn_dim=32,
                                                  n_head=2, dropout=0.0, act="swish"), seed=0).double()
    trainer.ctx = Context(Dist(), "float32", autocast_context("cpu", "float32"), grad_scaler("cpu", "float32"), False)
    trainer.loader, trainer.accum = StepBatches(batches), len(batches)
    loss, tokens = trainer.forward_backward(trainer.model, lambda micro: None)
    return loss, tokens, {name: p.grad for name, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_two_accumulated_batches_make_the_step_of_one_batch_holding_both(label_smoothing):
    """Every target token weighs the same whichever batch it is in: accumulating a batch of 5 short and one of 7
    long pairs (padded apart) gives the gradient of one batch of all 12, not the mean of two batch means."""
    src, tgt = lengths_corpus(12)
    order = sorted(range(12), key=lambda i: len(tgt[i]))
    short, long = collate(src, tgt, order[:5]), collate(src, tgt, order[5:])
    assert (short[2] != 0).sum() * 2 < (long[2] != 0).sum()  # unequal batches: a plain mean would weigh them wrong
    loss_two, tokens_two, two = step_gradients([short, long], label_smoothing)
    loss_one, tokens_one, one = step_gradients([collate(src, tgt, order)], label_smoothing)
    assert tokens_two == tokens_one == sum(len(t) + 1 for t in tgt)
    torch.testing.assert_close(loss_two, loss_one, rtol=1e-6, atol=0)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.xdist_group("two_rank_runs")
def test_two_ranks_train_the_same_steps_as_one_process_accumulating_two(two_rank_runs, tmp_path):
    """torchrun with 2 gloo ranks, 1 batch each per step (tests/two_rank_runs.py), against 1 process with 2
    accumulated batches: the same steps on the same target tokens, with dropout and NSwish's running statistics the
    same noise and normalisation, the same losses and weights (up to float32 summation order)."""
    corpus, spm = two_rank_runs / "translation_data", two_rank_runs / "spm"
    train_translation.main(args(corpus, tmp_path / "one", spm, *TRANSLATION_RUN))
    assert "step: 2 batches (grad accum 1) of <= 800 tokens" in (two_rank_runs / "job.log").read_text()
    one, two = load_checkpoint(tmp_path / "one", kind="translation"), load_checkpoint(two_rank_runs / "translation",
                                                                                      kind="translation")
    assert (one["step"], one["world_size"], two["world_size"]) == (3, 1, 2)
    # A key bias adds q.b_k to every score of a query, which softmax ignores: its gradient is zero up to rounding,
    # and Adam divides that rounding noise by its own size, so the two summation orders move it apart.
    for key in (k for k in one["model"] if not k.endswith("k_proj.bias")):
        torch.testing.assert_close(two["model"][key], one["model"][key], msg=key)
    train_one, train_two = ([r for r in records(run) if r["kind"] == "train"]
                            for run in (tmp_path / "one", two_rank_runs / "translation"))
    assert [r["tokens"] for r in train_two] == [r["tokens"] for r in train_one]
    torch.testing.assert_close([r["loss"] for r in train_two], [r["loss"] for r in train_one])
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)
    assert "encoder.0.ffn.act.running_rho" in one["model"]  # batch statistics, tracked (compared above)


def test_a_step_the_processes_cannot_fill_is_a_one_line_error(tmp_path):
    corpus = write_corpus(tmp_path / "c", n_train=30)
    with pytest.raises(SystemExit, match=r"^error: total_max_tokens 2000 is not a multiple of max_tokens \* processes "
                                         r"= 1600 \* 1 = 1600; change --max-tokens .* or --total-max-tokens"):
        train_translation.main(args(corpus, tmp_path / "o", tmp_path / "spm", "--total-max-tokens", "2000"))
