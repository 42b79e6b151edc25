"""CORE (DCLM, Li et al. 2024; nanochat's base_eval) of a nanoact checkpoint: few-shot tasks of a bundle in the DCLM
format, each scored the way nanochat's nanochat/core_eval.py scores it, with the continuous scores beside accuracy.

    python eval/core.py log/aglu --bundle path/to/eval_bundle                  # every task of the bundle, every item
    python eval/core.py log/aglu/model_19073.pt --bundle path/to/eval_bundle --max-per-task 500
    torchrun --nproc_per_node 8 eval/core.py log/aglu --bundle path/to/eval_bundle   # rows split over ranks

The bundle (DCLM's eval bundle, as nanochat downloads it: https://karpathy-public.s3.us-west-2.amazonaws.com/
eval_bundle.zip, unzipped) is a directory with
    core.yaml           icl_tasks: [{label, icl_task_type: multiple_choice | schema | language_modeling,
                        dataset_uri (under eval_data/), num_fewshot: [k] or k, continuation_delimiter (default " ")}]
    eval_data/*.jsonl   multiple_choice: {query, choices, gold}; schema: {context_options, continuation, gold};
                        language_modeling: {context, continuation}
    eval_meta_data.csv  columns "Eval Task" (a label) and "Random baseline" (in percent)

The rules (nanochat's, read from its code): a task's items are shuffled by random.Random(1337) and the first
--max-per-task kept; item i of that order draws its few-shot examples by random.Random(1234 + i).sample of the
other kept items. Each example is `query + delimiter + gold choice` (schema: `gold context + delimiter +
continuation`; language modelling: `context.strip() + delimiter + continuation`) followed by a blank line; then the
item. Prompts are tokenized with EOT (GPT-2's BOS) in front. Multiple choice: the options share the prompt's common
token prefix, each continuation is the rest; schema: they share the common token suffix (the continuation), each
context differs. A sequence longer than block_size keeps its last block_size tokens. Multiple choice and schema
pick the option of lowest mean loss per continuation token (the first on ties); language modelling is right when
every continuation token is the greedy one. Centered accuracy: (acc - baseline) / (1 - baseline); CORE: the mean
of the tasks' centered accuracies. The continuous scores (eval/continuous.py): the gold continuation's bits per
byte (the one printed), and for multiple choice and schema the gold option's probability among the options and
its margin. bench/core_nanochat.py scores a bundle with nanochat's own functions for a side by side.
"""
import argparse
import csv
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data import DataError
from data.tokenizer import EOT, gpt2_tokenizer
from errors import NanoactError
from eval.continuous import continuous_scores
from eval.hellaswag import describe, interval, length_step, pack_batches, score_row_batches, summarize
from eval.scoring import block_size_of, byte_count
from model import GPT
from training import distributed
from training.checkpoint import load_checkpoint
from training.precision import autocast_for

KINDS = {"multiple_choice": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
         "language_modeling": ("context", "continuation")}
BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
SHUFFLE_SEED, FEWSHOT_SEED = 1337, 1234  # nanochat's: item order, and few-shot draws (seed + item index)


@dataclass
class Task:
    label: str
    kind: str  # one of KINDS
    path: Path
    num_fewshot: int
    delimiter: str
    random_baseline: float  # percent, as eval_meta_data.csv gives it
    items: list  # in the scored order (shuffled, cut to --max-per-task)


def missing_bundle(bundle, what):
    return DataError(f"{bundle}: {what}; --bundle expects a DCLM/CORE bundle directory (core.yaml, eval_data/*.jsonl, "
                     f"eval_meta_data.csv), e.g. nanochat's: curl -LO {BUNDLE_URL} && unzip eval_bundle.zip, then "
                     "--bundle eval_bundle")


def check_item(item, kind):
    """None if `item` is a well-formed record of this task kind, else what is wrong with it."""
    if not isinstance(item, dict):
        return "not a JSON object"
    missing = [k for k in KINDS[kind] if k not in item]
    if missing:
        return f"missing field(s) {', '.join(missing)} of a {kind} item"
    options = item.get("choices", item.get("context_options"))
    if kind != "language_modeling":
        if not (isinstance(options, list) and len(options) >= 2 and all(isinstance(o, str) for o in options)):
            return f"'{KINDS[kind][0]}' must be a list of at least 2 strings"
        gold = item["gold"]
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
            return f"'gold' must be an index into the {len(options)} options, got {gold!r}"
    text = [k for k in KINDS[kind] if k not in ("choices", "context_options", "gold")]
    if any(not isinstance(item[k], str) for k in text):
        return f"field(s) {', '.join(text)} must be strings"
    return None


