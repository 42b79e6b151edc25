"""eval/hellaswag.py: the packed scorer equals a plain per-item loop for both scorings and the previous
(one pass per scoring) scorer item by item, lm-eval's preprocessing is reproduced exactly, DDP shards add
up, tokens are cached (memory, disk) and compiled graphs reused, and bad input fails with a clear message."""
import gzip
import hashlib
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from eval import hellaswag, hellaswag_items
from eval.hellaswag import SCORINGS, DataError, evaluate_model, load_items, make_row_batches, score_row_batches
from eval.scoring import block_size_of, bucket, row_length, score_rows
from stats.significance import wilson
from model import GPT
from training.checkpoint import load_checkpoint

REAL = Path(__file__).resolve().parents[2] / "shared" / "assets" / "hellaswag" / "hellaswag_val.jsonl"


@pytest.fixture(autouse=True)
def token_cache(tmp_path, monkeypatch):
    """Token caches go to a fresh directory, and no packing survives from another test."""
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "nanoact_cache"))
    hellaswag._ROW_BATCHES.clear()
    return tmp_path / "nanoact_cache" / "hellaswag_tokens"


def lm_eval_docs(items):
    """lm-eval's own hellaswag process_docs applied to our items (needs `datasets`, as lm-eval does)."""
    import datasets
    from lm_eval.tasks.hellaswag.utils import process_docs
    return list(process_docs(datasets.Dataset.from_list(items)))


def reference_loglik(model, context, continuation):
    """log p(continuation | context), one unpadded sequence, float64 log-softmax over the 50257 real tokens."""
    tokens = torch.tensor(context + continuation)[None]
    with torch.no_grad():
        logits, _ = model(tokens[:, :-1])
    logp = F.log_softmax(logits[0, :, :50257].double(), -1)
    n = len(continuation)
    return logp[-n:].gather(1, tokens[0, -n:, None]).sum().item(), n


def reference_scores(model, enc, items):
    """Per-item (loglik, acc divisor) arrays for both scorings, built from the original recipes:
    build-nanogpt's tokenization and lm-eval's own process_docs + TemplateLM._encode_pair."""
    from lm_eval.api.model import TemplateLM
    tok = types.SimpleNamespace(backend="causal", tok_encode=lambda s, **kw: enc.encode_ordinary(s))
    out = {"completion": [], "lm_eval": []}
    for item, doc in zip(items, lm_eval_docs(items)):
        ctx = enc.encode(item["ctx"])
        comp = [reference_loglik(model, ctx, enc.encode(" " + e)) for e in item["endings"]]
        out["completion"].append(([ll for ll, _ in comp], [n for _, n in comp]))
        lme = [reference_loglik(model, *TemplateLM._encode_pair(tok, doc["query"], " " + c))[0] for c in doc["choices"]]
        out["lm_eval"].append((lme, [len(c) for c in doc["choices"]]))
    return out


@pytest.fixture
def tiny(make_checkpoint, hellaswag_file, gpt2_enc):
    model = GPT.from_checkpoint(load_checkpoint(make_checkpoint(), kind="gpt2"))
    path = hellaswag_file(n=11)
    return model, path, load_items(path)


def row_batches_for(enc, items, batch_rows, **kwargs):
    requests = {s: hellaswag.build_requests(enc, items, s) for s in SCORINGS}
    return make_row_batches(requests, torch.tensor([item["label"] for item in items]), 128, batch_rows, **kwargs)


