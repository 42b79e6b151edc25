"""Parallel text for translation: local files or HF IWSLT 2017, a joint sentencepiece model, and a
token-count batching loader that resumes exactly.

Local files are `{prefix}.{lang}` (optionally .gz), one sentence a line, source and target aligned:
either a directory with train.de/train.en, valid.*, test.* (--data-dir) or one prefix per split
(--train-prefix, --valid-prefix, --test-prefix; they override the directory). Without local files
the splits come from the Hugging Face hub (IWSLT/iwslt2017, iwslt2017-de-en).
"""
import gzip
import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import torch

from data import DataError, hub_unreachable
from data.files import atomic_file

SPLITS = {"train": "train", "valid": "validation", "test": "test"}  # ours -> Hugging Face's
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def read_lines(path):
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it as UTF-8 text, one sentence a line ({getattr(e, 'strerror', None) or e})") from None


def read_parallel(src_path, tgt_path):
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not any(line.strip() for line in lines):
            raise DataError(f"{path} is empty; give a file with one sentence per line")
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
                        "source and target files must be line-aligned")
    return src, tgt


def _with_lang(prefix, lang):
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    return None


def local_files(split, src_lang, tgt_lang, data_dir="", prefix=""):
    """(src_path, tgt_path) of a split, or None when neither --data-dir nor a prefix names it."""
    prefix = prefix or (str(Path(data_dir) / split) if data_dir else "")
    if not prefix:
        return None
    paths = _with_lang(prefix, src_lang), _with_lang(prefix, tgt_lang)
    if None in paths:
        missing = [f"{prefix}.{lang}" for lang, p in zip((src_lang, tgt_lang), paths) if p is None]
        raise DataError(f"{' and '.join(missing)} not found (.gz also accepted); "
                        f"pass --{split}-prefix PATH_WITHOUT_LANG_SUFFIX or fix --data-dir")
    return paths


LOCAL_FILES = ("offline, pass local files: --data-dir DIR (train.{src}, train.{tgt}, valid.*, test.*) or "
               "--train-prefix/--valid-prefix/--test-prefix")


def load_hf(split, src_lang, tgt_lang, name="IWSLT/iwslt2017", config="iwslt2017-de-en"):
    """One split from the hub; datasets>=4 no longer runs loading scripts, so the hub's parquet
    conversion of the dataset is tried when the plain load fails."""
    problem = "" if os.environ.get("HF_HUB_OFFLINE") else hub_unreachable()
    if problem:
        raise DataError(f"could not reach the Hugging Face hub for {name} ({problem}); " + LOCAL_FILES.format(
            src=src_lang, tgt=tgt_lang))
    from datasets import load_dataset  # slow import, only needed for the hub
    ds, errors = None, []
    for kwargs in ({}, {"revision": "refs/convert/parquet"}):
        try:
            ds = load_dataset(name, config, split=SPLITS[split], **kwargs)
            break
        except Exception as e:  # network, script and missing-config errors all mean "use local files"
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if "script" not in str(e).lower():  # unreachable hub: no second minute of retries
                break
    if ds is None:
        raise DataError(f"could not load {name} ({config}) split {SPLITS[split]} from the Hugging Face hub "
                        f"({errors[0]}); " + LOCAL_FILES.format(src=src_lang, tgt=tgt_lang))
    pairs = ds["translation"]
    return [p[src_lang] for p in pairs], [p[tgt_lang] for p in pairs]


