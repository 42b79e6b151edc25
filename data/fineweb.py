"""Tokenise FineWeb-Edu (or local text files) into the uint16 token shards data/loader.py reads.

    python data/fineweb.py                                     # FineWeb-Edu sample-10BT: ~10B tokens, ~100 shards
    python data/fineweb.py --streaming --max-docs 20000        # a small slice, without the full download
    python data/fineweb.py --input a.txt b.jsonl.gz c.parquet --out data/my_shards --shard-size 1e6
    python data/fineweb.py --tokenizer bytes --input a.txt --out data/my_bytes   # UTF-8 bytes, vocabulary 256

Format (karpathy/build-nanogpt's): each document becomes <|endoftext|> (50256) followed by its GPT-2
tokens (tiktoken "gpt2", no special tokens parsed from the text); with --tokenizer bytes, the byte 0xFF
(never part of UTF-8 text) followed by its UTF-8 bytes (data/tokenizer.py). The stream of all documents is cut
into shards `{name}_{split}_{idx:06d}.npy` (1-D uint16), shard 0 `val` and the rest `train`, each
train shard exactly --shard-size tokens except the last. Shards cut through documents.
Local inputs: a .txt file is one document; each line of a .jsonl/.json file (JSON lines) and each
row of a .parquet file is one document, read from its `text` field; .txt/.jsonl/.json may be gzipped.
The hub is probed once before datasets is asked, so offline the FineWeb-Edu source fails in seconds
(HF_HUB_OFFLINE=1 skips the probe and reads datasets' cache). The output directory appears with the
first shard: a run that fails before it leaves nothing behind.

Validation split: shard 0 takes the first --val-tokens tokens (default: --shard-size, i.e. exactly
build-nanogpt's layout). With the default and a corpus of fewer than 2 * shard-size tokens, that
would leave (almost) nothing to train on, so val takes the first 10% of the tokens instead. The val
shard is written once a full train shard's worth of tokens follows it, or at the end.

manifest.json records the options that define the output (the tokenizer, and its vocab_size), every shard (file,
split, tokens, its largest token id and a fingerprint: data/loader.py then starts without reading shards whole),
the totals, where to resume, and `finished`; it and every shard are written to a temporary name and renamed, so
a crash never leaves a half-written file under a final name. Rerunning the same command:
  - finished with the same options: nothing to do;
  - interrupted: finished shards are kept untouched; tokenisation restarts at the document the last
    finished shard ended in (earlier documents are read past without tokenising) and continues
    the same deterministic stream, so the result equals an uninterrupted run;
  - different options, or shards without a manifest: an error (use another --out or delete it).
"""
import argparse
import gzip
import itertools
import json
import multiprocessing as mp
import os
from bisect import bisect_right
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data import hub_unreachable, shard_stats
from data.files import atomic_file, remove_temporaries
from data.tokenizer import TOKENIZERS, gpt2_tokenizer
from errors import DataError, DataNotFound, NanoactError

HF_DATASET = "HuggingFaceFW/fineweb-edu"
DEFINING = ("source", "tokenizer", "name", "shard_size", "val_tokens", "max_docs", "max_tokens")


def local_documents(paths):
    for path in paths:
        kind = _kind(path)
        if kind == "txt":
            with _open_text(path) as f:
                yield f.read()
        elif kind == "parquet":
            yield from _parquet_documents(path)
        else:
            with _open_text(path) as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        yield _text_field(_json_row(line, f"{path}:{lineno}"), f"{path}:{lineno}")


def _kind(path):
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.removesuffix(".gz").endswith(".txt"):
        return "txt"
    if name.removesuffix(".gz").endswith((".jsonl", ".json")):
        return "json"
    raise DataError(f"{path}: unknown file type; --input takes .txt, .jsonl, .json (each optionally .gz) or .parquet")


def _open_text(path):
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    return opener(path, "rt", encoding="utf-8")


def _json_row(line, where):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not a JSON line ({e.msg})") from None


def _text_field(row, where):
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise DataError(f"{where}: row has no 'text' string field")
    return row["text"]


def _parquet_documents(path):
    import pyarrow.parquet as pq  # only needed for parquet input
    table = pq.ParquetFile(path)
    if "text" not in table.schema_arrow.names:
        raise DataError(f"{path}: no 'text' column (columns: {', '.join(table.schema_arrow.names)})")
    rows = itertools.count(1)
    for batch in table.iter_batches(columns=["text"]):
        for text in batch.column(0).to_pylist():
            yield _text_field({"text": text}, f"{path}: row {next(rows)}")


def hf_documents(config, streaming, first):
    offline = bool(os.environ.get("HF_HUB_OFFLINE"))
    # One quick request first: offline, datasets retries for a long while and then raises a long traceback.
    problem = "" if offline else hub_unreachable()
    if not problem:
        from datasets import load_dataset  # slow import, only needed for the HF source
        try:
            ds = load_dataset(HF_DATASET, name=config, split="train", streaming=streaming).select_columns(["text"])
            return (row["text"] for row in ds.skip(first))
        except ConnectionError as e:
            problem = str(e).splitlines()[0]
    raise DataError(f"cannot load {HF_DATASET} from the Hugging Face hub ({problem}); offline, tokenize local "
                    "text instead: --input FILES (.txt, .jsonl, .json, .parquet; e.g. --input corpus/*.txt)"
                    + ("" if offline else ", or set HF_HUB_OFFLINE=1 to use a cached download"))


