"""HellaSwag zero-shot accuracy of a nanoact checkpoint (or a transformers GPT-2), scored two ways.

    python eval/hellaswag.py log/aglu/model_19072.pt      # both scorings, all 10,042 validation items
    python eval/hellaswag.py log/aglu --limit 1000        # a run directory means its newest checkpoint
    python eval/hellaswag.py --hf path/to/gpt2_dir        # transformers GPT2LMHeadModel weights
    torchrun --nproc_per_node 8 eval/hellaswag.py log/aglu # items split over ranks, counts all-reduced

completion (karpathy/build-nanogpt): tokens of `ctx`, then of `" " + ending`; the loss is summed over
    the ending tokens only. acc: lowest summed loss; acc_norm: lowest mean per-token loss.
lm_eval (lm-evaluation-harness 0.4 `hellaswag` task, lm_eval/tasks/hellaswag/utils.py): context
    preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), continuation
    " " + preprocess(ending), tokenized as lm-eval's TemplateLM._encode_pair does. acc: highest summed
    log-likelihood; acc_norm: highest log-likelihood / len(preprocess(ending)) in characters (lm-eval's
    ConfigurableTask.process_results divides by the length of the choice, without the leading space).
Intervals are 95% Wilson score intervals (at n = 10,042 and 30% about +-0.9 points).
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from data import DataError
from data.tokenizer import TokenizerError, gpt2_tokenizer
from eval.scoring import block_size_of, bucket, row_length, score_rows
from eval.stats import wilson

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
FIELDS = ("ctx", "ctx_a", "ctx_b", "activity_label", "endings", "label")
SCORINGS = ("completion", "lm_eval")


def cache_dir():
    return Path(os.environ.get("NANOACT_CACHE") or Path.home() / ".cache" / "nanoact")


def download(url=URL):
    """The validation jsonl, fetched once into the cache (atomically, so concurrent ranks are safe)."""
    path = cache_dir() / "hellaswag_val.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=30) as r, open(tmp, "wb") as f:
            f.write(r.read())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"cannot download {url} ({e}); offline? pass --data path/to/hellaswag_val.jsonl") from None
    os.replace(tmp, path)
    return path


def check_item(item):
    """None if `item` is a well-formed HellaSwag record, else what is wrong with it."""
    if not isinstance(item, dict):
        return "not a JSON object"
    missing = [k for k in FIELDS if k not in item]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    bad = [k for k in FIELDS[:4] if not isinstance(item[k], str)]
    if bad:
        return f"field(s) {', '.join(bad)} must be strings"
    endings = item["endings"]
    if not (isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) and e for e in endings)):
        return "'endings' must be a list of 4 non-empty strings"
    label = item["label"]
    if isinstance(label, bool) or str(label) not in ("0", "1", "2", "3"):
        return f"'label' must be 0, 1, 2 or 3, got {label!r}"
    return None


def load_items(path, limit=None):
    """The first `limit` items of a HellaSwag jsonl, each checked; labels become ints."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; pass --data path/to/hellaswag_val.jsonl or omit it to download")
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); is this a HellaSwag jsonl file?") from None
            problem = check_item(item)
            if problem:
                raise DataError(f"{path}:{lineno}: malformed HellaSwag item: {problem}")
            items.append({**item, "label": int(item["label"])})
    if not items:
        raise DataError(f"{path}: no items")
    return items


