"""HellaSwag zero-shot accuracy of a nanoact checkpoint (or a transformers GPT-2), scored two ways.

    python eval/hellaswag.py log/aglu/model_19073.pt      # the README recipe's last checkpoint: both scorings,
                                                          # all 10,042 validation items
    python eval/hellaswag.py log/aglu --limit 1000        # a run directory means its newest checkpoint
    python eval/hellaswag.py --hf path/to/gpt2_dir        # transformers GPT2LMHeadModel weights
    torchrun --nproc_per_node 8 eval/hellaswag.py log/aglu # rows split over ranks, log-likelihoods all-reduced

Beside both accuracies, the continuous scores of the same log-likelihoods (eval/continuous.py): the
gold ending's bits per byte (the one printed, the one the in-loop HellaSwag logs as hellaswag_bpb), its probability
among the four endings and its margin over the best distractor; at small scale they move while accuracy sits at
chance (docs/evaluation.md).

completion (karpathy/build-nanogpt): tokens of `ctx`, then of `" " + ending`; the loss is summed over
    the ending tokens only. acc: lowest summed loss; acc_norm: lowest mean per-token loss.
lm_eval (lm-evaluation-harness 0.4 `hellaswag` task, lm_eval/tasks/hellaswag/utils.py): context
    preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), continuation
    " " + preprocess(ending), tokenized as lm-eval's TemplateLM._encode_pair does. acc: highest summed
    log-likelihood; acc_norm: highest log-likelihood / len(preprocess(ending)) in characters (lm-eval's
    ConfigurableTask.process_results divides by the length of the choice, without the leading space).
Intervals are 95% Wilson score intervals (at n = 10,042 and 30% about +-0.9 points): the noise of one
accuracy. Two models scored on the same items differ by much less noise than two such intervals suggest: each
score comes with its items file (hellaswag_<step>_items.jsonl.gz, eval/hellaswag_items.py: every item's label,
per-ending log-likelihoods and predictions, both scorings, and a header saying how they were computed), and
`python -m eval.compare_items A B` gives the paired difference, its exact McNemar p-value and 95% interval. A
training run's final evaluation writes its own items file under another name (hellaswag_items_<step>.jsonl.gz):
this command never overwrites it.

Both scorings come from ONE pass: every (context, continuation) row either needs, de-duplicated (the two
scorings' contexts differ from the first token, `ctx` vs `activity_label: ...`, so they share no row; a
few items repeat a row), sorted by length and packed into fixed-shape batches. Tokens and batches are
made once per process (the next in-loop call reuses them) and the tokens are cached on disk under
$NANOACT_CACHE/hellaswag_tokens, keyed by the data file's bytes and the tokenizer.
"""
import argparse
import hashlib
import itertools
import json
import math
import re
import sys
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken
import torch
import torch.distributed as dist
from tqdm import tqdm

from activations.impl import model_identity, model_paths
from data import DataError
from data.files import atomic_file, cache_root
from data.tokenizer import gpt2_tokenizer
from errors import ConfigError, NanoactError
from eval import hellaswag_items
from eval.continuous import continuous_scores
from eval.scoring import block_size_of, bucket, byte_count, pack_rows, row_length, score_batch
from stats.significance import Z95, wilson
from model import GPT
from training import distributed
from training.checkpoint import load_checkpoint
from training.precision import autocast_for

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
FIELDS = ("ctx", "ctx_a", "ctx_b", "activity_label", "endings", "label")
SCORINGS = ("completion", "lm_eval")



def download(url=URL, flag="--data"):
    """The validation jsonl, fetched once into the cache (atomically, so concurrent ranks are safe). `flag`: the
    option of the calling command that takes a local copy instead, for the offline error."""
    path = cache_root() / "hellaswag_val.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=30) as r, atomic_file(path) as f:
            f.write(r.read())
    except OSError as e:
        raise DataError(f"cannot download {url} ({e}); offline? pass {flag} path/to/hellaswag_val.jsonl, fetched where "
                        f"there is a network with `curl -fLo hellaswag_val.jsonl {url}`") from None
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


def require_file(path, flag="--data"):
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; pass {flag} path/to/hellaswag_val.jsonl or omit it to download")
    return path


def data_file(path=None, flag="--data"):
    """The HellaSwag jsonl to score: `path` when given, else the cached copy, downloaded first if absent."""
    return require_file(path, flag) if path else download(flag=flag)


