"""Batches of (B, T) token windows from the uint16 shards written by data/fineweb.py, build-nanogpt,
llm.c or nanoGPT (data/shard_formats.py), mixed in one directory if need be.

The data of one epoch is a stream of sequences: every shard is cut into (len - 1) // T windows of
T + 1 tokens at stride T (so targets never overlap; the < T leftover tokens at a shard's end are
unused that epoch). The stream visits the shards one after another, and each shard's windows in
some order:
  - shuffle=True (train): the shard order of epoch e is a permutation drawn from (seed, e), and the
    window order inside shard k one drawn from (seed, e, k), both with numpy's Generator;
  - shuffle=False (val): shards in file-name order, windows front to back, the same every epoch.
Epochs follow each other without a gap, so a batch may span shards and epochs: a corpus smaller
than one batch still gives full batches.

Which sequences a rank gets: number the stream's sequences s_0, s_1, ... across epochs. The n-th
next_batch() call after reset() on rank r returns row i = s_(n*B*W + r*B + i) for i < B, with
W = world_size. One step's batches of all ranks are thus B*W consecutive sequences, disjoint
between ranks, and a whole epoch is covered with each sequence used once.

Start-up checks every shard (token count, largest token id) without reading it once its statistics are
recorded: data/fineweb.py writes them into manifest.json, and shards from elsewhere are read whole once
and recorded beside them (data/shard_stats.py), by one rank of those starting together (a file lock), the
others finding its records. A record counts for a file of the byte size it names (a
stat); the rest of its fingerprint is compared when the shard is first opened, and a shard that no longer
matches is read whole then, before any of its tokens are used, failing as a start-up check would.

state_dict() is that position in the stream (epoch, index into the epoch's shard order, index
into the shard's window order) plus what gives the stream its meaning (seed, shuffle, T, the shard
names and sizes), all plain ints/lists/strings. Restoring recomputes the permutations from the seed
and reads no data. Because the position is global, resuming with another B or world size still
continues the same stream, without repeating or skipping a sequence.
"""
import json
from pathlib import Path

import numpy as np
import torch

from data import shard_stats
from data.fineweb import EXPECTED, PREPARE_AGAIN
from data.shard_formats import find_shards, read_tokens, shard_patterns
from data.tokenizer import TOKENIZERS, VOCAB_SIZE
from errors import DataError, DataNotFound


