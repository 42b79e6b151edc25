"""Loader start-up (data/loader.py: open every shard, check it, first batch) against the size of the corpus.

    python bench/startup.py                              # 20 and 100 shards of 1e8 tokens (2 bytes a token)
    python bench/startup.py --shards 5,20 --tokens 2e7   # less disk
    python bench/startup.py --dir /shared/scratch        # on the filesystem your shards live on

Each row is ShardLoader(...) and its first next_batch() on rank 0 of 1, with the shards evicted from the page
cache first (posix_fadvise DONTNEED), as at the first start on a node:
    read every shard   no manifest and no record: every shard is read whole (tokens.max()), as every start did
                       before data/shard_stats.py (plus the fingerprints it now records for the next start)
    remembered         the same shards again: their records beside them (.nanoact_shard_stats.json)
    manifest           a manifest.json as data/fineweb.py writes it: no record beside them
Medians of --rounds. The N-shard directories hard-link the same files, so the disk holds max(N) shards once.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from data import shard_stats
from data.loader import ShardLoader
from data.tokenizer import VOCAB_SIZE


def write_pool(directory, n, tokens, seed=0):
    """n distinct shards of random GPT-2 ids (distinct: no shard is served from another's cached pages)."""
    rng = np.random.default_rng(seed)
    block = rng.integers(0, VOCAB_SIZE, tokens, dtype=np.uint16)
    entries = []
    for k in range(n):
        path = directory / f"synth_train_{k:06d}.npy"
        block[:64] = rng.integers(0, VOCAB_SIZE, 64, dtype=np.uint16)
        np.save(path, block)
        entries.append({"file": path.name, "split": "train", **shard_stats.record(path, tokens, block.max())})
    return entries


def evict(directory):
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def start_seconds(directory, seq_len):
    evict(directory)
    t0 = time.perf_counter()
    loader = ShardLoader(directory, "train", B=8, T=seq_len, seed=0)
    loader.next_batch()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", default="20,100", help="corpus sizes in shards (default: %(default)s)")
    p.add_argument("--tokens", type=float, default=1e8, help="tokens per shard (default: 1e8, data/fineweb.py's)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--dir", help="where the shards go (default: a temporary directory, removed at the end)")
    args = p.parse_args()
    sizes, tokens = sorted(int(n) for n in args.shards.split(",")), int(args.tokens)
    root = Path(tempfile.mkdtemp(prefix="nanoact_startup_", dir=args.dir))
    try:
        pool = root / "pool"
        pool.mkdir()
        t0 = time.perf_counter()
        entries = write_pool(pool, sizes[-1], tokens)
        os.sync()  # the disk's write-back of the new shards would otherwise slow the reads timed next
        print(f"wrote {sizes[-1]} shards of {tokens:,} tokens ({sizes[-1] * 2 * tokens / 1e9:.1f} GB) in "
              f"{time.perf_counter() - t0:.0f} s to {root} | {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs, torch {torch.__version__}")
        print(f"{'shards':>6s} {'GB':>6s} {'read every shard s':>19s} {'remembered s':>13s} {'manifest s':>11s}")
        for n in sizes:
            d = root / f"n{n}"
            d.mkdir()
            for e in entries[:n]:
                os.link(pool / e["file"], d / e["file"])
            rows = {"read": [], "remembered": [], "manifest": []}
            for _ in range(args.rounds):
                (d / shard_stats.SIDECAR).unlink(missing_ok=True)
                (d / "manifest.json").unlink(missing_ok=True)
                rows["read"].append(start_seconds(d, args.seq_len))
                rows["remembered"].append(start_seconds(d, args.seq_len))
                (d / shard_stats.SIDECAR).unlink()
                (d / "manifest.json").write_text(json.dumps({"finished": True, "shards": entries[:n]}))
                rows["manifest"].append(start_seconds(d, args.seq_len))
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(f"{n:6d} {n * 2 * tokens / 1e9:6.2f} {med['read']:19.3f} {med['remembered']:13.3f} "
                  f"{med['manifest']:11.3f}", flush=True)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