def load_items(path, limit=None):
    """The first `limit` items of a HellaSwag jsonl, each checked; labels become ints."""
    path = require_file(path)
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


TOKEN_CACHE_VERSION = 1


def token_cache_file(data_path, enc, limit, scorings):
    """Where a data file's tokens are kept: keyed by the file's bytes, the tokenizer, limit and scorings."""
    digest = hashlib.sha256(Path(data_path).read_bytes()).hexdigest()[:24]
    tokenizer = f"{enc.name}-tiktoken{tiktoken.__version__}"
    name = f"v{TOKEN_CACHE_VERSION}_{digest}_{tokenizer}_{limit or 'all'}_{'+'.join(scorings)}"
    return cache_root() / "hellaswag_tokens" / f"{name}.npz"


def save_requests(path, requests):
    """build_requests' output for each scoring as flat uint16 tokens + lengths (atomic: ranks may race)."""
    arrays = {}
    for name, reqs in requests.items():
        lists = [t for ctx, conts, _ in reqs for t in (ctx, *conts)]
        arrays[f"{name}_tokens"] = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.uint16)
        arrays[f"{name}_lengths"] = np.array([len(t) for t in lists], dtype=np.int64)
        if reqs[0][2] is not None:
            arrays[f"{name}_divisors"] = np.array([div for _, _, div in reqs], dtype=np.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        np.savez(f, **arrays)


def load_requests(path, scorings):
    requests = {}
    with np.load(path) as z:
        for name in scorings:
            tokens, ends = z[f"{name}_tokens"].tolist(), np.cumsum(z[f"{name}_lengths"]).tolist()
            lists = [tokens[start:end] for start, end in zip([0] + ends[:-1], ends)]
            divisors = z[f"{name}_divisors"].tolist() if f"{name}_divisors" in z else [None] * (len(lists) // 5)
            requests[name] = [(lists[5 * i], lists[5 * i + 1:5 * i + 5], div) for i, div in enumerate(divisors)]
    return requests


def tokenize(items, scorings, data_path=None, limit=None, cache=False):
    """{scoring: build_requests(...)}, read from the token cache when `cache` and saved there on a miss."""
    enc = gpt2_tokenizer()
    path = token_cache_file(data_path, enc, limit, scorings) if cache and data_path else None
    if path is not None and path.is_file():
        try:
            return load_requests(path, scorings)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            pass  # a damaged cache file is rebuilt below
    requests = {name: build_requests(enc, items, name) for name in scorings}
    if path is not None:
        save_requests(path, requests)
    return requests


@dataclass
class RowBatches:
    """Every distinct (context, continuation) row of the scorings asked for, packed once into this rank's
    batches. Rows shared by scorings or items are scored once; index[scoring] maps (item, ending) to rows."""
    n_rows: int
    index: dict  # scoring -> (n_items, 4) row ids
    divisors: dict  # scoring -> (n_items, 4) float64 acc_norm divisors
    gold: torch.Tensor
    batches: list  # [(row ids of this rank, idx, tgt)], every rank the same shapes in the same order
    n_tokens: dict = None  # scoring -> (n_items, 4) float64 continuation tokens
    n_bytes: dict = None  # scoring -> (n_items, 4) float64 continuation bytes: bits per byte's denominator


def pack_batches(rows, block_size, batch_rows, rank=0, world_size=1, length_step=64):
    """Rows sorted by length and cut into groups of batch_rows * world_size; each rank takes its slice of
    every group as one (batch_rows, L) batch, L the group's longest row rounded up to length_step, so every
    rank runs the same sequence of shapes (no rank waits on a different compile). [(row ids, idx, tgt)]."""
    lengths = [row_length(ctx, c, block_size) for ctx, c in rows]
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])
    group = batch_rows * world_size
    batches = []
    for start in range(0, len(order), group):
        chunk = order[start:start + group]
        share = chunk[rank * batch_rows:(rank + 1) * batch_rows]
        length = bucket(lengths[chunk[0]], block_size, length_step)
        batches.append((torch.tensor(share, dtype=torch.long),
                        *pack_rows([rows[i] for i in share], length, batch_rows, block_size)))
    return batches


