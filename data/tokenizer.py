"""The tokenizers of the token shards (data/fineweb.py --tokenizer): GPT-2's BPE through tiktoken (also the one
of HellaSwag and the lm-eval model), and UTF-8 bytes.

Each document in a shard starts with a separator token; the separator is one symbol of the stream the model
predicts, so bits per byte (data/bits_per_byte.py) counts it as one byte under either tokenizer. The byte
tokenizer's separator is the byte 0xFF, which no UTF-8 text contains: the vocabulary stays the 256 byte values
(a multiple of 64, so no padding), and every token is exactly one byte of the stream.
"""
import numpy as np

from errors import TokenizerError

EOT = 50256  # <|endoftext|>: starts every document in the shards; also the (masked) padding token in scoring
VOCAB_SIZE = 50257  # GPT-2 BPE tokens; the GPT pads its embedding table to 50304 (model.py) for faster matmuls


def gpt2_tokenizer():
    import tiktoken  # imported here: commands that never tokenize start faster

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/OS errors when it cannot fetch its BPE files
        raise TokenizerError(f"cannot load tiktoken's gpt2 encoding ({type(e).__name__}); offline, point "
                             "TIKTOKEN_CACHE_DIR at a cache holding the GPT-2 BPE files") from None


class GPT2Tokens:
    name, vocab_size, eot = "gpt2", VOCAB_SIZE, EOT

    def encode(self, text):
        return gpt2_tokenizer().encode_ordinary(text)  # no special tokens parsed from the text

    def document(self, text):
        """The separator then the text's tokens, as uint16."""
        tokens = np.array([self.eot] + self.encode(text), dtype=np.int64)
        assert tokens.max() < 2**16, "token id does not fit uint16"
        return tokens.astype(np.uint16)

    def byte_lengths(self):
        """The UTF-8 bytes each token id stands for (the separator: 1)."""
        enc = gpt2_tokenizer()
        lengths = np.array([len(enc.decode_single_token_bytes(t)) for t in range(self.vocab_size)], dtype=np.int64)
        lengths[self.eot] = 1
        return lengths

    def decode(self, ids):
        enc = gpt2_tokenizer()
        return enc.decode([t for t in ids if t < enc.n_vocab])  # a padded vocabulary (50304) has ids beyond it


class ByteTokens:
    name, vocab_size, eot = "bytes", 256, 0xFF

    def encode(self, text):
        return list(text.encode("utf-8"))

    def document(self, text):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a JSON escape) has no UTF-8: U+FFFD instead, as tiktoken does
            data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
        return np.frombuffer(bytes([self.eot]) + data, dtype=np.uint8).astype(np.uint16)

    def byte_lengths(self):
        return np.ones(self.vocab_size, dtype=np.int64)

    def decode(self, ids):
        return bytes(t for t in ids if t < self.vocab_size).decode("utf-8", errors="replace")


TOKENIZERS = {t.name: t for t in (GPT2Tokens(), ByteTokens())}
