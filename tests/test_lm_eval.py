"""eval/lm_eval_model.py: the lm-eval adapter's log-likelihoods, rolling log-likelihoods and greedy
generations equal direct computations on our model, and local task yamls run offline end to end,
through lm-eval's evaluator and through the `python -m eval.lm_eval_model` CLI entry."""
import functools
import json
import logging
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from eval import hellaswag_items  # noqa: E402
from eval.compare_items import compare  # noqa: E402
from eval.hellaswag import evaluate_model  # noqa: E402
from eval.lm_eval_model import NanoactLM  # noqa: E402
from model import GPT  # noqa: E402
from training.checkpoint import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def instances(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def token_logprobs(model, tokens):
    """float64 log p(tokens[t] | tokens[:t]) for t >= 1, one unpadded forward over the real vocabulary."""
    with torch.no_grad():
        logits, _ = model(torch.tensor(tokens[:-1])[None])
    logp = F.log_softmax(logits[0, :, :50257].double(), -1)
    return logp.gather(1, torch.tensor(tokens[1:])[:, None])[:, 0], logits[0, :, :50257].argmax(-1)


@pytest.fixture
def lm(make_checkpoint, gpt2_enc):
    # an unpadded vocabulary, so GPT.generate(top_k=1) is greedy over exactly the tokens the adapter sees
    return NanoactLM(checkpoint=str(make_checkpoint(vocab_size=50257, block_size=64)), device="cpu", batch_size=3)


def test_loglikelihood_equals_direct_logprobs(lm, gpt2_enc):
    enc = gpt2_enc
    long_ctx = " ".join(["the dog runs across the field"] * 20)  # > block_size: cut on the left
    pairs = [("The man picks up a knife", " and cuts the onion."), ("Question: where? Answer: ", "kitchen"),
             ("", "Hello world"), (long_ctx, " then stops."), ("A", " b c d e f g h")]
    got = lm.loglikelihood(instances("loglikelihood", pairs))
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        if ctx:
            ctx, cont = ctx.rstrip(), ctx[len(ctx.rstrip()):] + cont  # lm-eval moves trailing spaces
            ctx_tok = enc.encode(ctx)
            cont_tok = enc.encode(ctx + cont)[len(ctx_tok):]
        else:
            ctx_tok, cont_tok = [50256], enc.encode(cont)
        tokens = (ctx_tok + cont_tok)[-(64 + 1):]
        logp, argmax = token_logprobs(lm.model, tokens)
        n = len(cont_tok)
        assert ll == pytest.approx(logp[-n:].sum().item(), rel=1e-5, abs=1e-5)
        assert greedy == bool((argmax[-n:] == torch.tensor(tokens[-n:])).all())
    # a continuation made of the model's own greedy tokens is reported greedy
    ctx_tok = enc.encode("The woman smiles")
    tokens = lm.greedy([ctx_tok], [4], [[]])[0]
    ll, greedy = lm.loglikelihood(instances("loglikelihood", [("The woman smiles", enc.decode(tokens))]))[0]
    assert greedy or enc.encode("The woman smiles" + enc.decode(tokens)) != ctx_tok + tokens  # BPE re-merge


def test_loglikelihood_rolling_is_summed_token_nll(lm, gpt2_enc):
    short = "The quick brown fox jumps over the lazy dog."
    long = " ".join(f"sentence number {i} is here." for i in range(40))  # ~240 tokens: 4 windows of 64
    got = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(short,), (long,)]))
    for text, total in zip((short, long), got):
        tokens = [50256] + gpt2_enc.encode(text)
        # disjoint windows of 64 predictions; the last one, shorter, is given a full 64 tokens of context
        expected = 0.0
        for start in range(0, len(tokens) - 1, 64):
            n_pred = min(64, len(tokens) - 1 - start)
            expected += token_logprobs(lm.model, tokens[:start + n_pred + 1][-65:])[0][-n_pred:].sum().item()
        assert total == pytest.approx(expected, rel=1e-5)


def test_generate_until_equals_greedy_generate(lm, gpt2_enc):
    prompts = ["Once upon a time", "The dog", "In the kitchen, the man picks up"]
    args = [(p, {"until": [stop], "max_gen_toks": 12}) for p, stop in zip(prompts, ["\n", "zzz", "the"])]
    got = lm.generate_until(instances("generate_until", args))
    for (prompt, kwargs), text in zip(args, got):
        idx = torch.tensor(gpt2_enc.encode(prompt))[None]
        ref = lm.model.generate(idx, 12, top_k=1)[0, idx.size(1):].tolist()
        ref = ref[:ref.index(50256)] if 50256 in ref else ref
        assert text == gpt2_enc.decode(ref).split(kwargs["until"][0])[0]
    long_prompt = " ".join(["word"] * 100)  # longer than block_size: cropped like GPT.generate
    text = lm.generate_until(instances("generate_until", [(long_prompt, {"until": [], "max_gen_toks": 3})]))[0]
    idx = torch.tensor(gpt2_enc.encode(long_prompt))[None]
    assert text == gpt2_enc.decode(lm.model.generate(idx, 3, top_k=1)[0, idx.size(1):].tolist())
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until(instances("generate_until", [("x", {"do_sample": True})]))