def make_row_batches(requests, gold, block_size, batch_rows, rank=0, world_size=1, length_step=64):
    """The RowBatches of the scorings' requests: distinct rows, packed by pack_batches."""
    ids, index, divisors = {}, {}, {}
    for name, reqs in requests.items():
        index[name] = torch.tensor([[ids.setdefault((tuple(ctx), tuple(c)), len(ids)) for c in conts]
                                    for ctx, conts, _ in reqs])
        divisors[name] = torch.tensor([[float(len(c)) for c in conts] if div is None else div
                                       for _, conts, div in reqs], dtype=torch.float64)
    rows = list(ids)  # in id order
    row_tokens = torch.tensor([len(c) for _, c in rows], dtype=torch.float64)
    row_bytes = torch.tensor([byte_count(c) for _, c in rows], dtype=torch.float64)
    batches = pack_batches(rows, block_size, batch_rows, rank, world_size, length_step)
    return RowBatches(len(rows), index, divisors, gold, batches, {name: row_tokens[i] for name, i in index.items()},
                {name: row_bytes[i] for name, i in index.items()})


_ROW_BATCHES = {}  # the newest packing, kept for the next in-loop call: tokenized and packed once per run


def prepare(data_path, limit, scorings, block_size, batch_rows, rank=0, world_size=1, length_step=64, cache=True):
    """The RowBatches for a data file, from memory when the file is unchanged since the last call."""
    stat = require_file(data_path).stat()
    key = (str(Path(data_path).resolve()), stat.st_mtime_ns, stat.st_size, limit, tuple(scorings), block_size,
           batch_rows, rank, world_size, length_step)
    if key not in _ROW_BATCHES:
        items = load_items(data_path, limit)
        requests = tokenize(items, scorings, data_path, limit, cache)
        gold = torch.tensor([item["label"] for item in items], dtype=torch.long)
        _ROW_BATCHES.clear()
        _ROW_BATCHES[key] = make_row_batches(requests, gold, block_size, batch_rows, rank, world_size, length_step)
    return _ROW_BATCHES[key]


def score_row_batches(model, packing, device, autocast=None, progress=True, dist_info=None, greedy=False,
                      desc="hellaswag"):
    """Summed log-likelihood of every row (float64, on the CPU), the same on every rank; with `greedy` also
    whether each row's continuation is the model's greedy one (1.0/0.0)."""
    ll = torch.zeros(packing.n_rows, dtype=torch.float64, device=device)
    hits = torch.zeros(packing.n_rows, dtype=torch.float64, device=device)

    def score_rows():
        for share, idx, tgt in tqdm(packing.batches, desc=desc, unit="batch", disable=not progress, leave=False):
            sums, _, all_greedy = score_batch(model, idx.to(device), tgt.to(device), autocast, greedy=greedy)
            ll.index_copy_(0, share.to(device), sums[:len(share)])
            if greedy:
                hits.index_copy_(0, share.to(device), all_greedy[:len(share)].to(torch.float64))

    d = dist_info or distributed.Dist()
    distributed.before_collective(score_rows, d)  # an OOM on one rank: every rank fails here, none waits below
    if d.ddp:  # each row was scored on one rank, zeros elsewhere: the sum is exact
        dist.all_reduce(ll)
        if greedy:
            dist.all_reduce(hits)
    return (ll.cpu(), hits.cpu()) if greedy else ll.cpu()