class ShardWriter:
    """Cuts the token stream into shards as documents arrive and records each one in the manifest."""

    def __init__(self, out, manifest):
        self.out, self.m = out, manifest
        remove_temporaries(out)  # a shard a killed run was writing; it is written again
        self.S, self.val_tokens = manifest["shard_size"], manifest["val_tokens"]
        self.max_tokens = manifest["max_tokens"]
        self.written = manifest["total_tokens"]  # stream position up to which shards are on disk
        self.pos = manifest["resume"]["pos"]  # stream position after the documents added so far
        self.pending, self.n_pending = [], 0  # tokens from `written` to `pos`
        self.doc_starts = []  # (stream position, document index) of the documents added so far

    def add(self, doc, tokens):
        """Append one document; False once --max-tokens is reached."""
        start = self.pos
        if self.max_tokens:
            tokens = tokens[:self.max_tokens - start]
        self.doc_starts.append((start, doc))
        self.pos += len(tokens)
        tokens = tokens[max(0, self.written - start):]  # after a resume: drop what finished shards hold
        self.pending.append(tokens)
        self.n_pending += len(tokens)
        while size := self._due():
            self._write(size)
        return not self.max_tokens or self.pos < self.max_tokens

    def _due(self):
        """The size of the next shard if enough tokens are pending to write it now, else 0."""
        if self.m["shards"]:
            return self.S if self.n_pending >= self.S else 0
        # Val waits until a full train shard follows it: only then is the default val size known.
        val = self.val_tokens or self.S
        return val if self.n_pending >= val + self.S else 0

    def finish(self, documents):
        if not self.m["shards"]:
            val = self.val_tokens or self.n_pending // 10
            if not 0 < val < self.n_pending:
                raise DataError(f"the corpus has {self.n_pending} tokens: too few for a val shard of {val} tokens "
                                "and a train split")
            self._write(val)
        while self.n_pending:
            self._write(min(self.S, self.n_pending))
        self.m.update(documents=documents, finished=True)
        write_manifest(self.out, self.m)

    def _write(self, n):
        tokens = np.concatenate(self.pending)
        self.pending, self.n_pending = [tokens[n:]], len(tokens) - n
        idx = len(self.m["shards"])
        split = "val" if idx == 0 else "train"
        path = self.out / f"{self.m['name']}_{split}_{idx:06d}.npy"
        self.out.mkdir(parents=True, exist_ok=True)  # only now: a failed start leaves no empty directory
        with atomic_file(path) as f:
            np.save(f, tokens[:n])
        self.written += n
        # Resume from the last document starting at or before the cut; the ones before it are done.
        k = bisect_right(self.doc_starts, (self.written, float("inf"))) - 1
        resume_pos, resume_doc = self.doc_starts[k]
        del self.doc_starts[:k]
        entry = shard_stats.record(path, n, tokens[:n].max())  # the max of tokens in memory: no read of the file
        self.m["shards"].append({"file": path.name, "split": split, **entry})
        self.m.update(total_tokens=self.written, resume={"doc": resume_doc, "pos": resume_pos})
        write_manifest(self.out, self.m)
        tqdm.write(f"wrote {path} ({n:,} tokens)")


def write_manifest(out, manifest):
    with atomic_file(out / "manifest.json", "w") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")


PREPARE_AGAIN = "prepare the shards again with data/fineweb.py (into a new or emptied --out)"
EXPECTED = "expected a 1-D uint16 array of token ids as data/fineweb.py writes"


def read_shard(path):
    """Memory-map a .npy token shard, or a ValueError that names the file and what is wrong with it.

    The header is checked here rather than left to np.load, whose errors for random bytes or a cut-off
    file speak of pickles and mmap lengths."""
    try:
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = read_header(f)
            except OSError:
                raise
            except Exception:  # numpy's header parser raises ValueError, SyntaxError, TokenError ...
                raise DataError(f"{path}: not a .npy array (missing or damaged NUMPY header); {EXPECTED}; "
                                f"{PREPARE_AGAIN}") from None
            data_start = f.tell()
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror})") from None
    if dtype != np.uint16 or len(shape) != 1:
        raise DataError(f"{path}: a {len(shape)}-D {dtype} array; {EXPECTED}; {PREPARE_AGAIN}")
    size = path.stat().st_size - data_start
    if size < 2 * shape[0]:
        raise DataError(f"{path}: truncated: its header promises {shape[0]:,} tokens ({2 * shape[0]:,} bytes) "
                        f"but {size:,} bytes follow; {PREPARE_AGAIN}")
    return np.load(path, mmap_mode="r")