def test_packed_scorer_equals_per_item_loop(tiny, gpt2_enc):
    model, path, items = tiny
    ref = reference_scores(model, gpt2_enc, items)
    # 12 rows per forward: several batches, a padded last one, several batch lengths
    packing = row_batches_for(gpt2_enc, items, 12, length_step=8)
    assert len(packing.batches) == -(-packing.n_rows // 12) and len({idx.shape[1] for _, idx, _ in packing.batches}) > 2
    ll = score_row_batches(model, packing, "cpu", progress=False)
    for scoring in SCORINGS:
        ref_ll = torch.tensor([ref[scoring][i][0] for i in range(len(items))], dtype=torch.float64)
        torch.testing.assert_close(ll[packing.index[scoring]], ref_ll, rtol=1e-5, atol=1e-5)
        # acc_norm divides by the token count (completion) or the characters of the choice (lm_eval)
        assert packing.divisors[scoring].tolist() == [[float(n) for n in ref[scoring][i][1]] for i in range(len(items))]
    result = evaluate_model(model, "cpu", path, scoring="both", progress=False, batch_items=4)
    gold = np.array([item["label"] for item in items])
    for scoring in SCORINGS:
        ll = np.array([r[0] for r in ref[scoring]])
        div = np.array([r[1] for r in ref[scoring]], dtype=float)
        acc = np.mean(np.argmax(ll, 1) == gold)  # highest log-likelihood == lowest summed loss
        acc_norm = np.mean(np.argmax(ll / div, 1) == gold)
        r = result[scoring]
        assert r["n"] == len(items) and r["acc"] == pytest.approx(acc) and r["acc_norm"] == pytest.approx(acc_norm)
        assert r["acc_ci95"] == pytest.approx(wilson(r["correct"], len(items)))
        assert r["rows"] == packing.n_rows and r["scored_with"] == "completion+lm_eval"
    # the predictions are not degenerate: the scorings disagree somewhere and acc_norm differs from acc
    preds = {s: [np.argmax(np.array(ll) / np.array(d, dtype=float)) for ll, d in ref[s]] for s in ref}
    assert preds["completion"] != preds["lm_eval"]


def previous_scorer(model, enc, items, scoring, batch_items):
    """The scorer before the shared pass (eval/hellaswag.py score_items at 9bc4e46), as it was: one pass per
    scoring, items sorted by their longest row, 4 rows per item, lengths bucketed to 64.
    Returns (loglik (n, 4), acc prediction, acc_norm prediction) per item."""
    requests = hellaswag.build_requests(enc, items, scoring)
    block_size = block_size_of(model)
    lengths = [max(row_length(ctx, c, block_size) for c in conts) for ctx, conts, _ in requests]
    order = sorted(range(len(requests)), key=lambda i: -lengths[i])
    ll, n_tok = torch.zeros(len(items), 4, dtype=torch.float64), torch.zeros(len(items), 4, dtype=torch.long)
    for start in range(0, len(order), batch_items):
        share = order[start:start + batch_items]
        rows = [(requests[i][0], c) for i in share for c in requests[i][1]]
        sums, counts, _ = score_rows(model, rows, bucket(lengths[share[0]], block_size), 4 * batch_items, "cpu")
        ll[share], n_tok[share] = sums.view(-1, 4), counts.view(-1, 4)
    norm = n_tok.double() if scoring == "completion" else torch.tensor([r[2] for r in requests], dtype=torch.float64)
    return ll, ll.argmax(1), (ll / norm).argmax(1)


def test_shared_pass_scores_identical_to_previous_scorer(make_checkpoint, hellaswag_file, gpt2_enc):
    model = GPT.from_checkpoint(load_checkpoint(make_checkpoint(seed=1), kind="gpt2"))
    path = hellaswag_file(n=20, seed=3)
    items = load_items(path)
    packing = row_batches_for(gpt2_enc, items, 4 * 5, length_step=hellaswag.length_step(model))
    ll = score_row_batches(model, packing, "cpu", progress=False)
    result = evaluate_model(model, "cpu", path, progress=False, batch_items=5)
    for scoring in SCORINGS:
        old_ll, old_acc, old_norm = previous_scorer(model, gpt2_enc, items, scoring, 5)
        new_ll = ll[packing.index[scoring]]
        torch.testing.assert_close(new_ll, old_ll, rtol=1e-6, atol=1e-6)  # fp32 forwards of other batch shapes
        assert torch.equal(new_ll.argmax(1), old_acc)  # item by item, both predictions
        assert torch.equal((new_ll / packing.divisors[scoring]).argmax(1), old_norm)
        gold = packing.gold
        assert result[scoring]["correct"] == (old_acc == gold).sum().item()
        assert result[scoring]["correct_norm"] == (old_norm == gold).sum().item()


def test_rank_shards_cover_rows_once_with_equal_shapes(tiny, gpt2_enc):
    model, _, items = tiny
    full = score_row_batches(model, row_batches_for(gpt2_enc, items, 8), "cpu", progress=False)
    packings = [row_batches_for(gpt2_enc, items, 8, rank=rank, world_size=3) for rank in range(3)]
    shapes = [[idx.shape for _, idx, _ in packing.batches] for packing in packings]
    assert shapes[0] == shapes[1] == shapes[2]  # every rank runs the same forwards (compile, collectives)
    shares = torch.cat([share for packing in packings for share, _, _ in packing.batches])
    assert sorted(shares.tolist()) == list(range(full.numel()))  # every distinct row on exactly one rank
    # each rank's log-likelihoods, zeros elsewhere: what the all-reduce sums
    parts = [score_row_batches(model, packing, "cpu", progress=False) for packing in packings]
    torch.testing.assert_close(sum(parts), full, rtol=1e-6, atol=1e-5)


def test_rows_are_shared_between_scorings_and_items(gpt2_enc):
    item = {"ctx": "A man", "ctx_a": "A man", "ctx_b": "", "activity_label": "Run", "label": 0,
            "endings": ["runs.", "runs.", "sits.", "jumps."]}
    packing = row_batches_for(gpt2_enc, [item, dict(item, label=2)], 8)
    # 2 identical items x 4 endings x 2 scorings = 16 rows, of which 3 + 3 are distinct
    assert packing.n_rows == 6 and packing.index["completion"][0, 0] == packing.index["completion"][1, 1]
    assert not set(packing.index["completion"].flatten().tolist()) & set(packing.index["lm_eval"].flatten().tolist())


def test_tokens_and_plan_are_cached(tiny, hellaswag_file, token_cache, monkeypatch):
    model = tiny[0]
    path = hellaswag_file(n=3, name="three_items.jsonl")  # what is cached, and when, holds at any number of items
    calls = []

    def counted(fn):
        def wrapped(*args):
            calls.append(fn.__name__)
            return fn(*args)
        return wrapped

    monkeypatch.setattr(hellaswag, "load_items", counted(hellaswag.load_items))
    monkeypatch.setattr(hellaswag, "build_requests", counted(hellaswag.build_requests))
    run = lambda: evaluate_model(model, "cpu", path, progress=False, cache=True)
    first = run()
    assert calls == ["load_items", "build_requests", "build_requests"]  # tokenized once, both scorings
    files = list(token_cache.iterdir())
    assert len(files) == 1 and files[0].name.endswith("_all_completion+lm_eval.npz")
    same = lambda r: all(r[s]["correct"] == first[s]["correct"] and r[s]["correct_norm"] == first[s]["correct_norm"]
                         for s in SCORINGS)
    calls.clear()
    assert same(run()) and calls == []  # the next call (in the training loop): the packing from memory
    hellaswag._ROW_BATCHES.clear()  # a new process: the labels are read, the tokens come from disk
    assert same(run()) and calls == ["load_items"]
    files[0].write_bytes(b"damaged")  # a broken cache file is rebuilt, not an error
    hellaswag._ROW_BATCHES.clear()
    calls.clear()
    assert same(run()) and calls.count("build_requests") == 2
    path.write_text(path.read_text().replace("the", "a"))  # other bytes, another key
    run()
    assert len(list(token_cache.iterdir())) == 2


def test_compiled_scorer_reuses_its_graphs_across_calls(tiny, hellaswag_file):
    """The training loop passes its compiled model: the first call compiles one graph per batch length
    (multiples of 64), later calls compile nothing."""
    from torch._dynamo.testing import CompileCounter

    model = tiny[0]
    path = hellaswag_file(n=5, name="five_items.jsonl")  # several batches, more than their lengths
    eager = evaluate_model(model, "cpu", path, progress=False, batch_items=3)
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    first = evaluate_model(compiled, "cpu", path, progress=False, batch_items=3)
    batches = next(iter(hellaswag._ROW_BATCHES.values())).batches
    lengths = {idx.shape[1] for _, idx, _ in batches}
    assert lengths <= {64, 128} and counter.frame_count == len(lengths) < len(batches)
    second = evaluate_model(compiled, "cpu", path, progress=False, batch_items=3)
    assert counter.frame_count == len(lengths)  # no recompilation
    for s in SCORINGS:
        assert first[s]["correct"] == second[s]["correct"] == eager[s]["correct"]
        assert first[s]["correct_norm"] == second[s]["correct_norm"] == eager[s]["correct_norm"]


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
def test_torchrun_two_ranks_equal_one_process(two_rank_runs, gpt2_enc):
    """eval/hellaswag.py under torchrun on 2 ranks (tests/two_rank_runs.py) counts what one process counts."""
    model = GPT.from_checkpoint(load_checkpoint(two_rank_runs / "run_gelu_0", kind="gpt2"))
    single = evaluate_model(model, "cpu", two_rank_runs / "hellaswag.jsonl", progress=False, batch_items=2)
    ddp = json.loads((two_rank_runs / "hellaswag.json").read_text())
    assert ddp["world_size"] == 2
    for scoring in ("completion", "lm_eval"):
        for key in ("n", "correct", "correct_norm"):
            assert ddp["results"][scoring][key] == single[scoring][key]


def test_the_first_line_names_the_model_not_how_an_old_checkpoint_ran():
    ckpt = {"path": "run/model_00007.pt", "step": 7,
            "model_config": {"act": "nswish", "act_kwargs": {"impl": "triton", "per_instance": True}}}
    assert hellaswag.describe(None, ckpt) == 'run/model_00007.pt | step 7 | act nswish {"per_instance": true}'
    ckpt["model_config"]["act_kwargs"] = {"impl": "triton"}
    assert hellaswag.describe(None, ckpt) == "run/model_00007.pt | step 7 | act nswish"


def test_scores_in_eval_mode_and_restores_training_mode(make_checkpoint, hellaswag_file, gpt2_enc):
    """NSwish in training mode would fold every scored batch into its running statistics."""
    model = GPT.from_checkpoint(load_checkpoint(make_checkpoint(act="nswish"), kind="gpt2"))
    state = lambda: {**model.state_dict(), **dict(model.named_buffers())}  # noqa: E731 (the pending sums too)
    before = {k: v.clone() for k, v in state().items()}
    model.train()
    r = evaluate_model(model, "cpu", hellaswag_file(n=5), scoring="completion", progress=False)
    assert model.training and r["completion"]["n"] == 5 and set(r) == {"completion"}
    assert all(torch.equal(before[k], v) for k, v in state().items())


def test_wilson_interval():
    lo, hi = wilson(30, 100)
    assert lo == pytest.approx(0.21886, abs=1e-4) and hi == pytest.approx(0.39576, abs=1e-4)
    lo, hi = wilson(3000, 10042)
    assert hi - lo == pytest.approx(2 * 1.96 * (0.29875 * 0.70125 / 10042) ** 0.5, abs=2e-4)  # about +-0.9 points


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"ctx": "a", "ctx_a": "a", "ctx_b": "", "activity_label": "x", "label": 0}', "missing field(s) endings"),
    ('{"ctx": "a", "ctx_a": "a", "ctx_b": "", "activity_label": "x", "endings": ["a", "b", "c"], "label": 0}',
     "list of 4"),
    ('{"ctx": "a", "ctx_a": "a", "ctx_b": "", "activity_label": "x", "endings": ["a", "b", "c", "d"], "label": 4}',
     "'label' must be 0, 1, 2 or 3"),
])
def test_malformed_file_names_file_and_line(hellaswag_file, line, message):
    path = hellaswag_file(n=2)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(DataError, match=rf"{path.name}:3: .*{message}".replace("(", r"\(").replace(")", r"\)")):
        load_items(path)
    assert len(load_items(path, limit=2)) == 2  # the limit stops before the bad line


