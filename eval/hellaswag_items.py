"""HellaSwag item by item: the file eval/hellaswag.py writes beside every score it computes, and lm-eval's
`--log_samples` output read as the same kind of thing, so that two models can be compared on the very items
both answered (eval/compare_items.py, the sweep report).

Two writers, two names that never collide: a training run's final evaluation (train_gpt2.py) writes
`hellaswag_items_<step>[_limit<N>].jsonl.gz` into the run directory (`run_items_file`): the run's own scoring, the
one its logged HellaSwag numbers come from and the one the sweep report pairs; eval/hellaswag.py writes its items
beside its result JSON, `hellaswag_<step>[_limit<N>]_items.jsonl.gz` (`items_file`). The two score the same weights
under different settings (the run's precision, compile and kernel path against the CLI's), so their
log-likelihoods differ in the last bits and a near tie can flip (docs/evaluation.md).

The file is gzip'd JSON lines (10,042 items and both scorings; its size:
BENCHMARKS.md, "HellaSwag item by item"). Line 1 is a header:
    {"format": "nanoact-hellaswag-items", "version": 1, "n": 10042, "scorings": ["completion", "lm_eval"],
     "scored_by": "train_gpt2.py final evaluation" | "eval/hellaswag.py", "run" or "checkpoint": ..., "step": ...,
     "act": ..., "setup": {"compile", "dtype", "kernels", "batch_rows", "length_step", "world_size", "padding"},
     "data": path, "data_sha256": ..., "limit": null}
setup says how the scores were computed: compiled or eager, the autocast dtype, each activation family's path
(Triton kernel or PyTorch), rows per forward, the multiple batch lengths round up to, the ranks the rows were
split over, and how rows are padded.
then one line per item, in the data file's order:
    {"i": 0, "label": 3,
     "completion": {"ll": [4 summed log-likelihoods], "div": [4 acc_norm divisors], "pred": 1, "pred_norm": 3},
     "lm_eval": {...}}
i is the item's index in the data file, label the gold ending; ll the summed log-likelihood of each ending; div
what acc_norm divides it by (completion: the ending's token count; lm_eval: its length in characters); pred the
ending with the highest ll (acc), pred_norm the one with the highest ll/div (acc_norm), the first on ties. Files
written since the continuous scores exist add, per scoring, tok and bytes (each ending's token and UTF-8 byte
counts) and the item's continuous scores (eval/continuous.py): bpb (the gold ending's bits per byte),
p_gold (its probability among the four) and margin (its ll minus the best distractor's, nats); a reader of an
older file finds none (Items.scores).

lm-eval's samples file (`--log_samples --output_path DIR` writes DIR/<model>/samples_hellaswag_<date>.jsonl) holds
per document its doc_id, the preprocessed doc (choices, gold) and filtered_resps, one [log-likelihood, is_greedy]
per choice: it reads as the lm_eval scoring, its acc_norm divisor the choice's characters as lm-eval divides, and
its continuous scores from those log-likelihoods and the bytes of " " + choice (what lm-eval scored; no token
counts: lm-eval's samples do not keep them).
"""
import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

from data import DataError
from data.files import atomic_file
from eval.continuous import CONTINUOUS, continuous_scores

FORMAT = "nanoact-hellaswag-items"
VERSION = 1
METRICS = {"acc": "pred", "acc_norm": "pred_norm"}


class ItemsError(DataError):
    """An items file that cannot be read or compared; the message says which file and what to do."""


def argmax(values):
    """Index of the first largest value (numpy's and torch's argmax on ties)."""
    return max(range(len(values)), key=lambda k: (values[k], -k))


def scoring_record(ll, div, tokens=None, n_bytes=None, continuous=None):
    """One scoring of one item: its log-likelihoods, acc_norm divisors and both predictions; with them each
    ending's token and byte counts and the item's continuous scores (eval/continuous.py)."""
    ll, div = [float(x) for x in ll], [float(x) for x in div]
    record = {"ll": ll, "div": div, "pred": argmax(ll), "pred_norm": argmax([x / d for x, d in zip(ll, div)])}
    if tokens is not None:
        record["tok"] = [int(x) for x in tokens]
    if n_bytes is not None:
        record["bytes"] = [int(x) for x in n_bytes]
    return {**record, **{key: float(value) for key, value in (continuous or {}).items()}}


def write(path, header, records):
    """The header line and one line per item, gzip'd, atomically (a reader never sees half a file). Level 1:
    much faster than gzip's default 9 for a few more bytes (BENCHMARKS.md, "HellaSwag item by item"), and other ranks wait while rank 0 writes."""
    path = Path(path)
    with atomic_file(path) as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as f:
        f.write((json.dumps({"format": FORMAT, "version": VERSION, **header}) + "\n").encode())
        for record in records:
            f.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
    return path


@dataclass
class Items:
    """The per-item predictions of one model: index -> label, and per (scoring, metric) index -> predicted
    ending. `about` says where they come from (the header, or lm-eval's samples file)."""
    path: Path
    about: dict
    labels: dict
    preds: dict  # (scoring, metric) -> {index: predicted ending}
    scores: dict = None  # (scoring, continuous score) -> {index: value}, where the file has them (CONTINUOUS)

    def correct(self, scoring, metric, indices):
        pred = self.preds[(scoring, metric)]
        return [pred[i] == self.labels[i] for i in indices]

    def values(self, scoring, metric, indices):
        """Per item: 1.0/0.0 for an accuracy (acc, acc_norm), else the continuous score (bpb, p_gold, margin)."""
        if metric in METRICS:
            return [float(x) for x in self.correct(scoring, metric, indices)]
        return [self.scores[(scoring, metric)][i] for i in indices]