def read_items(path, kind):
    """Every record of a task's jsonl, checked; a bad line is a one-line DataError naming the file and line."""
    if not path.is_file():
        raise DataError(f"{path}: no such file (a dataset_uri of core.yaml, under the bundle's eval_data/)")
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            problem = check_item(item, kind)
            if problem:
                raise DataError(f"{path}:{lineno}: malformed {kind} item: {problem}")
            items.append(item)
    if not items:
        raise DataError(f"{path}: no items")
    return items


def random_baselines(path):
    """{task label: random baseline in percent} of eval_meta_data.csv."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    out = {}
    for lineno, row in enumerate(rows, 2):
        try:
            out[row["Eval Task"]] = float(row["Random baseline"])
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{path}:{lineno}: needs an 'Eval Task' and a numeric 'Random baseline'") from None
    return out


def task_entry(config, n, entry):
    """(label, kind, dataset_uri, num_fewshot, delimiter) of core.yaml's n-th icl_tasks entry, checked."""
    where = f"{config}: icl_tasks[{n}]"
    if not isinstance(entry, dict) or not all(k in entry for k in ("label", "icl_task_type", "dataset_uri")):
        raise DataError(f"{where}: needs label, icl_task_type, dataset_uri (and num_fewshot)")
    if entry["icl_task_type"] not in KINDS:
        raise DataError(f"{where} ({entry['label']}): icl_task_type {entry['icl_task_type']!r}, expected one of "
                        f"{', '.join(KINDS)}")
    shots = entry.get("num_fewshot", 0)
    shots = shots[0] if isinstance(shots, list) and shots else shots  # nanochat reads the first of the list
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise DataError(f"{where} ({entry['label']}): num_fewshot must be a count or a list of counts")
    return entry["label"], entry["icl_task_type"], entry["dataset_uri"], shots, entry.get("continuation_delimiter", " ")


def load_bundle(bundle, max_per_task=None):
    """The bundle's tasks in core.yaml's order, each item list shuffled and cut as nanochat does."""
    import yaml  # a dependency of datasets; imported here: only this command reads YAML

    bundle = Path(bundle)
    config = bundle / "core.yaml"
    if not bundle.is_dir():
        raise missing_bundle(bundle, "no such directory")
    if not config.is_file():
        raise missing_bundle(bundle, "no core.yaml in it")
    try:
        entries = yaml.safe_load(config.read_text(encoding="utf-8"))["icl_tasks"]
    except (yaml.YAMLError, KeyError, TypeError) as e:
        raise DataError(f"{config}: not a CORE config with an icl_tasks list ({type(e).__name__})") from None
    baselines = random_baselines(bundle / "eval_meta_data.csv")
    tasks = []
    for n, entry in enumerate(entries or []):
        label, kind, uri, shots, delimiter = task_entry(config, n, entry)
        if label not in baselines:
            raise DataError(f"{bundle / 'eval_meta_data.csv'}: no random baseline for task {label!r}")
        path = bundle / "eval_data" / uri
        items = read_items(path, kind)
        random.Random(SHUFFLE_SEED).shuffle(items)
        items = items[:max_per_task] if max_per_task else items
        if shots >= len(items):
            raise DataError(f"{path}: {label} draws {shots} few-shot examples from the {len(items) - 1} other items")
        tasks.append(Task(label, kind, path, shots, delimiter, baselines[label], items))
    if not tasks:
        raise DataError(f"{config}: no icl_tasks")
    return tasks


def fewshot(items, i, k):
    """The few-shot examples of item i: nanochat's draw, random.Random(1234 + i).sample of the other items."""
    if k == 0:
        return []
    others = [j for j in range(len(items)) if j != i]
    return [items[j] for j in random.Random(FEWSHOT_SEED + i).sample(others, k)]


def prompts(kind, item, examples, delimiter):
    """The item's prompts: one per option (multiple choice, schema), or (without, with) the continuation
    (language modelling). Each example is followed by a blank line."""
    if kind == "multiple_choice":
        shots = "".join(f"{e['query']}{delimiter}{e['choices'][e['gold']]}\n\n" for e in examples)
        return [f"{shots}{item['query']}{delimiter}{choice}" for choice in item["choices"]]
    if kind == "schema":
        shots = "".join(f"{e['context_options'][e['gold']]}{delimiter}{e['continuation']}\n\n" for e in examples)
        return [f"{shots}{context}{delimiter}{item['continuation']}" for context in item["context_options"]]
    shots = "".join(f"{e['context'].strip()}{delimiter}{e['continuation']}\n\n" for e in examples)
    head = f"{shots}{item['context'].strip()}{delimiter}"
    return [head.strip(), head + item["continuation"]]


