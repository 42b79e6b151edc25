"""Validation bits per byte: the val loss in a unit that does not depend on the tokenizer.

The val loss is a mean over target tokens in nats, and how much text a token holds depends on the tokenizer
(GPT-2's BPE: ~4.3 bytes a token on FineWeb-Edu, 3.3 on Shakespeare; bytes: 1). Dividing the total by the bytes
the targets decode to gives a number comparable across tokenizers and with other harnesses' bits per byte:

    bpb = (val loss in nats per token) * (target tokens / target bytes) / ln 2

- The targets: the loss averages over the targets y (x shifted by one), so the bytes counted are those of y, of
  exactly the sequences the validation scores (all ranks' together: data/loader.py hands rank r of W the rows
  r*B .. r*B+B-1 of each batch of B*W consecutive sequences).
- The document separator (GPT-2's <|endoftext|>, the bytes tokenizer's 0xFF) counts as one byte: it is a
  symbol of the stream the model predicts, so both tokenizers divide the same text by the same byte count, and
  byte shards give bpb = loss / ln 2 exactly. (nanochat's bpb leaves separators out of both sums instead: the
  two differ by the separators' share, one symbol in a document's thousands of bytes on FineWeb-Edu.)
"""
import math

from data.loader import ShardLoader


def validation_bytes(data_dir, tokenizer, batch, T, steps):
    """The UTF-8 bytes that the targets of the first `steps` batches of `batch` val sequences decode to."""
    lengths = tokenizer.byte_lengths()
    loader = ShardLoader(data_dir, "val", batch, T, shuffle=False, vocab_size=tokenizer.vocab_size)
    return sum(int(lengths[loader.next_batch()[1].numpy()].sum()) for _ in range(steps))


def bits_per_byte(loss, tokens, n_bytes):
    return loss / math.log(2) * (tokens / n_bytes)  # this order: tokens == n_bytes gives loss / ln 2 exactly