def preprocess(text):
    """lm-eval's hellaswag text cleanup; the brackets are WikiHow artifacts ([title], [step], ...)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def lm_eval_query(item):
    return preprocess(item["activity_label"] + ": " + item["ctx_a"] + " " + item["ctx_b"].capitalize())


def build_requests(enc, items, scoring):
    """(context tokens, 4 continuation token lists, 4 acc_norm divisors or None = token counts) per item.

    All strings go through one threaded encode_ordinary_batch: on a GPU, tokenizing 10,042 items one
    by one would be a noticeable share of the evaluation. For lm_eval the continuation tokens are, as
    in lm-eval's causal TemplateLM._encode_pair, those of context + continuation after the context's
    own tokens (trailing spaces of the context moved to the continuation), so BPE merges across the
    boundary come out exactly as in lm-eval.
    """
    if scoring == "completion":
        texts = [(item["ctx"], *(" " + e for e in item["endings"])) for item in items]
        divisors = [None] * len(items)
    else:
        texts, divisors = [], []
        for item in items:
            query, choices = lm_eval_query(item), [preprocess(e) for e in item["endings"]]
            texts.append((query.rstrip(), *(query + " " + c for c in choices)))
            divisors.append([float(len(c)) for c in choices])
    tokens = enc.encode_ordinary_batch([s for t in texts for s in t])
    requests = []
    for i, div in enumerate(divisors):
        ctx, rest = tokens[5 * i], tokens[5 * i + 1:5 * i + 5]
        requests.append((ctx, rest if scoring == "completion" else [whole[len(ctx):] for whole in rest], div))
    return requests


def score_items(model, requests, device, batch_items=32, autocast=None, progress=True, rank=0, world_size=1):
    """Summed log-likelihood and token count of every ending, for this rank's share of the items.

    Items are sorted by length and cut into groups of batch_items * world_size; each rank scores its
    slice of every group in one (4 * batch_items, L) forward, L bucketed from the group's longest row,
    so every rank runs the same sequence of shapes (no rank waits on a different compile).
    Returns (item indices, loglik (n, 4) float64, token counts (n, 4)).
    """
    block_size = block_size_of(model)
    lengths = [max(row_length(ctx, c, block_size) for c in conts) for ctx, conts, _ in requests]
    order = sorted(range(len(requests)), key=lambda i: -lengths[i])
    group = batch_items * world_size
    mine, logliks, counts = [], [], []
    for start in tqdm(range(0, len(order), group), desc="hellaswag", unit="batch", disable=not progress, leave=False):
        chunk = order[start:start + group]
        length = bucket(lengths[chunk[0]], block_size)
        share = chunk[rank * batch_items:(rank + 1) * batch_items]
        rows = [(requests[i][0], c) for i in share for c in requests[i][1]]
        ll, n, _ = score_rows(model, rows, length, 4 * batch_items, device, autocast)
        mine += share
        logliks.append(ll.view(-1, 4))
        counts.append(n.view(-1, 4))
    return mine, torch.cat(logliks), torch.cat(counts)


def evaluate_model(model, device, data_path=None, limit=None, scoring="both", dist_info=None, autocast=None,
                   progress=True, batch_items=32):
    """HellaSwag accuracies: {"completion": {acc, acc_norm, n, acc_ci95, acc_norm_ci95, ...}, "lm_eval": {...}}.

    Under torchrun pass dist_info (training.distributed.Dist): each rank scores a slice of the items and
    the correct counts are all-reduced, so every rank returns the same numbers. The model may be
    torch.compile'd; it is put in eval mode (ANAct uses its running statistics) and restored after.
    """
    if scoring not in (*SCORINGS, "both"):
        raise ValueError(f"unknown scoring {scoring!r}; choose completion, lm_eval or both")
    rank, world = (dist_info.rank, dist_info.world_size) if dist_info is not None else (0, 1)
    items = load_items(data_path or download(), limit)
    enc = gpt2_tokenizer()
    was_training = model.training
    model.eval()
    results = {}
    try:
        for name in SCORINGS if scoring == "both" else (scoring,):
            requests = build_requests(enc, items, name)
            t0 = time.time()
            idx, ll, n_tok = score_items(model, requests, device, batch_items, autocast, progress and rank == 0,
                                         rank, world)
            if name == "completion":
                norm = n_tok.double()
            else:
                norm = torch.tensor([requests[i][2] for i in idx], dtype=torch.float64).view(-1, 4)
            gold = torch.tensor([items[i]["label"] for i in idx], dtype=torch.long)
            # argmax returns the first maximum on ties, as numpy's argmax in lm-eval does
            counts = torch.tensor([(ll.argmax(1) == gold).sum().item(), ((ll / norm).argmax(1) == gold).sum().item(),
                                   len(idx)], dtype=torch.long, device=device)
            if world > 1:
                dist.all_reduce(counts)
            k_acc, k_norm, n = counts.tolist()
            results[name] = {"acc": k_acc / n, "acc_norm": k_norm / n, "n": n, "acc_ci95": wilson(k_acc, n),
                             "acc_norm_ci95": wilson(k_norm, n), "correct": k_acc, "correct_norm": k_norm,
                             "interval": "wilson", "seconds": time.time() - t0}
    finally:
        model.train(was_training)
    return results


def result_path(args, ckpt):
    if args.out:
        return Path(args.out)
    suffix = f"_limit{args.limit}" if args.limit else ""
    if ckpt is None:
        return Path(args.hf) / f"hellaswag{suffix}.json"
    return Path(ckpt["path"]).parent / f"hellaswag_{ckpt['step']:05d}{suffix}.json"


def main(argv=None):
    from training import distributed
    from training.checkpoint import CheckpointError, load_gpt
    from training.precision import autocast_context, resolve_precision
    from model import GPT

    p = argparse.ArgumentParser(description="HellaSwag zero-shot accuracy (validation set) of a nanoact GPT-2.")
    p.add_argument("checkpoint", nargs="?", help="checkpoint file, or run directory (its newest checkpoint)")
    p.add_argument("--hf", metavar="DIR", help="evaluate a transformers GPT-2 directory instead")
    p.add_argument("--data", help="HellaSwag jsonl (default: download hellaswag_val.jsonl into $NANOACT_CACHE)")
    p.add_argument("--limit", type=int, help="only the first N items")
    p.add_argument("--scoring", choices=(*SCORINGS, "both"), default="both")
    p.add_argument("--batch-items", type=int, default=32, help="items per forward (4 rows each)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 autocast on CUDA), float32 or bfloat16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first")
    p.add_argument("--out", help="result JSON (default: hellaswag_<step>.json beside the checkpoint)")
    args = p.parse_args(argv)
    if (args.checkpoint is None) == (args.hf is None):
        p.error("give either a checkpoint (file or run directory) or --hf DIR")
    if (args.limit is not None and args.limit < 1) or args.batch_items < 1:
        p.error("--limit and --batch-items must be >= 1")

    d = distributed.setup(args.device)
    try:
        try:
            if args.hf:
                model, ckpt = GPT.from_pretrained(args.hf).to(d.device).eval(), None
            else:
                model, ckpt = load_gpt(args.checkpoint, d.device)
            autocast = autocast_context(d.device_type, resolve_precision(args.dtype, d.device_type))
            data = args.data or download()  # before the forward passes: a missing file fails fast
            if args.compile:
                model = torch.compile(model, dynamic=False)  # one static graph per length bucket (3)
            results = evaluate_model(model, d.device, data, args.limit, args.scoring, d, autocast, True,
                                     args.batch_items)
        except (CheckpointError, DataError, TokenizerError, OSError, ValueError) as e:
            sys.exit(f"error: {e}")
        if d.master:
            for name, r in results.items():
                print(f"hellaswag {name:10s} | acc {r['acc']:.4f} [{r['acc_ci95'][0]:.4f}, {r['acc_ci95'][1]:.4f}] "
                      f"| acc_norm {r['acc_norm']:.4f} [{r['acc_norm_ci95'][0]:.4f}, {r['acc_norm_ci95'][1]:.4f}] "
                      f"| n {r['n']} | {r['seconds']:.1f}s   (95% Wilson intervals)")
            out = result_path(args, ckpt)
            record = {"checkpoint": ckpt and ckpt["path"], "hf": args.hf, "step": ckpt and ckpt["step"],
                      "data": str(data), "limit": args.limit, "dtype": args.dtype, "world_size": d.world_size,
                      "results": results}
            out.write_text(json.dumps(record, indent=2) + "\n")
            print(f"wrote {out}")
    finally:
        distributed.cleanup(d)


if __name__ == "__main__":
    main()