def summarize(values):
    """{mean, ci95}: the mean of per-item values and its 95% normal interval over items (items sampled),
    mean ± z sd/√n; without scipy (its import costs more than a small evaluation)."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return {"mean": mean, "ci95": None}
    half = Z95 * float(values.std(ddof=1)) / math.sqrt(len(values))
    return {"mean": mean, "ci95": [mean - half, mean + half]}


def length_step(model):
    """Batch lengths round up to 64 for a compiled model (HellaSwag: 3 graphs), to 8 eager (less padding)."""
    return 64 if hasattr(model, "_orig_mod") else 8


def evaluate_model(model, device, data_path=None, limit=None, scoring="both", dist_info=None, autocast=None,
                   progress=True, batch_items=32, cache=False, items_file=None, about=None):
    """HellaSwag accuracies: {"completion": {acc, acc_norm, n, acc_ci95, acc_norm_ci95, ...}, "lm_eval": {...}}.

    Both scorings come from one pass over their distinct rows (`RowBatches`). The data is tokenized and packed
    once per process and kept for the next call (`prepare`); with `cache` the tokens are also kept on disk
    under $NANOACT_CACHE. Under torchrun pass dist_info (training.distributed.Dist): each rank scores a
    share of the rows and the log-likelihoods are all-reduced, so every rank returns the same numbers. The
    model may be torch.compile'd (one graph per batch length); it is put in eval mode (ANAct uses its running
    statistics) and restored after. With `items_file`, rank 0 also writes every item's predictions there
    (eval/hellaswag_items.py's format; `about`: what its header says the scores come from).
    """
    if scoring not in (*SCORINGS, "both"):
        raise ConfigError(f"unknown scoring {scoring!r}; choose completion, lm_eval or both")
    scorings = SCORINGS if scoring == "both" else (scoring,)
    d = dist_info or distributed.Dist()
    # a file that went bad under one rank: every rank fails here, none waits for it in score_row_batches's collectives
    packing = distributed.before_collective(lambda: prepare(data_path or download(), limit, scorings, block_size_of(model),
                                                         4 * batch_items, d.rank, d.world_size, length_step(model),
                                                         cache), d)
    was_training = model.training
    model.eval()
    try:
        t0 = time.time()
        ll = score_row_batches(model, packing, device, autocast, progress and d.master, d)
        seconds = time.time() - t0
    finally:
        model.train(was_training)
    results = {}
    for name in scorings:
        scores = ll[packing.index[name]]
        # argmax returns the first maximum on ties, as numpy's argmax in lm-eval does
        k_acc = (scores.argmax(1) == packing.gold).sum().item()
        k_norm = ((scores / packing.divisors[name]).argmax(1) == packing.gold).sum().item()
        n = len(packing.gold)
        results[name] = {"acc": k_acc / n, "acc_norm": k_norm / n, "n": n, "acc_ci95": wilson(k_acc, n),
                         "acc_norm_ci95": wilson(k_norm, n), "correct": k_acc, "correct_norm": k_norm,
                         "interval": "wilson", "seconds": seconds, "scored_with": "+".join(scorings),
                         "rows": packing.n_rows, "forwards": len(packing.batches)}
        continuous = continuous_scores(scores.numpy(), packing.n_bytes[name].numpy(), packing.gold.numpy())
        for key, values in continuous.items():
            stat = summarize(values)
            results[name].update({key: stat["mean"], f"{key}_ci95": stat["ci95"]})
    if items_file is not None and d.master:
        setup = scoring_setup(model, device, autocast, 4 * batch_items, d.world_size)
        write_items(items_file, packing, ll, scorings, data_path or download(), limit, {**(about or {}), "setup": setup})
    return results


def scoring_setup(model, device, autocast, batch_rows, world_size):
    """How the log-likelihoods were computed, for the items file's header: two scorings of the same weights under
    other settings differ in the last bits, and a near tie between two endings can flip."""
    dtype = autocast.fast_dtype if isinstance(autocast, torch.autocast) else torch.float32
    return {"compile": hasattr(model, "_orig_mod"), "dtype": str(dtype).removeprefix("torch."),
            "kernels": model_paths(model, torch.ones(1, device=device, dtype=dtype)), "batch_rows": batch_rows,
            "length_step": length_step(model), "world_size": world_size,
            "padding": "rows sorted by length, right-padded with EOT to the batch length"}


def write_items(path, packing, ll, scorings, data_path, limit, about=None):
    """Every item's label, per-ending log-likelihoods, acc_norm divisors and predictions (eval/hellaswag_items.py)."""
    per_scoring = {}
    for name in scorings:
        scores = ll[packing.index[name]]
        continuous = {key: v.tolist() for key, v in
                      continuous_scores(scores.numpy(), packing.n_bytes[name].numpy(), packing.gold.numpy()).items()}
        per_scoring[name] = (scores.tolist(), packing.divisors[name].tolist(), packing.n_tokens[name].tolist(),
                             packing.n_bytes[name].tolist(), continuous)
    records = ({"i": i, "label": label,
                **{name: hellaswag_items.scoring_record(scores[i], divisors[i], tokens[i], n_bytes[i],
                                                        {key: v[i] for key, v in continuous.items()})
                   for name, (scores, divisors, tokens, n_bytes, continuous) in per_scoring.items()}}
               for i, label in enumerate(packing.gold.tolist()))
    header = {"n": len(packing.gold), "scorings": list(scorings), **(about or {}), "data": str(data_path),
              "data_sha256": hashlib.sha256(Path(data_path).read_bytes()).hexdigest(), "limit": limit}
    return hellaswag_items.write(path, header, records)


def interval(ci):
    return "[-]" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def result_path(args, ckpt):
    if args.out:
        return Path(args.out)
    suffix = f"_limit{args.limit}" if args.limit else ""
    if ckpt is None:
        return Path(args.hf) / f"hellaswag{suffix}.json"
    return Path(ckpt["path"]).parent / f"hellaswag_{ckpt['step']:05d}{suffix}.json"


def describe(args, ckpt):
    """Which weights are scored, for the first line of the CLI's output."""
    if ckpt is None:
        return f"transformers GPT-2 {args.hf}"
    config = model_identity(ckpt["model_config"])  # an old checkpoint's impl says how it ran, not what it is
    kwargs = f" {json.dumps(config['act_kwargs'])}" if config.get("act_kwargs") else ""
    return f"{ckpt['path']} | step {ckpt.get('step')} | act {config.get('act')}{kwargs}"


def main(argv=None):
    start = time.time()
    p = argparse.ArgumentParser(description="HellaSwag zero-shot accuracy (validation set) of a nanoact GPT-2.")
    p.add_argument("checkpoint", nargs="?", help="checkpoint file, or run directory (its newest checkpoint)")
    p.add_argument("--hf", metavar="DIR", help="evaluate a transformers GPT-2 directory instead")
    p.add_argument("--data", help="HellaSwag jsonl (default: download hellaswag_val.jsonl into $NANOACT_CACHE)")
    p.add_argument("--limit", type=int, help="only the first N items")
    p.add_argument("--scoring", choices=(*SCORINGS, "both"), default="both")
    p.add_argument("--batch-items", type=int, default=32, help="items per forward (4 rows each)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 autocast on CUDA), float32 or bfloat16")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model first (pays for itself only over many items: 3 graphs to compile)")
    p.add_argument("--out", help="result JSON (default: hellaswag_<step>.json beside the checkpoint); the items "
                                 "file goes beside it (hellaswag_<step>_items.jsonl.gz)")
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
                ckpt = load_checkpoint(args.checkpoint, kind="gpt2")
                model = GPT.from_checkpoint(ckpt, d.device)
            if d.master:
                print(f"scoring {describe(args, ckpt)}", flush=True)
            autocast = autocast_for(d.device_type, args.dtype)
            data = args.data or download()  # before the forward passes: a missing file fails fast
            if args.compile:
                model = torch.compile(model, dynamic=False)  # one static graph per length bucket (3)
            out = result_path(args, ckpt)
            about = {"scored_by": "eval/hellaswag.py", "checkpoint": ckpt and ckpt["path"], "hf": args.hf,
                     "step": ckpt and ckpt["step"],
                     "act": ckpt["model_config"].get("act") if ckpt else "gelu"}
            results = evaluate_model(model, d.device, data, args.limit, args.scoring, d, autocast, True,
                                     args.batch_items, cache=True, items_file=hellaswag_items.items_file(out),
                                     about=about)
        except NanoactError as e:
            sys.exit(f"error: {e}")
        if d.master:
            for name, r in results.items():
                print(f"hellaswag {name:10s} | acc {r['acc']:.4f} [{r['acc_ci95'][0]:.4f}, {r['acc_ci95'][1]:.4f}] "
                      f"| acc_norm {r['acc_norm']:.4f} [{r['acc_norm_ci95'][0]:.4f}, {r['acc_norm_ci95'][1]:.4f}] "
                      f"| gold bits/byte {r['bpb']:.4f} {interval(r['bpb_ci95'])} "
                      f"| n {r['n']}")
            print("95% intervals: Wilson for the accuracies, mean ± 1.96 sd/√n over items for bits/byte (the "
                  "continuous score: lower is better); p_gold and margin in the result JSON and the items file")
            r = next(iter(results.values()))
            print(f"{r['scored_with']} in one pass: {r['rows']} distinct rows, {r['forwards']} forwards, "
                  f"{r['seconds']:.1f}s; {time.time() - start:.1f}s since start (loading, tokenizing, compiling)")
            record = {**about, "data": str(data), "limit": args.limit, "dtype": args.dtype,
                      "world_size": d.world_size, "results": results, "items": str(hellaswag_items.items_file(out))}
            out.write_text(json.dumps(record, indent=2) + "\n")
            print(f"wrote {out} and, item by item, {record['items']}")
    finally:
        distributed.cleanup(d)


if __name__ == "__main__":
    main()
