"""GPT-2's tokenizer as transformers files (vocab.json, merges.txt, tokenizer.json, tokenizer_config.json),
built from tiktoken's `gpt2` ranks, or from OpenAI's encoder.json + vocab.bpe when a directory of them is given.

tiktoken keeps only ranks (token bytes -> id), no merge list. A byte-level BPE rank is also the merge's
priority: the token of rank r is the merge of the two pieces that BPE reaches on its bytes using only merges
of rank < r. So replaying BPE with that cut-off gives every merge, in order; for GPT-2 this reproduces
OpenAI's vocab.bpe line for line (tests/test_export.py checks it against the real file).
"""
import functools
import json
from pathlib import Path

import transformers
from transformers import GPT2TokenizerFast

from data.tokenizer import EOT, gpt2_tokenizer
from errors import TokenizerError

EOT_TEXT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (encoder.json and vocab.bpe are written in it): printable
    Latin-1 bytes stand for themselves, the 68 others (controls, space) for the code points from 256 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _merge_parts(token, ranks, rank):
    """The two pieces BPE joins last to make `token` (of `rank`), replaying merges of rank < `rank`."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], rank))
        if ranks.get(parts[best] + parts[best + 1], rank) >= rank:
            raise ValueError(f"tiktoken token {token!r} (rank {rank}) is not a byte-level BPE merge")
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


@functools.cache  # 50,000 BPE replays: once per process; callers only read the result
def bpe_from_tiktoken():
    """(vocab {token text: id}, merges [(left, right)]) of tiktoken's gpt2 encoding, in GPT-2's characters."""
    encoding = gpt2_tokenizer()
    ranks = encoding._mergeable_ranks  # tiktoken's public API has no accessor for the rank table
    byte_char = bytes_to_unicode()
    text = lambda token: "".join(byte_char[b] for b in token)
    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        vocab[text(token)] = rank
        if len(token) > 1:
            merges.append(tuple(text(part) for part in _merge_parts(token, ranks, rank)))
    for name, token_id in encoding._special_tokens.items():
        vocab[name] = token_id
    return vocab, merges


def bpe_from_openai_files(directory):
    """(vocab, merges) from OpenAI's encoder.json and vocab.bpe."""
    vocab_file, merges_file = Path(directory) / "encoder.json", Path(directory) / "vocab.bpe"
    if not (vocab_file.is_file() and merges_file.is_file()):
        raise TokenizerError(f"{directory}: needs OpenAI's GPT-2 encoder.json and vocab.bpe")
    lines = merges_file.read_text(encoding="utf-8").split("\n")[1:]  # line 0 is the "#version" header
    return json.loads(vocab_file.read_text(encoding="utf-8")), [tuple(line.split()) for line in lines if line]


def save_gpt2_tokenizer(out_dir, vocab, merges, model_max_length):
    """Write the slow tokenizer's vocab.json + merges.txt and the fast tokenizer's files; <|endoftext|> is
    bos, eos and unk, as in OpenAI's GPT-2 tokenizer on the hub."""
    out_dir = Path(out_dir)
    if vocab.get(EOT_TEXT) != EOT:
        raise TokenizerError(f"not GPT-2's vocabulary: {EOT_TEXT} is not token {EOT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = out_dir / "vocab.json", out_dir / "merges.txt"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    special = dict(bos_token=EOT_TEXT, eos_token=EOT_TEXT, unk_token=EOT_TEXT, model_max_length=model_max_length)
    if int(transformers.__version__.split(".")[0]) < 5:
        tokenizer = GPT2TokenizerFast(vocab_file=str(vocab_file), merges_file=str(merges_file), **special)
    else:  # transformers 5 takes the vocabulary and merge pairs themselves (file paths are silently ignored)
        tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, **special)
    tokenizer.save_pretrained(out_dir)
