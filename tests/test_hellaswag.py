"""eval/hellaswag.py: the packed scorer equals a plain per-item loop for both scorings, lm-eval's
preprocessing is reproduced exactly, DDP shards add up, and bad input fails with a clear message."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from eval import hellaswag
from eval.hellaswag import DataError, evaluate_model, load_items, score_items
from eval.stats import wilson
from training.checkpoint import load_gpt
REAL = Path(__file__).resolve().parents[2] / "shared" / "assets" / "hellaswag" / "hellaswag_val.jsonl"


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
    torch.set_num_threads(2)
    model, _ = load_gpt(make_checkpoint())
    path = hellaswag_file(n=11)
    return model, path, load_items(path)


def test_packed_scorer_equals_per_item_loop(tiny, gpt2_enc):
    model, path, items = tiny
    ref = reference_scores(model, gpt2_enc, items)
    for scoring in ("completion", "lm_eval"):
        requests = hellaswag.build_requests(gpt2_enc, items, scoring)
        # 3 items per forward: several batches, a padded last one, two length buckets
        idx, ll, n_tok = score_items(model, requests, "cpu", batch_items=3, progress=False)
        assert sorted(idx) == list(range(len(items)))
        ref_ll = torch.tensor([ref[scoring][i][0] for i in idx], dtype=torch.float64)
        torch.testing.assert_close(ll, ref_ll, rtol=1e-5, atol=1e-5)
        if scoring == "completion":  # acc_norm divides by the token count ...
            assert n_tok.tolist() == [ref[scoring][i][1] for i in idx]
        else:  # ... or by the characters of the choice without its leading space
            assert [requests[i][2] for i in idx] == [ref[scoring][i][1] for i in idx]
    result = evaluate_model(model, "cpu", path, scoring="both", progress=False, batch_items=4)
    gold = np.array([item["label"] for item in items])
    for scoring in ("completion", "lm_eval"):
        ll = np.array([r[0] for r in ref[scoring]])
        div = np.array([r[1] for r in ref[scoring]], dtype=float)
        acc = np.mean(np.argmax(ll, 1) == gold)  # highest log-likelihood == lowest summed loss
        acc_norm = np.mean(np.argmax(ll / div, 1) == gold)
        r = result[scoring]
        assert r["n"] == len(items) and r["acc"] == pytest.approx(acc) and r["acc_norm"] == pytest.approx(acc_norm)
        assert r["acc_ci95"] == pytest.approx(wilson(r["correct"], len(items)))
    # the predictions are not degenerate: the scorings disagree somewhere and acc_norm differs from acc
    preds = {s: [np.argmax(np.array(ll) / np.array(d, dtype=float)) for ll, d in ref[s]] for s in ref}
    assert preds["completion"] != preds["lm_eval"]


def test_rank_shards_cover_items_once_with_equal_shapes(tiny, gpt2_enc, monkeypatch):
    model, _, items = tiny
    requests = hellaswag.build_requests(gpt2_enc, items, "lm_eval")
    idx, ll, _ = score_items(model, requests, "cpu", batch_items=2, progress=False)
    full = dict(zip(idx, ll))
    shapes = {0: [], 1: [], 2: []}
    seen = {}
    real_score_rows = hellaswag.score_rows
    for rank in range(3):
        def spy(model, rows, length, n_rows, *args, rank=rank):
            shapes[rank].append((n_rows, length))
            return real_score_rows(model, rows, length, n_rows, *args)
        monkeypatch.setattr(hellaswag, "score_rows", spy)
        idx, ll, _ = score_items(model, requests, "cpu", batch_items=2, progress=False, rank=rank, world_size=3)
        seen.update({i: ll[k] for k, i in enumerate(idx)})
    assert shapes[0] == shapes[1] == shapes[2]  # every rank runs the same forwards (compile, collectives)
    assert sorted(seen) == list(range(len(items)))
    for i in range(len(items)):
        torch.testing.assert_close(seen[i], full[i], rtol=1e-6, atol=1e-5)


def test_torchrun_two_ranks_equal_one_process(tiny, make_checkpoint, hellaswag_file, tmp_path):
    model, path, _ = tiny
    ckpt = make_checkpoint()  # the checkpoint `tiny` loaded
    single = evaluate_model(model, "cpu", path, progress=False, batch_items=2)
    out = tmp_path / "ddp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "eval/hellaswag.py",
           str(ckpt), "--data", str(path), "--device", "cpu", "--batch-items", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = json.loads(out.read_text())
    assert ddp["world_size"] == 2
    for scoring in ("completion", "lm_eval"):
        for key in ("n", "correct", "correct_norm"):
            assert ddp["results"][scoring][key] == single[scoring][key]


def test_scores_in_eval_mode_and_restores_training_mode(make_checkpoint, hellaswag_file, gpt2_enc):
    """NSwish in training mode would fold every scored batch into its running statistics."""
    model, _ = load_gpt(make_checkpoint(act="nswish"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    r = evaluate_model(model, "cpu", hellaswag_file(n=5), scoring="completion", progress=False)
    assert model.training and r["completion"]["n"] == 5 and set(r) == {"completion"}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


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
    assert "acc_norm" in capsys.readouterr().out
    other = tmp_path / "translation.pt"
    torch.save({"kind": "translation", "model": {}}, other)
    for bad, message in [(tmp_path / "missing.pt", "no such checkpoint file"), (other, "a 'translation' checkpoint")]:
        with pytest.raises(SystemExit, match=message):
            hellaswag.main([str(bad), "--data", str(data)])
    with pytest.raises(SystemExit, match="no such file; pass --data"):
        hellaswag.main([str(ckpt), "--data", str(tmp_path / "nope.jsonl")])


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
