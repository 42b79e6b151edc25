"""eval/core.py: a DCLM/CORE bundle scored by nanochat's rules (item order, few-shot draws, prompts, crop, lowest
mean loss, greedy match), its continuous scores against a float64 recomputation from the model's logits, and
one-line errors for a bad bundle."""
import json
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.core_nanochat import KINDS, write_tiny_bundle
from data import DataError
from eval import core
from model import GPT
from training.checkpoint import load_checkpoint

def reference(model, enc, task, block_size):
    """Per item (correct, [ll of each option], [bytes of each option]) from one unpadded float64 forward per
    sequence: nanochat's rules restated (common token prefix/suffix, last block_size tokens kept)."""
    out = []
    for i, item in enumerate(task.items):
        ps = core.prompts(task.kind, item, core.fewshot(task.items, i, task.num_fewshot), task.delimiter)
        seqs = [[50256, *enc.encode_ordinary(p)] for p in ps]
        if task.kind == "multiple_choice":
            spans = [(len(os.path.commonprefix(seqs)), len(s)) for s in seqs]
        elif task.kind == "schema":
            suffix = len(os.path.commonprefix([s[::-1] for s in seqs]))
            spans = [(len(s) - suffix, len(s)) for s in seqs]
        else:
            seqs, spans = seqs[1:], [(len(seqs[0]), len(seqs[1]))]
        lls, n_bytes, losses, greedy = [], [], [], True
        for s, (start, end) in zip(seqs, spans):
            crop = max(0, len(s) - block_size)
            t = torch.tensor(s[crop:])
            with torch.no_grad():
                logp = F.log_softmax(model(t[None])[0][0, :, :50257].double(), -1)
            pos = torch.arange(start - crop, end - crop)
            ll = logp[pos - 1, t[pos]].sum().item()
            greedy = greedy and bool((logp[pos - 1].argmax(-1) == t[pos]).all())
            lls.append(ll)
            n_bytes.append(len(enc.decode_bytes(s[start:end])))
            losses.append(-ll / (end - start) if end > start else float("nan"))
        correct = greedy if task.kind == "language_modeling" else losses.index(min(losses)) == item["gold"]
        out.append((correct, lls, n_bytes))
    return out


def test_bundle_scores_equal_nanochat_rules_and_float64_logits(make_checkpoint, gpt2_enc, tmp_path, capsys):
    ckpt = make_checkpoint(block_size=40)  # few-shot prompts longer than 40 tokens: the crop is exercised
    model = GPT.from_checkpoint(load_checkpoint(ckpt, kind="gpt2"))
    # every kind; mc's last item has an empty continuation; lm0's continuations are the model's greedy ones
    bundle = write_tiny_bundle(tmp_path / "bundle", model=model)
    tasks = core.load_bundle(bundle)
    assert [t.label for t in tasks] == ["mc", "sch", "lm", "lm0"]
    # item order: the file's items shuffled by random.Random(1337); few-shot: Random(1234 + i) over the others
    for label, (*_, n) in KINDS.items():
        lines = [json.loads(line) for line in (bundle / "eval_data" / f"{label}.jsonl").read_text().splitlines()]
        order = list(range(n))
        random.Random(1337).shuffle(order)
        task = next(t for t in tasks if t.label == label)
        assert task.items == [lines[j] for j in order]
    mc = tasks[0]
    picks = random.Random(1234 + 3).sample([0, 1, 2, 4, 5, 6], 2)
    shots = "".join(f"{mc.items[j]['query']}: {mc.items[j]['choices'][mc.items[j]['gold']]}\n\n" for j in picks)
    assert core.prompts("multiple_choice", mc.items[3], core.fewshot(mc.items, 3, 2), ": ") == [
        f"{shots}{mc.items[3]['query']}: {c}" for c in mc.items[3]["choices"]]
    sch, lm = tasks[1].items, tasks[2].items
    assert core.prompts("schema", sch[0], [sch[2]], " ") == [
        f"{sch[2]['context_options'][sch[2]['gold']]} {sch[2]['continuation']}\n\n{c} {sch[0]['continuation']}"
        for c in sch[0]["context_options"]]
    shot = f"{lm[1]['context'].strip()} {lm[1]['continuation']}\n\n{lm[0]['context'].strip()} "
    assert core.prompts("language_modeling", lm[0], [lm[1]], " ") == [shot.strip(), shot + lm[0]["continuation"]]

    result = core.evaluate_core(model, tasks, "cpu", batch_rows=5)
    for task in tasks:
        ref = reference(model, gpt2_enc, task, 40)
        got = result["tasks"][task.label]
        assert got["items"]["correct"] == [c for c, _, _ in ref]
        gold = [item.get("gold", 0) for item in task.items]
        ll = np.array([r[1] for r in ref])
        n_bytes = np.array([r[2] for r in ref], dtype=float)
        rows = np.arange(len(ll))
        with np.errstate(divide="ignore", invalid="ignore"):
            bpb = -ll[rows, gold] / n_bytes[rows, gold] / np.log(2)
        np.testing.assert_allclose(got["items"]["bpb"], bpb, rtol=1e-5)
        if task.kind != "language_modeling":
            p_gold = np.exp(ll[rows, gold]) / np.exp(ll).sum(1)
            np.testing.assert_allclose(got["items"]["p_gold"], p_gold, rtol=1e-5)
            margin = ll[rows, gold] - np.where(np.arange(ll.shape[1]) == np.array(gold)[:, None], -np.inf, ll).max(1)
            np.testing.assert_allclose(got["items"]["margin"], margin, rtol=1e-5, atol=1e-6)
        acc = np.mean([c for c, _, _ in ref])
        assert got["acc"] == acc and got["centered"] == pytest.approx((acc - task.random_baseline / 100)
                                                                      / (1 - task.random_baseline / 100))
    assert result["core"] == pytest.approx(np.mean([r["centered"] for r in result["tasks"].values()]))
    assert any(result["tasks"]["lm0"]["items"]["correct"])  # the greedy match is not always false

    core.main([str(ckpt), "--bundle", str(bundle), "--max-per-task", "5", "--device", "cpu"])
    out = capsys.readouterr().out
    record = json.loads((ckpt.parent / "core_00007_max5.json").read_text())
    assert f"CORE {record['core']:.4f}" in out and all(r["n"] == 5 for r in record["tasks"].values())
    assert "| acc " in out and "| gold bits/byte " in out and "centered" in out