def test_download_uses_cache_and_fails_offline_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError, match="offline\\? pass --data"):
        hellaswag.download("http://127.0.0.1:9/hellaswag_val.jsonl")
    cached = tmp_path / "cache" / "hellaswag_val.jsonl"
    cached.write_text("{}\n")
    assert hellaswag.download("http://127.0.0.1:9/unused") == cached
    assert list((tmp_path / "cache").iterdir()) == [cached]  # no temporary file left behind


def test_cli_writes_json_and_rejects_wrong_checkpoints(make_checkpoint, hellaswag_file, gpt2_enc, tmp_path, capsys):
    ckpt, data = make_checkpoint(step=12), hellaswag_file(n=5)
    hellaswag.main([str(ckpt.parent), "--data", str(data), "--limit", "4", "--device", "cpu"])
    record = json.loads((ckpt.parent / "hellaswag_00012_limit4.json").read_text())
    assert record["step"] == 12 and record["results"]["completion"]["n"] == 4 and record["results"]["lm_eval"]["n"] == 4
    assert record["act"] == "gelu"
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"scoring {ckpt} | step 12 | act gelu"  # which weights, before anything else
    assert "acc_norm" in out and "completion+lm_eval in one pass: " in out
    bpb = record["results"]["completion"]["bpb_ci95"]
    assert f"| gold bits/byte {record['results']['completion']['bpb']:.4f} [{bpb[0]:.4f}, {bpb[1]:.4f}]" in out
    other = tmp_path / "translation.pt"
    torch.save({"kind": "translation", "model": {}}, other)
    for bad, message in [(tmp_path / "missing.pt", "no such checkpoint file"), (other, "a 'translation' checkpoint")]:
        with pytest.raises(SystemExit, match=message):
            hellaswag.main([str(bad), "--data", str(data)])
    with pytest.raises(SystemExit, match="no such file; pass --data"):
        hellaswag.main([str(ckpt), "--data", str(tmp_path / "nope.jsonl")])