def common_length(seqs, suffix=False):
    """Tokens every sequence shares at its start (or, suffix, at its end)."""
    n = 0
    for column in zip(*(reversed(s) if suffix else s for s in seqs)):
        if any(t != column[0] for t in column):
            break
        n += 1
    return n


def item_rows(kind, token_lists, block_size):
    """(context, continuation) token rows of one item: the options' split at their common prefix (multiple choice)
    or suffix (schema), the continuation after the prompt without it (language modelling); a sequence over
    block_size keeps its last block_size tokens (nanochat's crop), so the context loses its first tokens."""
    if kind == "multiple_choice":
        start = common_length(token_lists)
        splits = [(t, start) for t in token_lists]
    elif kind == "schema":
        suffix = common_length(token_lists, suffix=True)
        splits = [(t, len(t) - suffix) for t in token_lists]
    else:
        without, with_ = token_lists
        if with_[:len(without)] != without:
            raise ValueError("the prompt without the continuation does not tokenize as a prefix of the one with it")
        splits = [(with_, len(without))]
    rows = []
    for tokens, start in splits:
        if start >= len(tokens):  # an option that is a prefix of the others: nanochat's mean loss is then NaN
            rows.append((tokens, []))
            continue
        if len(tokens) - start >= block_size:
            raise ValueError(f"a continuation of {len(tokens) - start} tokens leaves no context in block_size "
                             f"{block_size}")
        rows.append((tokens[max(0, len(tokens) - block_size):start], tokens[start:]))
    return rows


def task_rows(task, enc, block_size):
    """[rows of each item] of a task, tokenized in one batch."""
    texts = [prompts(task.kind, item, fewshot(task.items, i, task.num_fewshot), task.delimiter)
             for i, item in enumerate(task.items)]
    tokens = iter(enc.encode_ordinary_batch([p for ps in texts for p in ps]))
    out = []
    for i, ps in enumerate(texts):
        try:
            out.append(item_rows(task.kind, [[EOT, *next(tokens)] for _ in ps], block_size))
        except ValueError as e:
            raise DataError(f"{task.path}: {task.label}, item {i} of the scored order: {e}") from None
    return out


@dataclass
class TaskRows:
    """A task's rows packed for score_row_batches (eval/hellaswag.py's machinery): n_rows and this rank's batches."""
    n_rows: int
    batches: list


def score_task(model, task, enc, device, autocast=None, dist_info=None, batch_rows=64):
    """Per item of the task: {correct, bpb, p_gold, margin} (lists, the scored order), the same on every rank."""
    d = dist_info or distributed.Dist()
    per_item = task_rows(task, enc, block_size_of(model))
    rows = [row for item in per_item for row in item if row[1]]
    packing = TaskRows(len(rows), pack_batches(rows, block_size_of(model), batch_rows, d.rank, d.world_size,
                                               length_step(model)))
    ll, greedy = score_row_batches(model, packing, device, autocast, progress=False, dist_info=d, greedy=True,
                                   desc=task.label)
    ll, greedy = iter(ll.tolist()), iter(greedy.tolist())
    width = max(len(item) for item in per_item)
    scores, n_bytes = np.full((len(per_item), width), -np.inf), np.ones((len(per_item), width))
    correct = []
    for i, item in enumerate(per_item):
        # an empty continuation was not scored: log p of nothing is 0, and nothing is greedy
        row_ll, row_greedy = zip(*((next(ll), next(greedy)) if cont else (0.0, 1.0) for _, cont in item))
        scores[i, :len(item)] = row_ll
        n_bytes[i, :len(item)] = [byte_count(cont) for _, cont in item]
        if task.kind == "language_modeling":
            correct.append(bool(row_greedy[0]))
            continue
        # nanochat's pick: the lowest mean loss per continuation token (NaN for an empty one), by Python's min
        losses = [-scores[i, j] / len(cont) if cont else float("nan") for j, (_, cont) in enumerate(item)]
        correct.append(losses.index(min(losses)) == task.items[i]["gold"])
    gold = [item.get("gold", 0) for item in task.items]
    return {"correct": correct, **{key: v.tolist() for key, v in continuous_scores(scores, n_bytes, gold).items()}}