def docs_task_yaml(hellaswag_path):
    """The offline hellaswag task yaml of docs/evaluation.md, pointed at `hellaswag_path`."""
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    start = doc.index("# my_tasks/hellaswag_local.yaml")
    text = doc[start:doc.index("```", start)]
    assert "validation: /data/hellaswag_val.jsonl" in text
    return text.replace("/data/hellaswag_val.jsonl", str(hellaswag_path))


def write_tasks(directory, hellaswag_path):
    """Three offline task yamls: the docs' (lm-eval's hellaswag recipe on a local jsonl), a
    rolling-perplexity task and a generation task (dataset_path: json + data_files, the way to run
    lm-eval offline)."""
    docs = directory / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in [
        {"text": "The cat sat on the mat. " * 12, "prompt": "Q: What is 2+2?\nA:", "answer": " 4"},
        {"text": "A short line.", "prompt": "The colour of the sky is", "answer": " blue"},
    ]))
    (directory / "utils.py").write_text("from lm_eval.tasks.hellaswag.utils import process_docs  # noqa: F401\n")
    common = "dataset_path: json\ndataset_name: null\n"
    (directory / "hellaswag_local.yaml").write_text(docs_task_yaml(hellaswag_path))
    (directory / "text_local.yaml").write_text(
        f"task: text_local\n{common}dataset_kwargs:\n  data_files:\n    test: {docs}\n"
        'output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n")
    (directory / "gen_local.yaml").write_text(
        f"task: gen_local\n{common}dataset_kwargs:\n  data_files:\n    test: {docs}\n"
        'output_type: generate_until\ntest_split: test\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return [json.loads(line) for line in docs.read_text().splitlines()]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


NO_ENV_REPORT = "not collected in the tests"


@pytest.fixture
def no_env_report(monkeypatch):
    """lm-eval's evaluator adds torch's environment report to its results (torch.utils.collect_env runs pip
    list, lscpu, nvidia-smi: ~0.7 CPU-s per evaluation). That report is lm-eval's, not our adapter's, and no
    test reads it."""
    monkeypatch.setattr("torch.utils.collect_env.get_pretty_env_info", lambda: NO_ENV_REPORT)


def test_local_tasks_through_lm_eval_evaluator(lm, gpt2_enc, hellaswag_file, tmp_path, offline, no_env_report,
                                                 caplog):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    hs = hellaswag_file(n=10)
    docs = write_tasks(tmp_path, hs)
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # skip indexing lm-eval's 10k yamls
    with caplog.at_level(logging.WARNING, logger="lm_eval"):
        out = simple_evaluate(model=lm, tasks=["hellaswag_local", "text_local", "gen_local"], task_manager=tasks,
                              log_samples=True, bootstrap_iters=0)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # the docs' yaml too
    res = out["results"]
    ours = evaluate_model(lm.model, "cpu", hs, scoring="lm_eval", progress=False, batch_items=4)["lm_eval"]
    assert res["hellaswag_local"]["acc,none"] == pytest.approx(ours["acc"])
    assert res["hellaswag_local"]["acc_norm,none"] == pytest.approx(ours["acc_norm"])
    rolling = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(d["text"],) for d in docs]))
    n_bytes = sum(len(d["text"].encode()) for d in docs)
    assert res["text_local"]["bits_per_byte,none"] == pytest.approx(-sum(rolling) / n_bytes / math.log(2), rel=1e-6)
    generated = lm.generate_until(instances("generate_until", [(d["prompt"], {"until": ["\n"], "max_gen_toks": 6})
                                                               for d in docs]))
    samples = sorted(out["samples"]["gen_local"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == generated


@pytest.mark.long
# runpy's note that eval.lm_eval_model is imported already (this file imports it): the module runs again as __main__
@pytest.mark.filterwarnings("ignore:'eval.lm_eval_model' found in sys.modules:RuntimeWarning")
def test_cli_entry_registers_model_and_runs_offline(make_checkpoint, hellaswag_file, gpt2_enc, tmp_path, monkeypatch,
                                                    no_env_report):
    """... and its --log_samples file reads as eval/hellaswag.py's items file: item by item the same predictions."""
    import runpy

    import datasets
    import lm_eval.tasks
    import lm_eval.utils
    from huggingface_hub import constants
    from lm_eval.api.registry import model_registry

    ckpt, hs = make_checkpoint(), hellaswag_file(n=6)
    write_tasks(tmp_path, hs)
    # `python -m eval.lm_eval_model ...` in this process (a child's imports of lm-eval and transformers cost
    # seconds), offline: datasets and huggingface_hub read HF_DATASETS_OFFLINE / HF_HUB_OFFLINE once, at their
    # import, into these constants. lm-eval's TaskManager skips indexing its ~14,700 bundled task yamls (~40 s on 2
    # cores; the local task needs none of them), nor is its environment report collected (no_env_report). The
    # module registers "nanoact" anew as __main__ (the name is freed for it), and lm-eval's logging set-up (a
    # handler, no propagation to the root logger) is undone afterwards.
    for name, value in (("HF_DATASETS_OFFLINE", datasets.config), ("HF_HUB_OFFLINE", constants)):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(value, name, True)
    monkeypatch.setattr(lm_eval.tasks.TaskManager, "__init__", functools.partialmethod(
        lm_eval.tasks.TaskManager.__init__, include_defaults=False))
    monkeypatch.delitem(model_registry._objs, "nanoact")
    monkeypatch.setattr(sys, "argv", [
        "-m", "--model", "nanoact", "--model_args", f"checkpoint={ckpt.parent}", "--batch_size", "8", "--tasks",
        "hellaswag_local", "--include_path", str(tmp_path), "--device", "cpu", "--output_path",
        str(tmp_path / "results"), "--log_samples"])
    logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", lm_eval.utils._LOGGING_CONFIGURED)
    level = logger.level
    try:
        runpy.run_module("eval.lm_eval_model", run_name="__main__", alter_sys=True)
    finally:
        logger.setLevel(level)
    written = list((tmp_path / "results").rglob("results_*.json"))
    assert len(written) == 1
    acc = json.loads(written[0].read_text())["results"]["hellaswag_local"]["acc,none"]
    assert acc in [k / 6 for k in range(7)]
    samples = list((tmp_path / "results").rglob("samples_hellaswag_local_*.jsonl"))
    theirs = hellaswag_items.read(samples[0])
    model = GPT.from_checkpoint(load_checkpoint(ckpt, kind="gpt2"))
    evaluate_model(model, "cpu", hs, scoring="lm_eval", progress=False, items_file=tmp_path / "ours.jsonl.gz")
    ours = hellaswag_items.read(tmp_path / "ours.jsonl.gz")
    assert theirs.labels == ours.labels and theirs.about["source"] == "lm-eval --log_samples"
    for metric in ("acc", "acc_norm"):
        assert theirs.preds[("lm_eval", metric)] == ours.preds[("lm_eval", metric)]
    rows = compare(ours, theirs)
    assert [r["discordant"] for r in rows] == [0, 0] and rows[0]["acc_a"] == pytest.approx(acc)


def test_bad_model_args(make_checkpoint):
    with pytest.raises(ValueError, match="checkpoint=PATH"):
        NanoactLM(device="cpu")
    with pytest.raises(ValueError, match="positive integer"):
        NanoactLM(checkpoint=str(make_checkpoint()), device="cpu", batch_size="auto")


@pytest.mark.parametrize("act", ["gelu", "aglu", "swiglu"])  # a plain GPT2LMHeadModel, remote code, a gated MLP
def test_export_runs_in_lm_evals_own_hf_model(make_checkpoint, hellaswag_file, gpt2_enc, tmp_path, offline,
                                              no_env_report, act):
    """`lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True` on an export with no other flag:
    the tokenizer comes from the export itself, and the scores are our adapter's on the checkpoint."""
    pytest.importorskip("accelerate")  # lm-eval's hf model imports it
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from export import to_transformers

    ckpt, out = make_checkpoint(act=act), tmp_path / "hf"
    to_transformers.main([str(ckpt), str(out)])
    write_tasks(tmp_path, hellaswag_file(n=8))
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)
    results = {}
    for name, model, model_args in [("hf", "hf", f"pretrained={out},trust_remote_code=True"),
                                    ("ours", NanoactLM(checkpoint=str(ckpt), device="cpu", batch_size=4), None)]:
        results[name] = simple_evaluate(model=model, model_args=model_args, task_manager=tasks, batch_size=4,
                                        tasks=["hellaswag_local", "text_local", "gen_local"], device="cpu",
                                        bootstrap_iters=0, log_samples=True)
    hf, ours = results["hf"]["results"], results["ours"]["results"]
    for metric in ("acc,none", "acc_norm,none"):
        assert hf["hellaswag_local"][metric] == ours["hellaswag_local"][metric]
    assert hf["text_local"]["bits_per_byte,none"] == pytest.approx(ours["text_local"]["bits_per_byte,none"], rel=1e-4)
    # greedy generation of a batch of prompts of different lengths: lm-eval's hf model pads them on the left
    generated = {name: [s["resps"][0][0] for s in sorted(r["samples"]["gen_local"], key=lambda s: s["doc_id"])]
                 for name, r in results.items()}
    assert generated["hf"] == generated["ours"] and all(generated["hf"])