def test_items_file_holds_every_prediction_of_both_scorings(tiny, make_checkpoint, gpt2_enc, write_items):
    """The CLI writes, beside its result JSON, each item's label, per-ending log-likelihoods and divisors and both
    predictions of both scorings: they equal the per-item reference loop and add up to the reported counts. Its
    header says how they were scored, and the run's own items file (its final evaluation's) is left alone."""
    model, path, items = tiny
    ckpt = make_checkpoint()  # the checkpoint `tiny` loaded
    own = write_items(hellaswag_items.run_items_file(ckpt.parent, 7), [0] * len(items), [1] * len(items), step=7)
    own_bytes = own.read_bytes()
    hellaswag.main([str(ckpt), "--data", str(path), "--device", "cpu", "--batch-items", "3"])
    record = json.loads((ckpt.parent / "hellaswag_00007.json").read_text())
    assert record["items"] == str(ckpt.parent / "hellaswag_00007_items.jsonl.gz")
    assert own.read_bytes() == own_bytes and hellaswag_items.newest(ckpt.parent) == own
    read = hellaswag_items.read(record["items"])
    assert read.about["format"] == "nanoact-hellaswag-items" and read.about["step"] == 7
    assert read.about["scored_by"] == "eval/hellaswag.py" and not hellaswag_items.from_training(read)
    assert read.about["setup"] == {"compile": False, "dtype": "float32", "kernels": {}, "batch_rows": 12,
                                   "length_step": 8, "world_size": 1,
                                   "padding": "rows sorted by length, right-padded with EOT to the batch length"}
    assert read.about["n"] == len(items) and read.about["scorings"] == list(SCORINGS)
    assert read.about["data_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert read.labels == {i: item["label"] for i, item in enumerate(items)}
    ref = reference_scores(model, gpt2_enc, items)
    with gzip.open(record["items"], "rt") as f:
        lines = [json.loads(line) for line in f][1:]
    for scoring in SCORINGS:
        for i, line in enumerate(lines):
            ll, div = ref[scoring][i]
            np.testing.assert_allclose(line[scoring]["ll"], ll, rtol=1e-5, atol=1e-5)
            assert line[scoring]["div"] == [float(d) for d in div]
            assert line[scoring]["pred"] == int(np.argmax(ll))
            assert line[scoring]["pred_norm"] == int(np.argmax(np.array(ll) / np.array(div, dtype=float)))
        for metric, key in (("acc", "correct"), ("acc_norm", "correct_norm")):
            assert sum(read.correct(scoring, metric, sorted(read.labels))) == record["results"][scoring][key]
    # the continuous scores, item by item, equal a float64 recomputation from the model's logits
    # lm-eval's choices are preprocess(ending) (test_real_validation_file_parses_and_matches_lm_eval_preprocessing)
    continuation = {"completion": lambda item: [" " + e for e in item["endings"]],
                    "lm_eval": lambda item: [" " + hellaswag.preprocess(e) for e in item["endings"]]}
    for scoring in SCORINGS:
        bpbs = []
        for i, (line, item) in enumerate(zip(lines, items)):
            ll, label = np.array(ref[scoring][i][0]), item["label"]
            texts = continuation[scoring](item)
            n_bytes = [len(t.encode()) for t in texts]
            assert line[scoring]["bytes"] == n_bytes
            assert line[scoring]["tok"] == [len(gpt2_enc.encode(t)) for t in texts]
            bpbs.append(-ll[label] / n_bytes[label] / np.log(2))
            p_gold = np.exp(ll[label]) / np.exp(ll).sum()
            margin = ll[label] - np.delete(ll, label).max()
            np.testing.assert_allclose([line[scoring][k] for k in ("bpb", "p_gold", "margin")],
                                       [bpbs[-1], p_gold, margin], rtol=1e-5, atol=1e-6)
            assert read.scores[(scoring, "bpb")][i] == line[scoring]["bpb"]
        r = record["results"][scoring]
        half = 1.959964 * np.std(bpbs, ddof=1) / np.sqrt(len(bpbs))
        np.testing.assert_allclose([r["bpb"], *r["bpb_ci95"]], [np.mean(bpbs), np.mean(bpbs) - half,
                                                                np.mean(bpbs) + half], rtol=1e-5)
    assert read.values("completion", "acc", [0, 1]) == [float(x) for x in read.correct("completion", "acc", [0, 1])]


def test_lm_eval_samples_read_with_their_continuous_scores(tmp_path):
    """lm-eval's --log_samples output gives the same continuous scores from its log-likelihoods and the bytes of
    " " + choice (what lm-eval scored)."""
    lls = [[-9.0, -7.5, -8.0, -12.0], [-3.0, -4.0, -2.5, -6.0]]
    choices = ["a cat", "dogs run", "élan", "x"]
    lines = [{"doc_id": i, "doc": {"gold": 1, "choices": choices}, "filtered_resps": [[x, False] for x in ll],
              "acc": float(np.argmax(ll) == 1)} for i, ll in enumerate(lls)]
    path = tmp_path / "samples_hellaswag.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = hellaswag_items.read(path)
    assert read.scores[("lm_eval", "bpb")] == pytest.approx({0: 7.5 / 9 / np.log(2), 1: 4.0 / 9 / np.log(2)})
    assert read.scores[("lm_eval", "margin")] == pytest.approx({0: 0.5, 1: -1.5})
    assert read.scores[("lm_eval", "p_gold")][1] == pytest.approx(np.exp(-4) / np.exp(lls[1]).sum())


@pytest.mark.skipif(not REAL.is_file(), reason="../shared/assets/hellaswag not present")
def test_real_validation_file_parses_and_matches_lm_eval_preprocessing():
    items = load_items(REAL)
    assert len(items) == 10042 and {item["label"] for item in items} == {0, 1, 2, 3}
    sample = items[::50]
    for item, doc in zip(sample, lm_eval_docs(sample)):
        assert hellaswag.lm_eval_query(item) == doc["query"]
        assert [hellaswag.preprocess(e) for e in item["endings"]] == doc["choices"]
        assert item["label"] == doc["gold"]
    assert any("[" in item["ctx"] for item in sample)  # the sample exercises the bracket cleanup