def task_result(task, per_item):
    """A task's accuracy, centered accuracy and continuous scores (mean and 95% interval over its items)."""
    acc = float(np.mean(per_item["correct"]))
    baseline = 0.01 * task.random_baseline
    out = {"kind": task.kind, "n": len(per_item["correct"]), "num_fewshot": task.num_fewshot, "acc": acc,
           "centered": (acc - baseline) / (1 - baseline), "random_baseline": task.random_baseline}
    for key in ("bpb", "p_gold", "margin"):
        values = np.asarray(per_item[key])
        values = values[np.isfinite(values)]  # NaN: no such score (language modelling), or an empty gold option
        if len(values):
            stat = summarize(values)
            out.update({key: stat["mean"], f"{key}_ci95": stat["ci95"]})
    return out


def evaluate_core(model, tasks, device, autocast=None, dist_info=None, batch_rows=64, log=None):
    """{"tasks": {label: task_result + per-item "items"}, "core": mean centered accuracy}; the model in eval mode
    while scoring (restored after)."""
    enc = gpt2_tokenizer()
    was_training = model.training
    model.eval()
    results = {}
    try:
        for task in tasks:
            t0 = time.time()
            per_item = score_task(model, task, enc, device, autocast, dist_info, batch_rows)
            results[task.label] = {**task_result(task, per_item), "seconds": time.time() - t0, "items": per_item}
            if log:
                log(task.label, results[task.label])
    finally:
        model.train(was_training)
    return {"tasks": results, "core": float(np.mean([r["centered"] for r in results.values()]))}


def task_line(label, r):
    bpb = f"{r['bpb']:.4f} {interval(r['bpb_ci95'])}" if "bpb" in r else "-"
    return (f"{label:32s} | {r['kind']:17s} {r['num_fewshot']}-shot | acc {r['acc']:.4f} | centered "
            f"{r['centered']:+.4f} | gold bits/byte {bpb} | n {r['n']} | {r['seconds']:.1f}s")


def main(argv=None):
    p = argparse.ArgumentParser(description="CORE: the few-shot tasks of a DCLM-format bundle, nanochat's rules.")
    p.add_argument("checkpoint", nargs="?", help="checkpoint file, or run directory (its newest checkpoint)")
    p.add_argument("--hf", metavar="DIR", help="evaluate a transformers GPT-2 directory instead")
    p.add_argument("--bundle", required=True, help="the bundle directory (core.yaml, eval_data/, eval_meta_data.csv)")
    p.add_argument("--max-per-task", type=int, help="score the first N items of each task's shuffled order")
    p.add_argument("--batch-rows", type=int, default=64, help="rows per forward")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 autocast on CUDA), float32 or bfloat16")
    p.add_argument("--out", help="result JSON (default: core_<step>.json beside the checkpoint)")
    args = p.parse_args(argv)
    if (args.checkpoint is None) == (args.hf is None):
        p.error("give either a checkpoint (file or run directory) or --hf DIR")
    if (args.max_per_task is not None and args.max_per_task < 1) or args.batch_rows < 1:
        p.error("--max-per-task and --batch-rows must be >= 1")
    d = distributed.setup(args.device)
    try:
        try:
            tasks = load_bundle(args.bundle, args.max_per_task)
            ckpt = None if args.hf else load_checkpoint(args.checkpoint, kind="gpt2")
            model = GPT.from_pretrained(args.hf).to(d.device) if args.hf else GPT.from_checkpoint(ckpt, d.device)
            if d.master:
                print(f"scoring {describe(args, ckpt)} on {len(tasks)} tasks of {args.bundle}", flush=True)
            log = (lambda label, r: print(task_line(label, r), flush=True)) if d.master else None
            result = evaluate_core(model, tasks, d.device, autocast_for(d.device_type, args.dtype), d,
                                   args.batch_rows, log)
        except NanoactError as e:
            sys.exit(f"error: {e}")
        if d.master:
            print(f"CORE {result['core']:.4f} (mean centered accuracy over {len(tasks)} tasks; gold bits/byte: lower "
                  "is better, 95% intervals over items)")
            suffix = f"_max{args.max_per_task}" if args.max_per_task else ""
            out = Path(args.out) if args.out else (Path(args.hf) / f"core{suffix}.json" if ckpt is None else
                                                   Path(ckpt["path"]).parent / f"core_{ckpt['step']:05d}{suffix}.json")
            record = {"checkpoint": ckpt and ckpt["path"], "hf": args.hf, "step": ckpt and ckpt["step"],
                      "bundle": str(args.bundle), "max_per_task": args.max_per_task, "world_size": d.world_size,
                      **result}
            out.write_text(json.dumps(record) + "\n")
            print(f"wrote {out} (per task, every item's correct and continuous scores)")
    finally:
        distributed.cleanup(d)


if __name__ == "__main__":
    main()