def load_split(split, src_lang, tgt_lang, data_dir="", prefix="", hf_dataset="IWSLT/iwslt2017",
               hf_config="iwslt2017-de-en"):
    """(source lines, target lines) of train/valid/test: local files when given, else the hub."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose train, valid or test")
    paths = local_files(split, src_lang, tgt_lang, data_dir, prefix)
    if paths is not None:
        return read_parallel(*paths)
    return load_hf(split, src_lang, tgt_lang, hf_dataset, hf_config)


def sentencepiece_model(src, tgt, vocab_size, model_type="bpe", cache_dir=".", threads=2):
    """A joint source+target sentencepiece model trained on the training text, cached by a hash of that
    text and the settings (so runs on the same data share it). Returns the serialized model bytes."""
    import sentencepiece as spm  # translation only: the GPT-2 side never loads it
    settings = dict(vocab_size=vocab_size, model_type=model_type, character_coverage=1.0,
                    pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS)
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for line in src + tgt:
        h.update(line.encode() + b"\n")
    path = Path(cache_dir) / f"spm_{model_type}{vocab_size}_{h.hexdigest()[:16]}.model"
    if path.is_file():
        return path.read_bytes()
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter([s for s in src + tgt if s.strip()]),
                                       model_writer=buffer, input_sentence_size=0, num_threads=threads,
                                       minloglevel=2, **settings)
    except RuntimeError as e:
        raise DataError(f"sentencepiece training failed ({str(e).splitlines()[0]}); "
                        "for small training text lower --spm-vocab-size") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        f.write(buffer.getvalue())
    return buffer.getvalue()


def load_sentencepiece(model_bytes):
    import sentencepiece as spm  # translation only: the GPT-2 side never loads it
    return spm.SentencePieceProcessor(model_proto=model_bytes)


def encode(sp, src, tgt, max_len=0):
    """Token id arrays (without BOS/EOS); max_len > 0 drops pairs with a side longer than that or empty."""
    src_ids, tgt_ids = sp.encode(src), sp.encode(tgt)
    keep = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids))
            if s and t and (max_len <= 0 or (len(s) <= max_len and len(t) <= max_len))]
    return ([np.asarray(src_ids[i], dtype=np.int32) for i in keep],
            [np.asarray(tgt_ids[i], dtype=np.int32) for i in keep])


def padded_length(n, multiple):
    return -(-n // multiple) * multiple


def batch_rows(length, max_tokens, max_sentences=0):
    """Sentences in a full batch whose source and target are padded to `length`."""
    rows = max(1, max_tokens // length)
    return min(rows, max_sentences) if max_sentences else rows


def make_batches(order, src_len, tgt_len, max_tokens, max_sentences=0, multiple=1):
    """Cut `order` into consecutive batches with batch_size * longest_side <= max_tokens (a longer single
    pair gets a batch of its own) and at most max_sentences pairs (0: no limit); the longest side
    (with EOS / BOS) counts rounded up to a multiple of `multiple`."""
    batches, current, longest = [], [], 0
    for i in order:
        size = padded_length(max(src_len[i], tgt_len[i]) + 1, multiple)
        full = max_sentences and len(current) >= max_sentences
        if current and (max(longest, size) * (len(current) + 1) > max_tokens or full):
            batches.append(np.asarray(current))
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(np.asarray(current))
    return batches


def collate(src, tgt, index, device="cpu", length=0, rows=0):
    """Right-padded (src + EOS, BOS + tgt, tgt + EOS) tensors for the pairs at `index`. length > 0 pads
    source and target to that length; rows > len(index) appends filler rows (source EOS, decoder input
    BOS, every target PAD): they add nothing to the loss and keep every attention row non-empty."""
    S = max(length, max(len(src[i]) for i in index) + 1)
    T = max(length, max(len(tgt[i]) for i in index) + 1)
    B = max(rows, len(index))
    x = np.full((B, S), PAD, dtype=np.int64)
    y_in = np.full((B, T), PAD, dtype=np.int64)
    y_out = np.full((B, T), PAD, dtype=np.int64)
    x[len(index):, 0], y_in[len(index):, 0] = EOS, BOS
    for row, i in enumerate(index):
        s, t = src[i], tgt[i]
        x[row, :len(s)], x[row, len(s)] = s, EOS
        y_in[row, 0], y_in[row, 1:len(t) + 1] = BOS, t
        y_out[row, :len(t)], y_out[row, len(t)] = t, EOS
    return tuple(torch.from_numpy(a).to(device) for a in (x, y_in, y_out))


class TokenBatchLoader:
    """Length-bucketed token-count batches, reshuffled every epoch from (seed, epoch).

    Each epoch: shuffle the pairs, stable-sort them by (target, source) length (so equal lengths stay
    shuffled), cut into batches, shuffle the batch order. Every rank builds the same list and takes
    batches rank, rank + W, ...; the list is cut to a multiple of W * accum (the batches of one optimizer
    step), so all ranks step together and optimizer step k trains on batches k*W*accum ... (k+1)*W*accum - 1
    of the list whatever W: 1 process with accum 4 trains the same steps on the same batches as 4 with
    accum 1. An epoch's batches are a pure function of (seed, epoch), so (epoch, position) is an exact
    resume point.

    pad_multiple > 1 bounds the batch shapes (for torch.compile, which compiles once per shape): pairs are
    sorted by L = max(source, target) + 1 rounded up to a multiple of it, source and target are padded
    to L and the batch to batch_rows(L) sentences with filler rows, so the shape is a function of L alone:
    at most ceil((longest + 1) / pad_multiple) shapes, each batch still <= max_tokens padded tokens.
    """

    def __init__(self, src, tgt, max_tokens, max_sentences=0, rank=0, world_size=1, seed=0, shuffle=True,
                 pad_multiple=1, accum=1):
        self.src, self.tgt = src, tgt
        self.src_len = np.array([len(s) for s in src])
        self.tgt_len = np.array([len(t) for t in tgt])
        self.pad_multiple = pad_multiple
        self.padded_len = padded_length(np.maximum(self.src_len, self.tgt_len) + 1, pad_multiple)
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.accum = accum
        self.epoch, self.pos = 0, 0
        self._batches = self.epoch_batches(0)
        if not self._batches:
            raise DataError(f"{len(src)} pairs give fewer batches than one optimizer step takes ({world_size} "
                            f"processes x {accum} accumulated); use more data, a smaller --max-tokens or "
                            "--total-max-tokens")

    def epoch_batches(self, epoch):
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(self.src))
        else:
            order = np.arange(len(self.src))
        if self.pad_multiple > 1:  # within a padded length the order stays random
            order = order[np.argsort(self.padded_len[order], kind="stable")]
        else:
            order = order[np.lexsort((self.src_len[order], self.tgt_len[order]))]
        batches = make_batches(order, self.src_len, self.tgt_len, self.max_tokens, self.max_sentences,
                               self.pad_multiple)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
            batches = batches[:len(batches) - len(batches) % (self.world_size * self.accum)]
        return batches[self.rank::self.world_size]

    def __len__(self):
        """Batches per epoch on this rank (the same every epoch: only which pairs go together changes)."""
        return len(self._batches)

    def steps_per_epoch(self):
        return len(self._batches) // self.accum

    def shapes(self):
        """Number of distinct padded batch shapes (pad_multiple > 1), or None when they vary freely."""
        return len(self.padded_shapes()) if self.pad_multiple > 1 else None

    def padded_shapes(self):
        """(rows, length) of each padded batch shape, shortest first (pad_multiple > 1): what a compiled
        run warms up on."""
        return [(batch_rows(n, self.max_tokens, self.max_sentences), n) for n in np.unique(self.padded_len).tolist()]

    def _collate(self, index, device="cpu"):
        if self.pad_multiple == 1:
            return collate(self.src, self.tgt, index, device)
        length = self.padded_len[index].max()
        return collate(self.src, self.tgt, index, device, length, batch_rows(length, self.max_tokens,
                                                                             self.max_sentences))

    def next_batch(self, device="cpu"):
        if self.pos == len(self._batches):
            self.epoch, self.pos = self.epoch + 1, 0
            self._batches = self.epoch_batches(self.epoch)
        index = self._batches[self.pos]
        self.pos += 1
        return self._collate(index, device)

    def batch(self, i):
        """Batch i of the current epoch on this rank, without moving the loader (evaluation)."""
        return self._collate(self._batches[i])

    def __iter__(self):
        """One pass over the current epoch's batches from the start (evaluation)."""
        for i in range(len(self._batches)):
            yield self.batch(i)

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "num_pairs": len(self.src),
                "max_tokens": self.max_tokens, "max_sentences": self.max_sentences, "world_size": self.world_size,
                "pad_multiple": self.pad_multiple, "accum": self.accum}

    def load_state_dict(self, state):
        mine = self.state_dict()
        state = {"pad_multiple": 1, "accum": 1, **state}  # saved before batches could be padded or accumulated
        for key in ("seed", "num_pairs", "max_tokens", "max_sentences", "world_size", "pad_multiple", "accum"):
            if state[key] != mine[key]:
                raise DataError(f"loader state was saved with {key}={state[key]}, this run has {mine[key]}; "
                                "resume with the same data and batching options")
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._batches = self.epoch_batches(self.epoch)
