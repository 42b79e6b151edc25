"""Token shards written by other GPT-2 harnesses, read in place beside our own (data/loader.py).

- ours and karpathy/build-nanogpt's: `{name}_{split}_{idx:06d}.npy`, a 1-D uint16 .npy array
  (build-nanogpt names them edufineweb_{val,train}_NNNNNN.npy; data.fineweb.read_shard checks them).
- karpathy/llm.c's (also modded-nanogpt's): `{name}_{split}_{idx:06d}.bin` (dev/data/data_common.py
  write_datafile), and `{name}_{split}.bin` for its small datasets (tiny_shakespeare_val.bin): a header
  of 256 little-endian int32 (magic 20240520, version 1, token count, the rest zero), then the tokens as
  uint16. llm.c's LLaMA-3 shards (magic 20240801, version 7, uint32 tokens) are another vocabulary.
- karpathy/nanoGPT's: `train.bin` / `val.bin` (data/*/prepare.py), raw uint16 tokens with no header.

Shards of any of these kinds may sit in one directory; they are taken in file-name order.
"""
from pathlib import Path

import numpy as np

from data.fineweb import read_shard
from errors import DataError

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
LLMC_LLAMA3_MAGIC = 20240801
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
LLMC_AGAIN = "re-run llm.c's dev/data script (GPT-2 tokenizer) or prepare the shards with data/fineweb.py"


def shard_patterns(split):
    return [f"*_{split}_*.npy", f"*_{split}_*.bin", f"*_{split}.bin", f"{split}.bin"]


def find_shards(data_dir, split):
    """Every token shard of `split` in data_dir, whatever its format, sorted by file name."""
    found = {p for pattern in shard_patterns(split) for p in Path(data_dir).glob(pattern)}
    return sorted(found, key=lambda p: p.name)


def read_tokens(path):
    """A memory-mapped 1-D uint16 token array from a shard of any supported format (by its name)."""
    path = Path(path)
    if path.suffix == ".npy":
        return read_shard(path)
    if path.name in ("train.bin", "val.bin"):
        return read_headerless(path)
    return read_llmc_shard(path)


def read_llmc_shard(path):
    """An llm.c token shard, after checking its header against the file: one line per mismatch."""
    size = path.stat().st_size
    if size < LLMC_HEADER_BYTES:
        raise DataError(f"{path}: {size} bytes, shorter than llm.c's {LLMC_HEADER_BYTES}-byte header (256 int32); "
                        f"not an llm.c token shard; {LLMC_AGAIN}")
    magic, version, count = (int(v) for v in np.fromfile(path, dtype="<i4", count=3))
    if magic == LLMC_LLAMA3_MAGIC:
        raise DataError(f"{path}: an llm.c LLaMA-3 shard (magic {magic}, uint32 tokens), but nanoact trains on GPT-2 "
                        f"tokens; {LLMC_AGAIN}")
    if magic != LLMC_MAGIC:
        raise DataError(f"{path}: bad magic {magic} in the header, expected {LLMC_MAGIC} (llm.c's GPT-2 token "
                        f"shard); {LLMC_AGAIN}")
    if version != LLMC_VERSION:
        raise DataError(f"{path}: header version {version}, expected {LLMC_VERSION} (uint16 GPT-2 tokens); "
                        f"{LLMC_AGAIN}")
    expected = LLMC_HEADER_BYTES + 2 * count
    if count <= 0 or size != expected:
        raise DataError(f"{path}: the header's token count {count:,} needs {expected:,} bytes "
                        f"({LLMC_HEADER_BYTES} header + 2 per token) but the file has {size:,} "
                        f"({'truncated' if size < expected else 'extra bytes'}); {LLMC_AGAIN}")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=LLMC_HEADER_BYTES, shape=(count,))


def read_headerless(path):
    """nanoGPT's train.bin / val.bin: nothing but uint16 tokens."""
    size = path.stat().st_size
    if size % 2:
        raise DataError(f"{path}: {size:,} bytes, an odd number, so not the uint16 tokens of nanoGPT's "
                        "prepare.py (train.bin / val.bin); prepare them again")
    if size == 0:
        raise DataError(f"{path}: empty file (0 tokens); prepare it again")
    return np.memmap(path, dtype=np.uint16, mode="r")