class ShardLoader:
    def __init__(self, data_dir, split, B, T, rank=0, world_size=1, seed=0, shuffle=True, vocab_size=VOCAB_SIZE):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.B, self.T, self.rank, self.world_size = B, T, rank, world_size
        self.seed, self.shuffle, self.split = seed, shuffle, split
        data_dir = Path(data_dir)
        paths = find_shards(data_dir, split)
        if not paths:
            problem = f"no {' or '.join(map(repr, shard_patterns(split)))} token shards in {data_dir}/" \
                if data_dir.is_dir() else \
                f"data directory {data_dir}/ does not exist"
            raise DataNotFound(f"{problem}; prepare the shards with `python data/fineweb.py --out {data_dir}` "
                               "(add --input FILES for local text)")
        recorded = _check_manifest(data_dir, split)
        cache = shard_stats.cached(data_dir)
        self.data_dir, self.vocab_size, self.names = data_dir, vocab_size, [p.name for p in paths]
        self.shards, self.sizes, self._unverified = [], [], {}
        for k, path in enumerate(paths):
            listed, cached = recorded.get(path.name), cache.get(path.name)
            known = shard_stats.recorded_size(path, listed) or shard_stats.recorded_size(path, cached)
            tokens = None if known else _open_shard(data_dir, path, T, vocab_size, listed, ())
            if known:  # its entry answers start-up; the file is compared with it when first opened (_tokens)
                _check_shard(path, known["tokens"], known["max_token"], T, vocab_size)
                self._unverified[k] = (listed, (listed, cached))
            self.shards.append(tokens)
            self.sizes.append(known["tokens"] if known else tokens.size)
        self.n_windows = [(n - 1) // T for n in self.sizes]
        self._perm_key, self._perm = None, None
        self.reset()

    def reset(self):
        """Back to the first sequence of epoch 0 (val: the same batches after every reset)."""
        self.epoch, self.shard_pos, self.window_pos = 0, 0, 0

    def next_batch(self):
        """This rank's next (x, y): int64 (B, T) CPU tensors, y = x shifted left by one token."""
        self._advance(self.rank * self.B)
        pieces = self._advance(self.B)
        self._advance((self.world_size - 1 - self.rank) * self.B)
        span = np.arange(self.T + 1)
        rows = np.concatenate([self._tokens(k)[starts[:, None] + span] for k, starts in pieces])
        rows = torch.from_numpy(rows.astype(np.int64))
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self):
        return {"epoch": self.epoch, "shard_pos": self.shard_pos, "window_pos": self.window_pos,
                "seed": self.seed, "shuffle": self.shuffle, "T": self.T,
                "shards": [[name, n] for name, n in zip(self.names, self.sizes)]}

    def load_state_dict(self, d):
        ours = self.state_dict()
        for key in ("seed", "shuffle", "T", "shards"):
            if d[key] != ours[key]:
                raise DataError(f"loader state was saved with {key}={d[key]!r} but this '{self.split}' loader has "
                                f"{key}={ours[key]!r}: the saved position means nothing in this data stream")
        self.epoch, self.shard_pos, self.window_pos = d["epoch"], d["shard_pos"], d["window_pos"]

    def _tokens(self, k):
        """Shard k's tokens, opened on first use when start-up took its statistics from a record: the record is
        trusted only if the file's fingerprint matches; otherwise the shard is read whole now, before any of its
        tokens are used, and fails with the same error a start-up check would give."""
        if k in self._unverified:
            listed, entries = self._unverified[k]
            self.shards[k] = _open_shard(self.data_dir, self.data_dir / self.names[k], self.T, self.vocab_size, listed,
                                         entries)
            del self._unverified[k]
        return self.shards[k]

    def _shard_order(self, epoch):
        if not self.shuffle:
            return np.arange(len(self.shards))
        # The 0/1 tag keeps these seeds apart from the window seeds: numpy's SeedSequence pads with
        # zeros, so [seed, e] and [seed, e, 0] would otherwise give the same permutation.
        return np.random.default_rng([self.seed, 0, epoch]).permutation(len(self.shards))

    def _window_starts(self, epoch, shard):
        key = (epoch, shard) if self.shuffle else shard
        if key != self._perm_key:  # one cached shard: a step moves through shards in order
            n = self.n_windows[shard]
            order = np.random.default_rng([self.seed, 1, epoch, shard]).permutation(n) if self.shuffle else np.arange(n)
            self._perm_key, self._perm = key, order * self.T
        return self._perm

    def _advance(self, n):
        """Move n sequences along the stream; return them as [(shard index, window starts), ...]."""
        pieces = []
        while n > 0:
            shard = int(self._shard_order(self.epoch)[self.shard_pos])
            starts = self._window_starts(self.epoch, shard)
            take = min(n, len(starts) - self.window_pos)
            pieces.append((shard, starts[self.window_pos:self.window_pos + take]))
            self.window_pos += take
            n -= take
            if self.window_pos == len(starts):
                self.window_pos, self.shard_pos = 0, self.shard_pos + 1
                if self.shard_pos == len(self.shards):
                    self.shard_pos, self.epoch = 0, self.epoch + 1
        return pieces


