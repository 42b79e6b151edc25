"""eval/core.py side by side with nanochat's own CORE scorer: the same model and bundle through both, task by task.

    python bench/core_nanochat.py --nanochat /tmp/nanochat/core_eval.py              # a tiny random GPT, tiny bundle
    python bench/core_nanochat.py --nanochat /tmp/nanochat/core_eval.py --checkpoint log/aglu --bundle eval_bundle

--nanochat: karpathy/nanochat's nanochat/core_eval.py, saved anywhere (never committed here); its evaluate_example
runs over our GPT (logits cut to GPT-2's 50,257 tokens, max_seq_len = block_size) and tiktoken's GPT-2 encoding
with EOT as its BOS, on the item order eval/core.py draws (nanochat's base_eval shuffles and cuts the same way). It
needs jinja2. Without --nanochat only our side runs. Without --bundle a tiny bundle of every task kind is written
to a temporary directory (write_tiny_bundle; tests/test_core.py scores the same one). Prints per task our accuracy,
nanochat's, the largest difference and the items the two call differently; a result is in
BENCHMARKS.md, "Continuous downstream scores".
"""
import argparse
import importlib.util
import json
import random
import tempfile
from pathlib import Path

import torch

from data.tokenizer import EOT, VOCAB_SIZE, gpt2_tokenizer
from eval import core
from model import GPT, GPTConfig
from training.checkpoint import load_checkpoint

WORDS = "the man dog ball runs across field water smiles people watch while she paints wall slowly".split()


def _words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


KINDS = {  # label -> (kind, item maker, num_fewshot, delimiter, random baseline %, items)
    "mc": ("multiple_choice", lambda r: {"query": "Q: " + _words(r, 2, 8), "choices": [_words(r, 1, 5) for _ in "abc"],
                                         "gold": r.randint(0, 2)}, 2, ": ", 25.0, 7),
    "sch": ("schema", lambda r: {"context_options": [_words(r, 2, 6) for _ in "ab"], "continuation": _words(r, 1, 4),
                                 "gold": r.randint(0, 1)}, 1, " ", 50.0, 6),
    "lm": ("language_modeling", lambda r: {"context": _words(r, 2, 8) + "  ", "continuation": _words(r, 1, 3)},
           1, " ", 0.0, 6),
}


@torch.no_grad()
def greedy_words(model, context, n=2):
    """The model's greedy continuation of EOT + context, n tokens, as text without its leading space."""
    enc = gpt2_tokenizer()
    tokens = [EOT, *enc.encode_ordinary(context.strip())]
    for _ in range(n):
        tokens.append(int(model(torch.tensor([tokens]))[0][0, -1, :VOCAB_SIZE].argmax()))
    return enc.decode(tokens[-n:]).lstrip(" ")


def write_tiny_bundle(root, seed=0, scale=1, model=None):
    """A DCLM-format bundle at root: one task of each kind, scale times the items; multiple choice's last item has
    an option every other extends (its continuation is empty: nanochat's mean loss is NaN there). With `model`,
    a zero-shot language-modelling task "lm0" whose continuations are the model's greedy ones, so that the greedy
    match is not always false."""
    rng = random.Random(seed)
    (root / "eval_data").mkdir(parents=True)
    entries, meta = [], ["Eval Task,Random baseline"]
    kinds = dict(KINDS)
    if model is not None:
        kinds["lm0"] = (*KINDS["lm"][:2], 0, " ", 0.0, KINDS["lm"][5])
    for label, (kind, make, shots, delim, baseline, n) in kinds.items():
        items = [make(rng) for _ in range(n * scale)]
        if kind == "multiple_choice":
            items[-1] = {"query": "Q: the dog", "choices": ["runs", "runs across the field", "runs slowly"], "gold": 1}
        if label == "lm0":
            items = [{**item, "continuation": greedy_words(model, item["context"])} for item in items]
        (root / "eval_data" / f"{label}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
        entries.append(f"  - label: {label}\n    dataset_uri: {label}.jsonl\n    num_fewshot: [{shots}]\n"
                       f"    icl_task_type: {kind}\n    continuation_delimiter: {json.dumps(delim)}\n")
        meta.append(f"{label},{baseline}")
    (root / "core.yaml").write_text("icl_tasks:\n" + "".join(entries))
    (root / "eval_meta_data.csv").write_text("\n".join(meta) + "\n")
    return root


class NanochatModel:
    """Our GPT as nanochat's forward_model calls it: model(ids) -> (B, T, vocab) logits, max_seq_len."""

    def __init__(self, model):
        self.model, self.max_seq_len = model, model.config.block_size

    def __call__(self, ids):
        return self.model(ids)[0][..., :VOCAB_SIZE].float().contiguous()


class NanochatTokenizer:
    """tiktoken's GPT-2 encoding as nanochat's tokenizer(prompts, prepend=bos) and get_bos_token_id()."""

    def __init__(self):
        self.enc = gpt2_tokenizer()

    def get_bos_token_id(self):
        return EOT

    def __call__(self, texts, prepend=None):
        return [([prepend] if prepend is not None else []) + self.enc.encode_ordinary(t) for t in texts]


def random_model(seed=0):
    """A tiny GPT with GPT-2's vocabulary and weights scaled up, so that options score distinctly."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32), seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    return model.eval()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanochat", help="path of nanochat's nanochat/core_eval.py")
    p.add_argument("--checkpoint", help="a checkpoint or run directory (default: a tiny random GPT)")
    p.add_argument("--bundle", help="a DCLM-format bundle (default: a tiny one written to a temporary directory)")
    p.add_argument("--max-per-task", type=int)
    p.add_argument("--scale", type=int, default=1, help="the tiny bundle's items, times this")
    args = p.parse_args(argv)
    model = GPT.from_checkpoint(load_checkpoint(args.checkpoint, kind="gpt2")) if args.checkpoint else random_model()
    theirs = None
    if args.nanochat:
        spec = importlib.util.spec_from_file_location("nanochat_core_eval", args.nanochat)
        theirs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(theirs)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or write_tiny_bundle(Path(tmp) / "bundle", scale=args.scale, model=model)
        tasks = core.load_bundle(bundle, args.max_per_task)
        ours = core.evaluate_core(model, tasks, "cpu")
    print(f"{'task':24s} {'kind':18s} {'n':>5s} {'ours':>8s} {'nanochat':>9s} {'|diff|':>8s}  items called differently")
    worst = 0.0
    for task in tasks:
        mine = ours["tasks"][task.label]
        line = f"{task.label:24s} {task.kind:18s} {mine['n']:5d} {mine['acc']:8.4f}"
        if theirs is not None:
            meta = {"task_type": task.kind, "num_fewshot": task.num_fewshot,
                    "continuation_delimiter": task.delimiter}
            right = [bool(theirs.evaluate_example(i, NanochatModel(model), NanochatTokenizer(), task.items, "cpu",
                                                  meta)) for i in range(len(task.items))]
            acc = sum(right) / len(right)
            differ = [i for i, (a, b) in enumerate(zip(mine["items"]["correct"], right)) if a != b]
            worst = max(worst, abs(acc - mine["acc"]))
            line += f" {acc:9.4f} {abs(acc - mine['acc']):8.1e}  {differ or 'none'}"
        print(line)
    print(f"CORE ours {ours['core']:.4f}" + (f"; largest per-task |difference| {worst:.1e}" if theirs else
                                             "; nanochat not run (give --nanochat path/to/core_eval.py)"))


if __name__ == "__main__":
    main()