def open_manifest(out, options):
    """The manifest to continue: the existing one if its defining options match, else a fresh one."""
    path = out / "manifest.json"
    if not path.exists():
        if any(out.glob(f"{options['name']}_*.npy")):
            raise DataError(f"{out} holds {options['name']}_*.npy shards but no manifest.json; "
                            "use another --out or delete them")
        tokenizer = TOKENIZERS[options["tokenizer"]]
        return {**options, "vocab_size": tokenizer.vocab_size, "eot": tokenizer.eot, "dtype": "uint16", "shards": [],
                "total_tokens": 0, "documents": None, "resume": {"doc": 0, "pos": 0}, "finished": False}
    manifest = json.loads(path.read_text())
    changed = [k for k in DEFINING if manifest.get(k) != options[k]]
    if changed:
        raise DataError(f"{out} was prepared with different {', '.join(changed)} ({path}); "
                        "rerun with the same options, or use another --out")
    for shard in manifest["shards"]:
        file = out / shard["file"]
        if not file.exists() or read_shard(file).shape != (shard["tokens"],):
            raise DataError(f"{file} is missing or not the size {path} records; delete {out} and prepare again")
    return manifest


def tokenized(pool, tokenizer, docs, workers, per_worker=256):
    """The token arrays of `docs`, in order, tokenized by `pool` a block of per_worker documents per worker at a
    time. No task outlives its block, so a stop at --max-tokens finds the pool idle: an imap over the whole
    stream kept a pool thread feeding it, and Pool's exit could hang on that thread (seen once in the suite)."""
    block = per_worker * workers
    for batch in iter(lambda: list(itertools.islice(docs, block)), []):
        yield from pool.map(tokenizer.document, batch, chunksize=16)


def prepare(args):
    tokenizer = TOKENIZERS[args.tokenizer]
    if tokenizer.name == "gpt2":
        gpt2_tokenizer()  # fail once with a clear message rather than in every worker
    inputs = [Path(p) for p in args.input or []]
    for path in inputs:
        if not path.is_file():
            raise DataNotFound(f"no such input file: {path}")
        _kind(path)
    source = [str(p.resolve()) for p in inputs] if inputs else f"{HF_DATASET}/{args.hf_config}"
    name = args.name or ("local" if inputs else "fineweb_edu")
    options = {"source": source, "tokenizer": tokenizer.name, "name": name, "shard_size": args.shard_size,
               "val_tokens": args.val_tokens, "max_docs": args.max_docs, "max_tokens": args.max_tokens}
    out = Path(args.out or ("data/fineweb_edu" + ("_bytes" if tokenizer.name == "bytes" else "")))
    manifest = open_manifest(out, options)
    if manifest["finished"]:
        print(f"{out}: already prepared ({len(manifest['shards'])} shards, {manifest['total_tokens']:,} tokens); "
              "nothing to do")
        return manifest
    first = manifest["resume"]["doc"]
    docs = itertools.islice(local_documents(inputs), first, None) if inputs else \
        hf_documents(args.hf_config, args.streaming, first)
    if args.max_docs:
        docs = itertools.islice(docs, max(0, args.max_docs - first))
    writer = ShardWriter(out, manifest)
    n_docs = first
    with mp.Pool(args.workers) as pool, \
            tqdm(total=args.max_tokens, initial=writer.pos, unit="tok", unit_scale=True, desc="tokenizing") as bar:
        for doc, tokens in enumerate(tokenized(pool, tokenizer, docs, args.workers), first):
            more = writer.add(doc, tokens)
            n_docs = doc + 1
            bar.update(writer.pos - bar.n)
            if not more:
                break
    writer.finish(n_docs)
    print(f"{out}: {len(manifest['shards'])} shards, {manifest['total_tokens']:,} tokens "
          f"({manifest['shards'][0]['tokens']:,} val) from {n_docs:,} documents")
    return manifest


def token_count(text):
    """Counts like 1e8 or 100000000, as a positive int."""
    value = float(text)
    if value <= 0 or not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text}")
    return int(value)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", metavar="FILE", help="local text files instead of FineWeb-Edu")
    p.add_argument("--out", help="output directory (default: data/fineweb_edu, data/fineweb_edu_bytes for bytes)")
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="gpt2",
                   help="gpt2 (BPE, vocab 50257) or bytes (UTF-8, vocab 256) (default: %(default)s)")
    p.add_argument("--name", help="shard file prefix (default: fineweb_edu, or local with --input)")
    p.add_argument("--shard-size", type=token_count, default=10**8, help="tokens per shard (default: 1e8)")
    p.add_argument("--val-tokens", type=token_count,
                   help="tokens in the val shard (default: shard-size, or 10%% of a corpus under 2 shards)")
    p.add_argument("--max-docs", type=token_count, help="stop after this many documents")
    p.add_argument("--max-tokens", type=token_count, help="stop after this many tokens (cuts the last document)")
    p.add_argument("--hf-config", default="sample-10BT", help=f"{HF_DATASET} subset (default: %(default)s)")
    p.add_argument("--streaming", action="store_true", help="stream FineWeb-Edu instead of downloading it whole")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="tokenizer processes (default: half the CPUs)")
    return p.parse_args(argv)


def main(argv=None):
    try:
        return prepare(parse_args(argv))
    except NanoactError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