@pytest.mark.parametrize("case, message", [
    ("no bundle", "no such directory; --bundle expects a DCLM/CORE bundle directory .*eval_bundle.zip"),
    ("malformed line", r"eval_data/sch\.jsonl:3: malformed schema item: 'gold' must be an index"),
    ("bad json", r"eval_data/lm\.jsonl:2: not valid JSON"),
    ("missing file", r"eval_data/mc\.jsonl: no such file"),
    ("no baseline", r"eval_meta_data\.csv: no random baseline for task 'lm'"),
])
def test_bad_bundle_is_a_one_line_error_naming_file_and_line(tmp_path, case, message):
    bundle = write_tiny_bundle(tmp_path / "b")
    data = bundle / "eval_data"
    if case == "no bundle":
        bundle = tmp_path / "absent"
    elif case == "malformed line":
        lines = (data / "sch.jsonl").read_text().splitlines()
        lines[2] = json.dumps({**json.loads(lines[2]), "gold": 5})
        (data / "sch.jsonl").write_text("\n".join(lines) + "\n")
    elif case == "bad json":
        (data / "lm.jsonl").write_text((data / "lm.jsonl").read_text().replace("\n", "\n{oops\n", 1))
    elif case == "missing file":
        (data / "mc.jsonl").unlink()
    else:
        (bundle / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nmc,25\nsch,50\n")
    with pytest.raises(DataError, match=message) as error:
        core.load_bundle(bundle)
    assert "\n" not in str(error.value)


@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
def test_torchrun_two_ranks_equal_one_process(two_rank_runs, gpt2_enc):
    """eval/core.py under torchrun on 2 gloo ranks (tests/two_rank_runs.py: 4 items a task, rows split over the
    ranks, 3 a batch) gives every item's correctness and continuous scores, and CORE, that one process gives."""
    model = GPT.from_checkpoint(load_checkpoint(two_rank_runs / "run_gelu_0", kind="gpt2"))
    single = core.evaluate_core(model, core.load_bundle(two_rank_runs / "core_bundle", 4), "cpu", batch_rows=5)
    ddp = json.loads((two_rank_runs / "core.json").read_text())
    assert ddp["world_size"] == 2 and sorted(ddp["tasks"]) == sorted(single["tasks"]) == ["lm", "mc", "sch"]
    for label, task in single["tasks"].items():
        assert ddp["tasks"][label]["items"]["correct"] == task["items"]["correct"]
        for key in ("bpb", "p_gold", "margin"):
            np.testing.assert_allclose(ddp["tasks"][label]["items"][key], task["items"][key], rtol=1e-5, atol=1e-6)
    assert ddp["core"] == pytest.approx(single["core"])