def _check_manifest(data_dir, split):
    """Refuse a directory whose preparation was interrupted or whose shards are missing: training would
    silently see part of the data. Returns {shard file: its entry} of the split as data/fineweb.py recorded them
    (tokens; and max_token and fingerprint since data/shard_stats.py)."""
    path = data_dir / "manifest.json"
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
        recorded = {s["file"]: s for s in manifest["shards"] if s["split"] == split}
    except (ValueError, TypeError, KeyError):
        raise DataError(f"{path}: not a manifest written by data/fineweb.py; {PREPARE_AGAIN}") from None
    if not manifest.get("finished", False):
        raise DataError(f"{path} says preparation is unfinished; rerun the same `python data/fineweb.py ...` "
                        "command to complete it")
    missing = [file for file in recorded if not (data_dir / file).exists()]
    if missing:
        raise DataError(f"{data_dir / missing[0]} is missing ({path} lists it); {PREPARE_AGAIN}")
    return recorded


def shards_tokenizer(data_dir):
    """(tokenizer, None) for a directory whose every shard data/fineweb.py wrote, with the tokenizer its
    manifest.json names (data/tokenizer.py); else (None, why the tokenizer is not known)."""
    path = Path(data_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        listed, name = {s["file"] for s in manifest["shards"]}, manifest["tokenizer"]
    except FileNotFoundError:
        return None, f"{data_dir} has no manifest.json to name the shards' tokenizer (shards from elsewhere)"
    except (OSError, ValueError, TypeError, KeyError):
        return None, f"{path} names no tokenizer"
    others = [p for split in ("train", "val") for p in find_shards(data_dir, split) if p.name not in listed]
    if others:
        return None, f"{others[0]} is not listed in {path}: its tokenizer is unknown"
    if name not in TOKENIZERS:
        return None, f"{path} names tokenizer {name!r}, not one of {', '.join(TOKENIZERS)}"
    return TOKENIZERS[name], None


def _open_shard(data_dir, path, T, vocab_size, listed, entries):
    """Memory-map one shard after checking it can feed the model: uint16, 1-D, >= T+1 tokens, ids < vocab.
    The largest id comes from one of `entries` (its manifest.json entry, an earlier start's record) whose
    fingerprint matches the file (data/shard_stats.py); otherwise the shard is read whole and recorded for the
    next start, by one process at a time: every rank starts here at once, and all but the first find its record."""
    tokens = read_tokens(path)
    if listed is not None and tokens.size != listed["tokens"]:
        raise DataError(f"{path}: {tokens.size:,} tokens but manifest.json records {listed['tokens']:,}; "
                        f"{PREPARE_AGAIN}")
    _check_shard(path, tokens.size, None, T, vocab_size)
    known = _trusted_entry(path, tokens.size, entries)
    if known is None:
        with shard_stats.exclusive(data_dir):
            known = _trusted_entry(path, tokens.size, [shard_stats.cached(data_dir).get(path.name)])
            if known is None:  # reads the whole shard once, so a bad file fails before it is used
                known = shard_stats.record(path, tokens.size, int(tokens.max()))
                shard_stats.remember(data_dir, {path.name: known})
    _check_shard(path, tokens.size, known["max_token"], T, vocab_size)
    return tokens


def _trusted_entry(path, size, entries):
    return next((e for e in entries if shard_stats.trusted(path, e) and e["tokens"] == size), None)


def _check_shard(path, size, top, T, vocab_size):
    """Can a shard of `size` tokens whose largest id is `top` (None: not known yet) feed the model?"""
    if size == 0:
        raise DataError(f"{path}: empty shard (0 tokens); {PREPARE_AGAIN}")
    if size < T + 1:
        raise DataError(f"{path}: {size} tokens, fewer than seq_len + 1 = {T + 1}; lower seq_len, "
                        "or prepare bigger shards (data/fineweb.py --shard-size)")
    if top is not None and top >= vocab_size:
        raise DataError(f"{path}: token id {top} >= the model's vocab_size {vocab_size}; {EXPECTED}; "
                        f"{PREPARE_AGAIN}")