def _lines(path):
    """JSON objects of a jsonl file, gzip'd or not; a bad line is a DataError naming the file and line."""
    try:
        with open(path, "rb") as f:
            opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield n, json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ItemsError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ItemsError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None


def _ours(path, lines, header):
    if header.get("version") != VERSION:
        raise ItemsError(f"{path}: items format version {header.get('version')!r}, this nanoact reads {VERSION}")
    scorings = header.get("scorings") or []
    labels, preds, scores = {}, {(s, m): {} for s in scorings for m in METRICS}, {}
    for n, record in lines:
        try:
            i = int(record["i"])
            labels[i] = int(record["label"])
            for s in scorings:
                for metric, key in METRICS.items():
                    preds[(s, metric)][i] = int(record[s][key])
                for key in CONTINUOUS:  # written since the continuous scores exist (eval/continuous.py)
                    if key in record[s]:
                        scores.setdefault((s, key), {})[i] = float(record[s][key])
        except (KeyError, TypeError, ValueError):
            raise ItemsError(f"{path}:{n}: not an item record (i, label and {', '.join(scorings)} with pred, "
                            "pred_norm); was the file cut short or edited?") from None
    return labels, preds, {k: v for k, v in scores.items() if len(v) == len(labels)}


def _lm_eval(path, lines):
    """lm-eval samples: re-derive both predictions from the log-likelihoods and check them against the
    sample's own acc/acc_norm, so a file of another task (or another divisor) is refused, not misread."""
    labels, preds, scores = {}, {("lm_eval", m): {} for m in METRICS}, {("lm_eval", k): {} for k in CONTINUOUS}
    for n, sample in lines:
        try:
            i, doc = int(sample["doc_id"]), sample["doc"]
            label = int(doc["gold"]) if "gold" in doc else int(sample["target"])
            ll = [float(r[0]) for r in sample["filtered_resps"]]
            record = scoring_record(ll, [len(c) for c in doc["choices"]])
            if len(ll) != 4 or len(doc["choices"]) != 4:
                raise ValueError
            # lm-eval scores " " + choice (hellaswag's target_delimiter) after the query: those are the bytes
            n_bytes = [len((" " + c).encode("utf-8")) for c in doc["choices"]]
            for key, value in continuous_scores([ll], [n_bytes], [label]).items():
                scores[("lm_eval", key)][i] = float(value[0])
        except (KeyError, TypeError, ValueError, IndexError):
            raise ItemsError(f"{path}:{n}: not a HellaSwag sample of lm-eval's --log_samples (doc_id, doc with 4 "
                            "choices and gold, filtered_resps with 4 log-likelihoods)") from None
        for metric, key in METRICS.items():
            if metric in sample and float(sample[metric]) != float(record[key] == label):
                raise ItemsError(f"{path}:{n}: doc {i}: its {metric} {sample[metric]} is not what its "
                                "log-likelihoods give; not lm-eval's hellaswag scoring?")
        if i in labels:
            raise ItemsError(f"{path}:{n}: doc_id {i} twice (several filters or tasks in one file?)")
        labels[i] = label
        for metric, key in METRICS.items():
            preds[("lm_eval", metric)][i] = record[key]
    return labels, preds, scores


def read(path):
    """Items of a file eval/hellaswag.py wrote, or of lm-eval's hellaswag samples jsonl."""
    path = Path(path)
    if not path.is_file():
        raise ItemsError(f"{path}: no such file; pass a hellaswag_items_*.jsonl.gz (eval/hellaswag.py writes one "
                        "beside the checkpoint) or lm-eval's samples_hellaswag_*.jsonl")
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise ItemsError(f"{path}: empty")
    n, head = first
    if isinstance(head, dict) and head.get("format") == FORMAT:
        labels, preds, scores = _ours(path, lines, head)
        about = head
    elif isinstance(head, dict) and "doc_id" in head and "filtered_resps" in head:
        labels, preds, scores = _lm_eval(path, [first, *lines])
        about = {"source": "lm-eval --log_samples", "scorings": ["lm_eval"]}
    else:
        raise ItemsError(f"{path}:{n}: neither a {FORMAT} header nor an lm-eval sample; pass a file that "
                        "eval/hellaswag.py or lm-eval --log_samples wrote")
    if not labels:
        raise ItemsError(f"{path}: no items")
    return Items(path, about, labels, preds, scores)


def items_file(result_json):
    """eval/hellaswag.py's items file, beside its result JSON `X.json`: `X_items.jsonl.gz` (never a run's own name)."""
    result_json = Path(result_json)
    return result_json.with_name(f"{result_json.stem}_items.jsonl.gz")


def run_items_file(run_dir, step, limit=None):
    """The items file of a training run's final evaluation at `step`."""
    return Path(run_dir) / f"hellaswag_items_{step:05d}{f'_limit{limit}' if limit else ''}.jsonl.gz"


NAME = re.compile(r"hellaswag_items_(\d+)(?:_limit(\d+))?\.jsonl\.gz")  # run_items_file's names
TRAINING = "train_gpt2.py final evaluation"


def from_training(items):
    """Whether the scores are a training run's own: a header written before scored_by existed has "run" then,
    "checkpoint" when eval/hellaswag.py wrote it (under the run's name, which it then overwrote)."""
    return items.about.get("scored_by", TRAINING if "checkpoint" not in items.about else None) == TRAINING


def newest(run_dir):
    """A run directory's own items file (its final evaluation's) of its latest step, scored on every item if there
    is such a file for that step (else on the most items); None if it has none."""
    found = [(int(m[1]), m[2] is None, int(m[2] or 0), p) for p in Path(run_dir).glob("hellaswag_items_*.jsonl.gz")
             if (m := NAME.fullmatch(p.name))]
    return max(found)[3] if found else None
